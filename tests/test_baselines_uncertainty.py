"""The baselines every BNN is compared with: a deep ensemble, post-hoc Laplace
(laplace-torch) and the deterministic network trained for the Bayesian pipeline's
epochs with early stopping -- their predictions, model files and settings."""

from __future__ import annotations

import copy
import json
import math
import sys

import pytest
import torch

from twodg_pyro.baselines import train_deterministic, train_early_stopped
from twodg_pyro.baselines.early_stopping import validation_nll
from twodg_pyro.cli import main
from twodg_pyro.data import make_loader
from twodg_pyro.io import compact_load, export_compact, load_model, model_format
from twodg_pyro.methods import (
    Ensemble,
    GuidePosterior,
    LaplacePosterior,
    MissingLaplaceError,
    Network,
    fit_laplace,
    load_method,
    train_ensemble,
)
from twodg_pyro.methods import laplace as laplace_module
from twodg_pyro.methods.laplace_fit import require_laplace
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.models import MLP, LeNet5
from twodg_pyro.pipeline import ConfigError, config_from_dict, run
from twodg_pyro.pipeline.outputs.saved_models import diagnose_model_file, evaluate_model_file
from twodg_pyro.uncertainty.scores import entropy

torch.set_num_threads(1)


def _mutual_information(samples: torch.Tensor) -> torch.Tensor:
    """Per-example MI of ``(S, N, C)`` draws: H[mean] - mean H."""
    s = samples.double()
    return entropy(s.mean(0)) - entropy(s).mean(0)


@pytest.fixture(scope="module")
def ensemble(digits):
    """Three 64-32-10 MLPs, member m initialised and shuffled with seed m."""

    def make_member(m):
        torch.manual_seed(m)
        return MLP(64, (32,), 10), make_loader(digits.train, 64, shuffle=True, seed=m)

    return train_ensemble(make_member, 3, 12, 1e-2, progress=False)


# ---------------------------------------------------------------- ensemble
def test_ensemble_beats_its_members_on_average_and_has_epistemic_spread(ensemble, digits):
    x, y = digits.test.tensors
    samples = ensemble.sample_probs(x, num_samples=30, seed=0)
    assert samples.shape == (3, len(y), 10)  # S = M whatever num_samples says
    pred = ensemble.predict((x, y))
    torch.testing.assert_close(pred.mean, samples.mean(0))
    metrics = classification_metrics(pred.mean, y)
    members = [classification_metrics(p, y) for p in samples]
    assert metrics["accuracy"] >= min(m["accuracy"] for m in members)
    assert metrics["nll"] <= sum(m["nll"] for m in members) / 3
    # the members are different networks: they disagree, so the MI is positive
    assert float(_mutual_information(samples).mean()) > 1e-4
    assert ensemble.num_params() == 3 * sum(p.numel() for p in ensemble.members[0].parameters())


def test_bad_member_counts_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="members must be an integer >= 1, got 0"):
        train_ensemble(lambda m: (MLP(4, (), 2), []), 0, 1)
    with pytest.raises(ValueError, match="members >= 1, got 0"):
        Ensemble([])
    with pytest.raises(ConfigError, match=r"ensemble.members = 0: M \(ensemble members\)"):
        config_from_dict({"ensemble": {"members": 0}})


# ---------------------------------------------------------------- Laplace
@pytest.fixture(scope="module")
def map_net(ensemble):
    return ensemble.members[0]


@pytest.fixture(scope="module")
def last_layer_kron(map_net, digits):
    return fit_laplace(map_net, make_loader(digits.train, 256))


def test_laplace_is_less_confident_than_the_map_network(last_layer_kron, map_net, digits):
    post = last_layer_kron
    x, y = digits.test.tensors
    assert post.subset == "last_layer" and post.hessian == "kron"
    assert post.param_names == ["layers.2.weight", "layers.2.bias"]
    assert float(post.prior_precision.min()) > 0  # fitted by marginal likelihood
    samples = post.sample_probs(x, num_samples=20, seed=0)
    assert samples.shape == (20, len(y), 10)
    torch.testing.assert_close(samples.sum(-1), torch.ones(20, len(y)))
    with torch.no_grad():
        map_probs = map_net(x).softmax(-1)
    assert float(entropy(samples.mean(0)).mean()) > float(entropy(map_probs).mean())
    assert float(_mutual_information(samples).mean()) > 0
    # seeded draws, independent of the batching; another seed gives other draws
    torch.testing.assert_close(post.sample_probs(x, 20, 0, batch_size=50), samples)
    assert not torch.equal(post.sample_probs(x, 20, 1), samples)
    # the MAP network is not touched by the fit
    assert torch.equal(
        post.mean(), torch.cat([p.reshape(-1) for p in map_net.layers[2].parameters()])
    )


