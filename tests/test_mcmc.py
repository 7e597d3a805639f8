"""The MCMC reference posterior (issue 32): NUTS recovers a conjugate posterior, the
sampler statistics and the ArviZ statistics are right, the posterior predicts and is
stored like the baselines, a network too large is refused, and the fidelity scores."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.diagnostics._arviz import chain_stats
from twodg_pyro.likelihoods import Gaussian
from twodg_pyro.methods import load_method
from twodg_pyro.methods.mcmc import (
    MCMCPosterior,
    TooLargeForMCMCError,
    flat_potential,
    mcmc_report,
    mcmc_tree,
    report_lines,
    run_mcmc,
)
from twodg_pyro.methods.mcmc.arviz import ebfmi
from twodg_pyro.methods.mcmc.potential import linear_chain
from twodg_pyro.priors import NormalPrior
from twodg_pyro.uncertainty.fidelity import fidelity, top1_agreement, total_variation


def _regression(n: int = 40, d: int = 2, noise: float = 0.5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.tensor([1.0, -0.5])[:d]
    y = x @ w + noise * torch.randn(n, generator=g)
    return x, y


def test_nuts_recovers_the_conjugate_posterior_of_a_bayesian_linear_regression():
    # w ~ N(0, tau^2 I), y | x, w ~ N(x w, sigma^2): posterior N(m, S) in closed form
    tau, sigma = 1.0, 0.5
    x, y = _regression(noise=sigma)
    model = BNNModel(
        nn.Linear(2, 1, bias=False), prior=NormalPrior(tau), likelihood=Gaussian(len(y), sigma)
    )
    post = run_mcmc(model, (x, y), num_samples=200, warmup_steps=100, num_chains=2, seed=1)
    precision = x.T @ x / sigma**2 + torch.eye(2) / tau**2
    cov = torch.linalg.inv(precision)
    mean = cov @ x.T @ y / sigma**2
    draws = post.draws.reshape(-1, 2).double()
    sd = cov.diagonal().sqrt()
    # Monte Carlo error of the mean with >= 100 effective draws is under 0.1 sd
    assert torch.all((draws.mean(0) - mean).abs() < 0.3 * sd), (draws.mean(0), mean)
    ratio = draws.var(0) / cov.diagonal()
    assert torch.all((ratio > 0.6) & (ratio < 1.6)), ratio
    assert post.draws.shape == (2, 200, 2)
    # the statistics of every kept draw; the log density is -U at the draw
    stats = post.sample_stats
    assert set(stats) >= {"diverging", "tree_depth", "step_size", "energy", "lp"}
    assert all(v.shape == (2, 200) for v in stats.values())
    pot = flat_potential(model, (x, y))
    w = post.draws[1, -1]
    assert float(stats["lp"][1, -1]) == pytest.approx(-float(pot({"w": w})), rel=1e-4)
    assert float(stats["diverging"].sum()) == 0
    assert torch.all(stats["tree_depth"] >= 1)


def test_the_potential_is_the_models_prior_and_likelihood():
    x, y = _regression()
    model = BNNModel(nn.Linear(2, 1), prior=NormalPrior(2.0), likelihood=Gaussian(len(y), 0.5))
    pot = flat_potential(model, (x, y))
    w = torch.tensor([0.3, -0.2, 0.1])  # weight (1, 2), then the bias
    expected = (
        torch.distributions.Normal(0.0, 2.0).log_prob(w).sum()
        + torch.distributions.Normal(x @ w[:2] + w[2], 0.5).log_prob(y).sum()
    )
    assert float(pot({"w": w})) == pytest.approx(-float(expected), rel=1e-5)
    assert linear_chain(model) is None  # a plain Linear is no chain: Sequential/MLP only
    assert pot.unflatten(w)["weight"].shape == (1, 2)


def test_the_fast_chain_forward_matches_the_network():
    from twodg_pyro.models import MLP

    net = MLP(6, (4,), 3)
    model = BNNModel(net, likelihood=10)
    chain = linear_chain(model)
    assert chain is not None
    x = torch.randn(10, 6)
    y = torch.randint(0, 3, (10,))
    pot = flat_potential(model, (x, y))
    w = torch.randn(pot.dim)
    model_out = model.network_forward(pot.unflatten(w), x)
    pot_chainless = flat_potential(model, (x, y))
    pot_chainless.layers = None
    assert float(pot({"w": w})) == pytest.approx(float(pot_chainless({"w": w})), rel=1e-5)
    assert model_out.shape == (10, 3)


def test_a_network_too_large_is_refused_naming_the_limit():
    model = BNNModel(nn.Linear(50, 10), likelihood=4)
    x, y = torch.randn(4, 50), torch.randint(0, 10, (4,))
    with pytest.raises(TooLargeForMCMCError, match=r"n_w = 510 .* 100 .*max_params=510"):
        run_mcmc(model, (x, y), max_params=100)


def test_bad_settings_and_data_are_named():
    model = BNNModel(nn.Linear(3, 2), likelihood=5)
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    with pytest.raises(ValueError, match="mcmc.thin = 10: keeps no draw"):
        run_mcmc(model, (x, y), num_samples=5, thin=10)
    with pytest.raises(ValueError, match=r"mcmc.kernel = 'gibbs': must be one of \['nuts'"):
        run_mcmc(model, (x, y), kernel="gibbs")
    with pytest.raises(ValueError, match="dataset_size = 5 .* hold 3"):
        run_mcmc(model, (x[:3], y[:3]))


def test_hmc_kernel_and_prediction_of_a_small_classifier():
    torch.manual_seed(0)
    x = torch.randn(30, 3)
    y = (x[:, 0] > 0).long()
    model = BNNModel(nn.Sequential(nn.Linear(3, 2)), likelihood=30)
    post = run_mcmc(
        model,
        (x, y),
        kernel="hmc",
        num_steps=5,
        num_samples=40,
        warmup_steps=20,
        num_chains=2,
        thin=2,
    )
    assert post.draws.shape == (2, 20, 8)
    # HMC keeps the trajectory length (5 initial steps) as the step size adapts
    assert torch.all(post.sample_stats["n_steps"] >= 1)
    assert torch.all(post.sample_stats["tree_depth"] == 0)
    probs = post.sample_probs(x, num_samples=None)
    assert probs.shape == (40, 30, 2)
    assert torch.allclose(probs.sum(-1), torch.ones(40, 30))
    assert post.sample_probs(x, num_samples=7).shape == (7, 30, 2)
    pred = post.predict((x, y), num_samples=None)
    assert torch.allclose(pred.mean, probs.mean(0))
    # a separable problem: the posterior predictive gets most of it right
    assert (pred.mean.argmax(-1) == y).float().mean() > 0.8


def _posterior(chains: int = 2, draws: int = 50, seed: int = 0) -> MCMCPosterior:
    model = BNNModel(nn.Sequential(nn.Linear(3, 2)), likelihood=6)
    g = torch.Generator().manual_seed(seed)
    stats = {
        k: torch.rand(chains, draws, generator=g)
        for k in ("tree_depth", "n_steps", "step_size", "energy", "lp", "accept_prob")
    }
    stats["diverging"] = torch.zeros(chains, draws)
    settings = {
        "kernel": "nuts",
        "num_samples": draws,
        "num_chains": chains,
        "divergences": [0] * chains,
        "max_tree_depth": 10,
    }
    return MCMCPosterior(model, torch.randn(chains, draws, 8, generator=g), stats, settings)


def test_chain_stats_match_the_split_rhat_by_hand():
    rng = np.random.default_rng(0)
    mixed = rng.normal(size=(4, 500, 3))
    stuck = mixed + np.array([0.0, 0.0, 2.0, 2.0])[:, None, None]
    r_mixed, r_stuck = chain_stats(mixed)["rhat"], chain_stats(stuck)["rhat"]

    def split_rhat(v):  # Gelman et al.'s split R-hat (rank-normalised ~ the same on normals)
        half = v.shape[1] // 2
        s = np.concatenate([v[:, :half], v[:, half : 2 * half]])
        n = s.shape[1]
        w = s.var(1, ddof=1).mean()
        b = n * s.mean(1).var(ddof=1)
        return math.sqrt(((n - 1) / n * w + b / n) / w)

    for i in range(3):
        assert r_mixed[i] == pytest.approx(split_rhat(mixed[:, :, i]), abs=0.01)
        assert r_stuck[i] == pytest.approx(split_rhat(stuck[:, :, i]), rel=0.05)
    assert np.all(r_mixed < 1.01) and np.all(r_stuck > 1.3)
    ess = chain_stats(mixed)["ess_bulk"]
    assert np.all((ess > 1000) & (ess < 3000))  # 2,000 independent draws
    # a constant value: no R-hat
    const = chain_stats(np.ones((2, 10, 1)))
    assert np.isnan(const["rhat"][0])


def test_ebfmi_by_hand():
    e = np.array([[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    # chain 0: diffs 1,1,1 over deviations 4 * 0.25; chain 1: diffs 0,1,0 over 1
    assert ebfmi(e).tolist() == pytest.approx([3.0, 1.0])


def test_the_report_and_the_tree_of_the_chains():
    post = _posterior()
    x = torch.randn(5, 3)
    rep = mcmc_report(post, x)
    assert set(rep["sites"]) == {"0.weight", "0.bias"}
    assert rep["predictive"]["n_values"] == 5 * 2
    assert rep["sampler"]["divergences"] == 0
    assert len(rep["sampler"]["ebfmi"]) == 2
    # independent draws: mixed
    assert rep["sites"]["0.weight"]["max_rhat"] < 1.1
    lines = report_lines(rep)
    assert lines[0].startswith("MCMC (nuts): 2 chains x 50 kept draws")
    assert any("predictive probabilities" in line for line in lines)
    tree = mcmc_tree(post, x)
    from twodg_pyro.diagnostics import group, group_names

    assert {"posterior", "sample_stats", "predictions"} <= set(group_names(tree))
    assert group(tree, "posterior")["0.weight"].shape == (2, 50, 2, 3)
    assert group(tree, "sample_stats")["diverging"].values.tolist() == [[0] * 50] * 2
    assert group(tree, "predictions")["probs"].shape == (2, 50, 5, 2)


def test_the_posterior_round_trips_through_a_model_file(tmp_path):
    post = _posterior()
    x = torch.randn(7, 3)
    path = post.save(tmp_path / "model_mcmc.pt", network=None)
    back = load_method(path, net=nn.Sequential(nn.Linear(3, 2)))
    assert isinstance(back, MCMCPosterior)
    assert torch.equal(back.draws, post.draws)
    assert back.settings == post.settings
    assert torch.allclose(back.sample_probs(x, None), post.sample_probs(x, None))
    assert torch.equal(back.sample_stats["lp"], post.sample_stats["lp"])


def test_fidelity_by_hand():
    ref = torch.tensor([[0.7, 0.3], [0.2, 0.8], [0.5, 0.5 - 1e-6]])
    p = torch.tensor([[0.6, 0.4], [0.6, 0.4], [0.5, 0.5 - 1e-6]])
    assert top1_agreement(p, ref) == pytest.approx(2 / 3)
    assert total_variation(p, ref) == pytest.approx((0.1 + 0.4 + 0.0) / 3)
    labels = torch.tensor([0, 1, 0])
    f = fidelity(p, ref, labels)
    nll_p = -(math.log(0.6) + math.log(0.4) + math.log(0.5)) / 3
    nll_r = -(math.log(0.7) + math.log(0.8) + math.log(0.5)) / 3
    assert f["nll_gap"] == pytest.approx(nll_p - nll_r, rel=1e-4)
    assert fidelity(ref, ref, labels)["tv"] == 0.0
    with pytest.raises(ValueError, match=r"\(3, 2\) and \(2, 2\)"):
        total_variation(p, ref[:2])


def test_the_run_settings_have_an_mcmc_section():
    from twodg_pyro.pipeline import config_from_dict
    from twodg_pyro.pipeline.settings.config import METHODS, ConfigError

    assert "mcmc" in METHODS
    cfg = config_from_dict({"methods": ["mcmc"], "mcmc": {"num_chains": 3}})
    assert cfg.mcmc.num_chains == 3 and cfg.mcmc.kernel == "nuts"
    with pytest.raises(ConfigError, match="mcmc.thin = 9"):
        config_from_dict({"mcmc": {"num_samples": 5, "thin": 9}})
    with pytest.raises(ConfigError, match="mcmc.kernel"):
        config_from_dict({"mcmc": {"kernel": "gibbs"}})


def test_evaluate_and_diagnose_an_mcmc_model_file(tmp_path, capsys):
    import json

    from twodg_pyro.cli import main
    from twodg_pyro.data.digits import load_digits_split
    from twodg_pyro.models import MLP

    split = load_digits_split(seed=0)
    x, y = (t[:120] for t in split.train.tensors)
    torch.manual_seed(0)
    model = BNNModel(MLP(64, (3,), 10), likelihood=len(y))
    post = run_mcmc(model, (x, y), num_samples=12, warmup_steps=8, num_chains=2, max_tree_depth=3)
    evaluation = {"num_samples": post.num_draws(), "seed": 0, "data": {"name": "digits"}}
    spec = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [3], "num_classes": 10}}
    path = post.save(tmp_path / "model_mcmc.pt", spec, evaluation)
    assert main(["evaluate", str(path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["method"] == "mcmc" and result["num_samples"] == 24
    folder = tmp_path / "diag"
    assert main(["diagnose", str(path), "--out", str(folder), "--max-examples", "20"]) == 0
    printed = capsys.readouterr().out
    assert "MCMC (nuts): 2 chains x 12 kept draws" in printed
    assert "predictive probabilities" in printed
    report = json.loads((folder / "diagnostics.json").read_text())
    assert report["errors"] == {}
    assert report["mcmc"]["predictive"]["n_values"] == 20 * 10
    assert report["metrics"]["accuracy"] == pytest.approx(result["accuracy"])
    for name in ("mcmc_trace.png", "mcmc_trace_rank.png", "inference_data_mcmc.nc"):
        assert (folder / name).stat().st_size > 1000, name


def test_costs_count_an_mcmc_posterior_by_its_kept_draws():
    """The run's cost fields predict an MCMC posterior as its table row does (all kept
    draws), not as a deterministic network (it has no ``forward``)."""
    post = _posterior(chains=2, draws=7)
    x = torch.randn(5, 3)
    assert post.forwards_per_prediction(num_samples=30) == 14
    pred = post.predict((x, torch.zeros(5, dtype=torch.long)), 30, 0)
    assert torch.allclose(pred.mean, post.sample_probs(x, num_samples=None).mean(0))


def test_compare_ranks_nuts_beside_mean_field_and_2dg_without_a_warning(tmp_path):
    """Issue 45, item 2: the chains' tree carries ``log_likelihood`` and ``observed_data``
    on the examples a guide's export takes, so one ``compare`` ranks NUTS, the mean-field
    and the 2DG BNN of one run -- on ArviZ 0.x and 1.x, without an error or a warning
    (the file of ``diagnose`` holds them too)."""
    import warnings

    from twodg_pyro.diagnostics import compare, group, load_inference_data, loo, to_inference_data
    from twodg_pyro.pipeline import config_from_dict, run

    cfg = {
        "methods": ["mean_field", "2dg", "mcmc"],
        "num_samples": 30,
        "progress": False,
        "network": {"hidden": [4]},
        "stage1": {"epochs": 3},
        "sharing": {"outlier_rule": "quantile", "n_components": 4, "n_min": 5, "k_nearest": 4},
        "stage3": {"epochs": 2},
        "mcmc": {"num_samples": 20, "warmup_steps": 10, "num_chains": 2, "max_tree_depth": 3},
        "diagnostics": {"enabled": False},
    }
    art = run(config_from_dict(cfg))
    data = tuple(t[:60] for t in art.split.test.tensors)
    trees = {
        name: to_inference_data(art.trained[name].model, art.trained[name].guide, data, 30)
        for name in ("mean_field", "2dg")
    }
    trees["nuts"] = mcmc_tree(art.trained["mcmc"], data)
    assert group(trees["nuts"], "log_likelihood")["y"].shape == (2, 20, 60)
    y = group(trees["nuts"], "observed_data")["y"].values
    assert (y == data[1].numpy()).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = compare(trees)
        assert loo(trees["nuts"])["n_data_points"] == 60
    assert set(table.index) == {"nuts", "mean_field", "2dg"}
    assert float(table["weight"].sum()) == pytest.approx(1.0)
    # the chains' pointwise log-likelihood is that of their own predictive
    probs = art.trained["mcmc"].sample_probs(data[0], None)
    ll = group(trees["nuts"], "log_likelihood")["y"].values.reshape(40, 60)
    expected = probs.double().gather(2, data[1].view(1, -1, 1).expand(40, -1, 1)).squeeze(2).log()
    np.testing.assert_allclose(ll, expected.numpy(), rtol=1e-4, atol=1e-6)
    from twodg_pyro.diagnostics import save_inference_data

    path = save_inference_data(trees["nuts"], tmp_path / "nuts.nc")
    assert loo(load_inference_data(path))["n_data_points"] == 60


def test_compare_ranks_nuts_mean_field_and_2dg_on_regression_by_the_gaussian_likelihood(
    tmp_path,
):
    """Issue 45, item 2, on regression: the chains' tree holds each draw's Normal
    log-density of the targets (not a class's), the float targets as ``observed_data`` and
    each draw's mean as ``predictions``, so one ``compare`` ranks NUTS, the mean-field and
    the 2DG BNN of a regression problem without a warning; the chains predict by the moments
    of their Normals (the law of total variance, as ``predict``), and their file keeps it."""
    import copy
    import warnings

    import pyro

    import twodg_pyro as tp
    from twodg_pyro.data import load_dataset
    from twodg_pyro.diagnostics import compare, group, to_inference_data
    from twodg_pyro.models import MLP

    split = load_dataset("diabetes", seed=0)
    x, y = split.train.tensors
    data = tuple(t[:60] for t in split.test.tensors)
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    lik = tp.Gaussian(len(y), learn_scale=True)
    model = BNNModel(MLP(10, (8,), 1), prior=tp.LayerwiseNormalPrior(1.0), likelihood=lik)
    guide = tp.MeanFieldGuide(model)
    tp.fit(model, guide, [(x, y)], epochs=200, lr=3e-2, progress=False)
    model_2dg = copy.deepcopy(model)
    sharing = tp.SharingConfig(outlier_rule="quantile", n_components=4, n_min=5, k_nearest=4)
    structure, _ = tp.build_sharing(model_2dg, guide, [(x, y)], sharing)
    shared = tp.SharedGMMGuide(model_2dg, structure, tying="representative")
    tp.fit(model_2dg, shared, [(x, y)], epochs=20, lr=1e-2, progress=False)
    sigma = model.likelihood.scale  # NUTS samples the weights, the noise fixed at the fit's
    fixed = BNNModel(MLP(10, (8,), 1), tp.LayerwiseNormalPrior(1.0), Gaussian(len(y), sigma))
    post = run_mcmc(fixed, (x, y), num_samples=20, warmup_steps=20, num_chains=2, max_tree_depth=4)

    trees = {
        "mean_field": to_inference_data(model, guide, data, 30),
        "2dg": to_inference_data(model_2dg, shared, data, 30),
        "nuts": mcmc_tree(post, data),
    }
    means = post.sample_probs(data[0], None)  # each draw's mean, (C D, N)
    assert means.shape == (40, 60)
    ll = group(trees["nuts"], "log_likelihood")["y"].values
    expected = torch.distributions.Normal(means.double(), sigma).log_prob(data[1].double())
    np.testing.assert_allclose(ll.reshape(40, 60), expected.numpy(), rtol=1e-5, atol=1e-6)
    observed = group(trees["nuts"], "observed_data")["y"].values
    assert observed.dtype == np.float64 and np.array_equal(observed, data[1].double().numpy())
    loc = group(trees["nuts"], "predictions")["loc"].values
    np.testing.assert_allclose(loc.reshape(40, 60), means.numpy(), rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = compare(trees)
    assert set(table.index) == {"nuts", "mean_field", "2dg"}
    assert float(table["weight"].sum()) == pytest.approx(1.0)

    pred = post.predict(data, keep_samples=True)
    torch.testing.assert_close(pred.samples, means)
    torch.testing.assert_close(pred.mean, means.mean(0))
    torch.testing.assert_close(pred.epistemic_std, means.double().std(0, correction=0).float())
    torch.testing.assert_close(pred.aleatoric_std, torch.full((60,), sigma))
    torch.testing.assert_close(pred.std**2, pred.epistemic_std**2 + pred.aleatoric_std**2)
    assert post.predict(data).samples is None
    report = mcmc_report(post, data[0])
    assert report["predictive_quantity"] == "means"
    assert any(line.lstrip().startswith("predictive means") for line in report_lines(report))
    spec = {"name": "mlp", "kwargs": {"in_features": 10, "hidden": [8], "num_classes": 1}}
    again = load_method(post.save(tmp_path / "model_mcmc.pt", network=spec))
    torch.testing.assert_close(again.predict(data).std, pred.std)
    # twodg-pyro evaluate's job: the regression metrics of all its draws on the test split
    from twodg_pyro.evaluation import prediction_metrics
    from twodg_pyro.pipeline.outputs.saved_models import evaluate_model_file

    got = evaluate_model_file(tmp_path / "model_mcmc.pt", data="diabetes")
    want = prediction_metrics(post.predict(split.test.tensors))
    assert {k: got[k] for k in want} == pytest.approx(want) and got["num_samples"] == 40


def test_the_pinned_pyro_has_the_private_methods_the_kernels_override():
    """The recording kernels override private methods of Pyro 1.9 (the pin in
    pyproject.toml, ``<1.10``): a Pyro whose methods moved fails here, not in a run."""
    import inspect
    from importlib.metadata import version

    from pyro.infer.mcmc import HMC, NUTS

    major, minor = (int(v) for v in version("pyro-ppl").split(".")[:2])
    assert (major, minor) == (1, 9)
    for name in ("_sample_r", "_fetch_from_cache", "_kinetic_energy", "sample"):
        assert callable(getattr(HMC, name)), name
    tree = list(inspect.signature(NUTS._build_tree).parameters)
    assert tree == ["self", "z", "r", "z_grads", "log_slice", "direction", "tree_depth"] + [
        "energy_current"
    ]
    assert callable(NUTS._build_basetree)
    x, y = torch.randn(6, 3), torch.tensor([0, 1] * 3)  # the attributes read at each step
    model = BNNModel(nn.Sequential(nn.Linear(3, 2)), likelihood=6)
    post = run_mcmc(model, (x, y), num_samples=3, warmup_steps=2, num_chains=1)
    assert post.sample_stats["accept_prob"].shape == (1, 3)
    assert post.settings["divergences"] == [0] and post.settings["step_size"] == 0.01