@pytest.mark.parametrize("subset, hessian", [("last_layer", "kron"), ("all", "diag")])
def test_our_draws_are_laplace_torchs(subset, hessian, map_net, digits, last_layer_kron):
    """The stored factors rebuild laplace-torch's posterior: the same covariance, and the
    same draws from the same generator, arithmetic for arithmetic."""
    laplace = require_laplace()
    loader = make_loader(digits.train, 256)
    post = (
        last_layer_kron
        if subset == "last_layer"
        else fit_laplace(map_net, loader, subset=subset, hessian=hessian, marglik_steps=30)
    )
    la = laplace.Laplace(
        copy.deepcopy(map_net),
        "classification",
        subset_of_weights=subset,
        hessian_structure=hessian,
    )
    la.fit(loader)
    la.prior_precision = post.prior_precision.clone()
    ours = post.sample_params(6, seed=4)
    theirs = la.sample(6, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    if hessian == "kron":
        cov = la.posterior_precision.to_matrix(exponent=-1)
    else:
        cov = torch.diag(la.posterior_variance)
    torch.testing.assert_close(post.covariance(), cov, rtol=1e-4, atol=1e-6)
    if subset == "all":  # all-layer diagonal: one precision per weight and bias
        assert post.n_params == sum(p.numel() for p in map_net.parameters())
        assert post.num_factor_values() == post.n_params + 1
        # the linearised (glm) draws have laplace-torch's functional mean and covariance
        x = digits.test.tensors[0][:3]
        f_mu, f_var = la._glm_predictive_distribution(x)
        logits = torch.cat([post._logits(d, x) for d in post.sample_params(8000, 0).split(500)])
        centred = logits - logits.mean(0)
        cov = torch.einsum("sbi,sbj->bij", centred, centred) / len(logits)
        assert float((logits.mean(0) - f_mu).abs().max()) < 0.1 * float(f_var.max().sqrt())
        assert float((cov - f_var).abs().max()) < 0.06 * float(f_var.abs().max())


@pytest.mark.parametrize("pred_type", ["glm", "nn"])
def test_a_last_layer_prediction_runs_the_network_once(pred_type, map_net, digits):
    """A last-layer approximation's draws change the last layer only: one pass of the
    network gives the features every draw shares, and the draws are those of the network
    run once per draw (bit for bit here: the same operations on the same features), with
    laplace-torch's linearised mean and covariance of the logits."""
    laplace = require_laplace()
    loader = make_loader(digits.train, 256)
    post = fit_laplace(map_net, loader, pred_type=pred_type, marglik_steps=30)
    x = digits.test.tensors[0][:40]
    calls = []
    hook = post.net.layers[0].register_forward_hook(lambda *a: calls.append(1))
    try:
        probs = post.sample_probs(x, 25, seed=5, batch_size=20)
    finally:
        hook.remove()
    assert len(calls) == 2 and post.forwards_per_prediction(25) == 1  # one per batch
    draws = post.sample_params(25, seed=5)
    whole = torch.cat([post._logits(d, x) for d in draws.split(10)]).softmax(-1)
    torch.testing.assert_close(probs, whole, rtol=0, atol=1e-6)
    la = laplace.Laplace(copy.deepcopy(map_net), "classification", subset_of_weights="last_layer")
    la.fit(loader)
    la.prior_precision = post.prior_precision.clone()
    f_mu, f_var = la._glm_predictive_distribution(x[:3])
    last, phi, mu = post._head(x[:3])
    logits = torch.cat(
        [post._head_logits(last, phi, mu, d) for d in post.sample_params(8000, 0).split(500)]
    )
    centred = logits - logits.mean(0)
    cov = torch.einsum("sbi,sbj->bij", centred, centred) / len(logits)
    assert float((logits.mean(0) - f_mu).abs().max()) < 0.1 * float(f_var.max().sqrt())
    assert float((cov - f_var).abs().max()) < 0.06 * float(f_var.abs().max())
    # rebuilt with nothing changed: the same approximation
    assert torch.equal(post.rebuilt().sample_probs(x, 5, 1), post.sample_probs(x, 5, 1))
    # a network whose output is not its last layer's is refused, naming the layer
    squashed = torch.nn.Sequential(copy.deepcopy(map_net), torch.nn.Tanh())
    other = post.rebuilt(net=squashed, param_names=["0.layers.2.weight", "0.layers.2.bias"])
    with pytest.raises(ValueError, match=r"not the output of its last layer.*layers\.2"):
        other.sample_probs(x, 3)


def test_kronecker_factors_over_all_layers_keep_batchnorm_at_its_trained_values(digits):
    """Kronecker factors cover Linear and Conv2d layers only: over all layers of a network
    with BatchNorm, its affine parameters stay at their trained values (left out of the
    posterior, as laplace-torch leaves out parameters that do not require gradients), the
    caller's network is not changed, and the draws are laplace-torch's on that subset."""
    from torch import nn

    from twodg_pyro.data import load_digits_split

    laplace = require_laplace()
    images = load_digits_split(seed=0, image=True)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 10)
    )
    loader = make_loader(images.train, 256)
    post = fit_laplace(net, loader, subset="all", hessian="kron", marglik_steps=10)
    assert post.param_names == ["0.weight", "0.bias", "4.weight", "4.bias"]
    assert all(p.requires_grad for p in net.parameters())  # the caller's network
    frozen = copy.deepcopy(net).eval()
    frozen[1].requires_grad_(False)
    la = laplace.Laplace(
        frozen, "classification", subset_of_weights="all", hessian_structure="kron"
    )
    la.fit(loader)
    la.prior_precision = post.prior_precision.clone()
    theirs = la.sample(5, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(post.sample_params(5, seed=2), theirs, rtol=0, atol=1e-6)
    probs = post.sample_probs(images.test.tensors[0][:8], num_samples=3, seed=0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 8))


def test_lenet_last_layer_is_its_final_linear(digits):
    from twodg_pyro.data import load_digits_split

    images = load_digits_split(seed=0, image=True)
    torch.manual_seed(0)
    net = LeNet5(num_classes=10, in_channels=1, input_size=8)
    post = fit_laplace(net, make_loader(images.train, 256), marglik_steps=10)
    assert post.param_names == ["fc3.weight", "fc3.bias"]
    assert [sizes for sizes in post.block_sizes] == [[10, 84], [10]]
    probs = post.sample_probs(images.test.tensors[0][:8], num_samples=3, seed=0)
    assert probs.shape == (3, 8, 10)


def test_bad_laplace_settings_are_refused_naming_the_value(map_net, digits):
    loader = make_loader(digits.train, 256)
    with pytest.raises(ValueError, match=r"subset = 'middle': must be one of"):
        fit_laplace(map_net, loader, subset="middle")
    with pytest.raises(ValueError, match=r"hessian = 'full': must be one of"):
        fit_laplace(map_net, loader, hessian="full")
    with pytest.raises(ConfigError, match=r"laplace.subset = 'middle'"):
        config_from_dict({"laplace": {"subset": "middle"}})
    with pytest.raises(ConfigError, match=r"laplace.hessian = 'full'"):
        config_from_dict({"laplace": {"hessian": "full"}})
    with pytest.raises(ConfigError, match=r"laplace.prior_structure = 'layerwise'"):
        config_from_dict({"laplace": {"prior_structure": "layerwise"}})


def test_a_missing_laplace_torch_is_one_clear_error(monkeypatch, map_net, digits):
    monkeypatch.setitem(sys.modules, "laplace", None)  # import laplace -> ImportError
    with pytest.raises(MissingLaplaceError, match="pip install laplace-torch"):
        fit_laplace(map_net, make_loader(digits.train, 256))
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "laplace" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="pip install laplace-torch"):
        config_from_dict({"methods": ["laplace"]})


# ---------------------------------------------------------------- early stopping
def test_early_stopping_keeps_the_best_validation_epoch(digits):
    torch.manual_seed(0)
    net = MLP(64, (32,), 10)
    val = digits.val.tensors
    loader = make_loader(digits.train, 64, shuffle=True, seed=0)
    net, report = train_early_stopped(net, loader, val, 20, 3e-2, progress=False)
    history = report["val_nll"]
    assert report["epochs_trained"] == len(history) == 20
    best = report["best_epoch"]
    assert history[best - 1] == min(history) == report["best_val_nll"]
    assert best < 20 and history[-1] > min(history)  # this recipe overfits: not the last
    assert validation_nll(net, val) == pytest.approx(min(history), abs=1e-7)
    # with patience, training stops `patience` epochs after the best one
    torch.manual_seed(0)
    again, short = train_early_stopped(
        MLP(64, (32,), 10),
        make_loader(digits.train, 64, shuffle=True, seed=0),
        val,
        20,
        3e-2,
        patience=3,
        progress=False,
    )
    assert short["best_epoch"] == best and short["epochs_trained"] == best + 3
    # no validation split: the last epoch, and the report says so
    _, none = train_early_stopped(MLP(64, (8,), 10), loader, None, 2, 1e-2, progress=False)
    assert none["best_epoch"] == 2 and none["validation"].startswith("none")
    with pytest.raises(ValueError, match="patience = 0"):
        train_early_stopped(MLP(64, (8,), 10), loader, val, 2, patience=0)
    # the pipeline row without a validation split keeps the last epoch and says so
    cfg = {**_RUN, "methods": ["deterministic_matched"], "data": {"val_fraction": 0.0}}
    cfg["deterministic_matched"] = {"epochs": 3}
    (record,) = run(config_from_dict(cfg)).records
    assert (record["epochs_trained"], record["best_epoch"], record["best_val_nll"]) == (3, 3, None)
    assert record["validation"] == "none: the last epoch is kept"
    with pytest.raises(ConfigError, match=r"deterministic_matched.patience = 0"):
        config_from_dict({"deterministic_matched": {"patience": 0}})


# ---------------------------------------------------------------- the pipeline rows
_RUN = {
    "methods": ["deterministic", "deterministic_matched", "ensemble", "laplace"],
    "seed": 0,
    "num_samples": 6,
    "progress": False,
    "network": {"hidden": [16]},
    "stage1": {"epochs": 4, "deterministic_epochs": 6},
    "stage3": {"epochs": 3},
    "ensemble": {"members": 3},
    "laplace": {"marglik_steps": 50},
    "diagnostics": {"enabled": False},
}


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("baselines") / "run"
    art = run(config_from_dict(copy.deepcopy(_RUN)), out)
    return out, art


def test_the_baseline_rows_of_a_run(baseline_run):
    out, art = baseline_run
    records = {r["method"]: r for r in json.loads((out / "results.json").read_text())["records"]}
    assert list(records) == _RUN["methods"]
    n_net = 64 * 16 + 16 + 16 * 10 + 10
    det, ens, la = records["deterministic"], records["ensemble"], records["laplace"]
    matched = records["deterministic_matched"]
    assert det["stored_params"] == det["trainable_params"] == n_net
    assert ens["members"] == 3 and ens["trainable_params"] == ens["stored_params"] == 3 * n_net
    assert ens["size_mb"] == pytest.approx(4 * 3 * n_net / 1e6)
    # member 0 is the deterministic row's network (same seed, initialisation, shuffles)
    assert ens["member_accuracy"][0] == det["accuracy"] and ens["member_nll"][0] == det["nll"]
    assert ens["nll"] <= sum(ens["member_nll"]) / 3
    assert ens["accuracy"] >= min(ens["member_accuracy"])
    # Laplace on the deterministic row: its network, plus the Kronecker factors (10x10 and
    # 16x16 for the last weight, 10x10 for its bias) and one prior precision
    assert la["map_network"] == "the deterministic row" and la["trainable_params"] == n_net
    assert la["stored_params"] == n_net + 100 + 256 + 100 + 1
    assert la["prior_precision"] > 0 and (la["subset"], la["hessian"]) == ("last_layer", "kron")
    # the matched row: pretrain 0 + stage-1 4 + stage-3 3 epochs, best validation epoch
    assert matched["epochs"] == matched["epochs_trained"] == 7
    assert 1 <= matched["best_epoch"] <= 7 and matched["validation"] == "val"
    net = art.trained["deterministic_matched"].net
    assert validation_nll(net, art.split.val.tensors) == pytest.approx(matched["best_val_nll"])
    # per-draw probabilities of every trained method on other inputs
    x = art.split.val.tensors[0][:5]
    shapes = {m: tuple(method.sample_probs(x, 4, 0).shape) for m, method in art.trained.items()}
    assert shapes == {
        "deterministic": (1, 5, 10),
        "deterministic_matched": (1, 5, 10),
        "ensemble": (3, 5, 10),
        "laplace": (4, 5, 10),
    }
    torch.testing.assert_close(
        art.trained["laplace"].sample_probs(art.eval_data[0], 6, 0).mean(0),
        art.predictions["laplace"].mean,
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_laplace_around_stage_1s_posterior_means(dtype):
    """``laplace.network = "mean_field"``: the approximation's network is stage 1's mean
    network (every Bayesian weight at its guide's loc, the same BatchNorm-free MLP
    otherwise, in the run's dtype), trained by stage 1's parameters; no deterministic
    network is trained."""
    cfg = {**_RUN, "methods": ["mean_field", "laplace"], "num_samples": 4}
    cfg["network"] = {**_RUN["network"], "dtype": dtype}
    cfg["laplace"] = {"marglik_steps": 20, "network": "mean_field"}
    art = run(config_from_dict(copy.deepcopy(cfg)))
    mf, la = (next(r for r in art.records if r["method"] == m) for m in cfg["methods"])
    assert la["map_network"] == "stage 1's posterior means" and la["network"] == "mean_field"
    assert la["trainable_params"] == mf["trainable_params"] and la["map_train_seconds"] > 0
    guide, post = art.trained["mean_field"].guide, art.trained["laplace"]
    params = dict(post.net.named_parameters())
    assert {p.dtype for p in params.values()} == {getattr(torch, dtype)}
    for site in guide.sites:
        torch.testing.assert_close(params[site.name], guide.loc(site.name), rtol=0, atol=0)
    assert "deterministic" not in art.trained and la["prior_precision"] > 0
    assert 0.5 < la["accuracy"] <= 1.0
    # a guide without per-weight means has no mean network
    with pytest.raises(TypeError, match="no per-weight posterior means"):
        GuidePosterior(art.trained["mean_field"].model, torch.nn.Module()).mean_network()
    with pytest.raises(ConfigError, match=r"laplace.network = 'map'"):
        config_from_dict({"laplace": {"network": "map"}})


@pytest.mark.parametrize(
    "dtype, residual",
    [("float32", "none"), ("float64", "none"), ("float32", "gp"), ("float64", "gp")],
)
def test_laplace_around_the_2dg_bnns_posterior_means(dtype, residual, tmp_path, monkeypatch):
    """``laplace.network = "2dg"``: the approximation's network is the run's 2DG BNN's mean
    network (every Bayesian weight at its component centre or outlier mean, in the run's
    dtype), counted as trained by the 2DG row's parameters; its model file predicts what
    the row recorded, with its feature residual if it has one; without the ``2dg`` row
    the settings say what is missing."""
    cfg = {**_RUN, "methods": ["mean_field", "2dg", "laplace"], "num_samples": 4}
    cfg["network"] = {**_RUN["network"], "dtype": dtype}
    cfg["laplace"] = {"marglik_steps": 20, "network": "2dg", "residual": residual}
    cfg["sharing"] = {"n_components": 8, "n_min": 2}
    art = run(config_from_dict(copy.deepcopy(cfg)), tmp_path / "run")
    two_dg, la = (next(r for r in art.records if r["method"] == m) for m in ("2dg", "laplace"))
    assert la["map_network"] == "the 2DG BNN's posterior means" and la["network"] == "2dg"
    assert la["trainable_params"] == two_dg["trainable_params"] < la["stored_params"]
    assert la["map_train_seconds"] == two_dg["train_seconds"]
    means, post = art.trained["2dg"].guide.mean_weights(), art.trained["laplace"]
    params = dict(post.net.named_parameters())
    assert {p.dtype for p in params.values()} == {getattr(torch, dtype)}
    for name, mean in means.items():
        torch.testing.assert_close(params[name], mean, rtol=0, atol=0)
    assert 0.5 < la["accuracy"] <= 1.0 and la["nll"] != two_dg["nll"]
    result = evaluate_model_file(tmp_path / "run" / "model_laplace.pt")
    assert result["nll"] == la["nll"] and result["accuracy"] == la["accuracy"]
    # what a user deploys: the compact 2DG BNN with the Laplace factors beside it, which
    # loads as the same approximation around the file's (rounded) 2DG means
    compact = tmp_path / "run" / "model_laplace.2dgz"
    assert la["file"] == compact.name and la["file_bytes"] == compact.stat().st_size
    assert la["file_bytes"] < (tmp_path / "run" / "model_laplace.pt").stat().st_size
    # the factors' upper triangles at the run's dtype; a residual's features at float16
    features = 0 if post.residual is None else post.residual.inducing.numel()
    size = post.prior_precision.element_size()
    packed = sum(p * (p + 1) // 2 for sizes in post.block_sizes for p in sizes)
    factor_bytes = size * (post.prior_precision.numel() + packed) + 2 * features
    assert two_dg["file_bytes"] + factor_bytes < la["file_bytes"]
    assert la["file_bytes"] < two_dg["file_bytes"] + factor_bytes + 512  # + their header
    assert 0 <= la["file_prob_diff"] < 0.02
    loaded = load_method(compact)
    assert type(loaded) is type(post) and loaded.name == "laplace"
    assert loaded.settings == post.settings and loaded.param_names == post.param_names
    assert loaded.h_factor == post.h_factor
    assert (loaded.residual is None) == (post.residual is None) == (residual == "none")
    if post.residual is not None:  # the training features, rounded to float16
        z = post.residual.inducing
        assert torch.equal(loaded.residual.inducing, z.half())
        mine, theirs = loaded.residual.logit_std(z[:50]), post.residual.logit_std(z[:50])
        torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(loaded.prior_precision, post.prior_precision, rtol=0, atol=0)
    for mine, theirs in zip(loaded.factors, post.factors, strict=True):
        for a, b in zip(mine, theirs, strict=True):  # the triangle prediction reads
            assert a.dtype == getattr(torch, dtype) and torch.equal(a, a.T)
            torch.testing.assert_close(a.triu(), b.triu(), rtol=0, atol=0)
    file_bnn = GuidePosterior(*load_model(compact))  # the file's 2DG BNN and its means
    for name, mean in file_bnn.guide.mean_weights().items():
        torch.testing.assert_close(dict(loaded.net.named_parameters())[name], mean)
        torch.testing.assert_close(mean, means[name], rtol=0, atol=2e-3)  # float16 centres
    assert evaluate_model_file(compact)["accuracy"] == pytest.approx(la["accuracy"], abs=0.02)
    # diagnose: the file's 2DG BNN (the Laplace last layer is no variational posterior),
    # the one the loaded approximation keeps, the file read once
    assert isinstance(loaded.bnn, GuidePosterior) and loaded.bnn.guide.method == "2dg"
    reads = []
    real = compact_load.read_compact
    monkeypatch.setattr(
        compact_load, "read_compact", lambda *a, **k: reads.append(a) or real(*a, **k)
    )
    report = diagnose_model_file(
        compact, tmp_path / "diag", num_samples=4, khat_samples=30, max_train_examples=60
    )
    assert len(reads) == 1
    assert report["method"] == "2dg" and "2DG BNN" in report["diagnosed_part"]
    assert report["errors"] == {} and report["vi"]["n_examples"] == 60
    bnn_file = evaluate_model_file(tmp_path / "run" / two_dg["file"], num_samples=4)
    assert report["metrics"]["nll"] == pytest.approx(bnn_file["nll"], rel=1e-6)
    # a Laplace approximation around another network is refused, naming the tensor
    other = copy.deepcopy(post)
    with torch.no_grad():
        next(iter(other.net.parameters())).add_(1e-3)
    bnn = art.trained["2dg"]
    with pytest.raises(ValueError, match="not around this 2DG BNN's posterior means"):
        export_compact(tmp_path / "x.2dgz", bnn.model, bnn.guide, laplace=other)
    with pytest.raises(TypeError, match="laplace must be a LaplacePosterior"):
        export_compact(tmp_path / "x.2dgz", bnn.model, bnn.guide, laplace=bnn)
    assert not (tmp_path / "x.2dgz").exists()
    with pytest.raises(ConfigError, match=r"laplace.network = '2dg'.*add '2dg' to methods"):
        config_from_dict({"methods": ["mean_field", "laplace"], "laplace": {"network": "2dg"}})


@pytest.mark.parametrize("method", ["ensemble", "laplace", "deterministic_matched"])
def test_baseline_model_files_evaluate_to_the_records_numbers(baseline_run, method, capsys):
    out, _ = baseline_run
    record = next(
        r
        for r in json.loads((out / "results.json").read_text())["records"]
        if r["method"] == method
    )
    path = out / f"model_{method}.pt"
    result = evaluate_model_file(path)
    assert result["method"] == method and result["n_examples"] == 359
    for key in ("accuracy", "nll", "ece", "brier"):
        assert result[key] == record[key], key  # the same draws: the same numbers
    assert result["recorded_metrics"]["nll"] == record["nll"]
    if method == "ensemble":
        assert result["num_samples"] == 3
        assert main(["evaluate", str(path), "--seed", "5"]) == 0  # no draws: seed-free
        printed = json.loads(capsys.readouterr().out)
        assert printed["nll"] == record["nll"] and "recorded_metrics" in printed
    if method == "laplace":
        assert result["num_samples"] == _RUN["num_samples"]
        assert main(["evaluate", str(path), "--seed", "1"]) == 0  # other draws, other numbers
        assert json.loads(capsys.readouterr().out)["nll"] != record["nll"]


def test_baseline_files_are_safe_and_say_how_to_read_them(baseline_run, tmp_path):
    out, art = baseline_run
    path = out / "model_laplace.pt"
    loaded = load_method(path)
    assert isinstance(loaded, LaplacePosterior)
    x = art.split.test.tensors[0][:10]
    assert torch.equal(loaded.sample_probs(x, 6, 0), art.trained["laplace"].sample_probs(x, 6, 0))
    with pytest.raises(ValueError, match="load_method"):
        load_model(path)
    # each Kronecker factor is stored as its upper triangle, and a file from before that
    # (square factors) loads and predicts the same
    post = art.trained["laplace"]
    fields, tensors = post.file_content()
    for i, sizes in enumerate(post.block_sizes):
        for j, p in enumerate(sizes):
            f, packed = post.factors[i][j], tensors[f"laplace/kfac/{i}/{j}"]
            assert packed.shape == (p * (p + 1) // 2,) and torch.equal(packed[:p], f[0])
            assert torch.equal(model_format.unpack_upper(f, p), f)
    with pytest.raises(ValueError, match="packed 3 x 3 factor has 6 values, not 5"):
        model_format.unpack_upper(torch.ones(5), 3)
    square = tmp_path / "square.pt"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(laplace_module, "pack_upper", lambda m: m.clone())
        post.save(square)
    assert square.stat().st_size > path.stat().st_size
    x_old = load_method(square, net=MLP(64, (16,), 10)).sample_probs(x, 6, 0)
    assert torch.equal(x_old, post.sample_probs(x, 6, 0))
    damaged = tmp_path / "damaged.pt"
    data = bytearray(path.read_bytes())
    i = data.find(b"kfac") + 200  # inside a tensor of the payload
    data[i] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged.pt"):
        load_method(damaged)
    # a network alone round-trips too
    own = tmp_path / "net.pt"
    art.trained["deterministic"].save(own, network=None)
    net = load_method(own, net=MLP(64, (16,), 10))
    assert isinstance(net, Network) and net.name == "deterministic"
    assert torch.equal(net.sample_probs(x), art.trained["deterministic"].sample_probs(x))


def test_existing_rows_report_their_stored_numbers(tiny_run):
    records = {
        r["method"]: r for r in json.loads((tiny_run / "results.json").read_text())["records"]
    }
    n_w = 64 * 16 + 16 + 16 * 10 + 10
    assert records["mean_field"]["stored_params"] == 2 * n_w  # loc and scale per weight
    assert records["2dg"]["stored_params"] == records["2dg"]["trainable_params"] < n_w
    assert math.isfinite(records["2dg"]["size_mb_with_index"])


def test_train_deterministic_callback_can_stop_training(digits):
    seen = []
    net = MLP(64, (8,), 10)
    loader = make_loader(digits.train, 256)
    train_deterministic(
        net, loader, 10, on_epoch_end=lambda e, n: seen.append(e) or e == 2, progress=False
    )
    assert seen == [0, 1, 2] and not net.training
