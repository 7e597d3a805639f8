"""Device and dtype follow the network, tested without a GPU.

CI has no GPU, so the bug class behind "``--device cuda`` crashes at the first SVI step"
(a prior's parameters made on the CPU in float32, whatever the network) is tested with
float64 as the stand-in: a float64 network must give float64 priors, KL terms, draws,
stage-2 mixture, guide parameters and results, for every method, through the library,
the pipeline, the model file and checkpoints.  A float32 tensor anywhere on the way
shows up as a float32 result (or as a float32-rounded value: the priors' parameters
are compared with the exact float64 values).  The priors are also put on PyTorch's
``meta`` device, which no CPU-made tensor can pass for.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
from conftest import SMALL_SHARING

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.guides.rank1 import CauchyPrior, Rank1BNNModel, Rank1Guide
from twodg_pyro.guides.ssvi import SSVIGuide
from twodg_pyro.guides.ssvi_subspace import SubspaceUpdate
from twodg_pyro.infer import DecomposedELBO, fit
from twodg_pyro.io import load_2dg, save_2dg
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.nn.sites import BayesianSite
from twodg_pyro.pipeline import ConfigError, SharingConfig, config_from_dict, load_config, run
from twodg_pyro.pipeline.outputs.saved_models import diagnose_model_file, evaluate_model_file
from twodg_pyro.prediction import predict
from twodg_pyro.priors import (
    LaplacePrior,
    LayerwiseNormalPrior,
    NormalPrior,
    PretrainedPrior,
    SitePrior,
    distribution_to,
)
from twodg_pyro.sharing import MahalanobisHook, MergeHook, build_sharing

F64 = torch.float64
SHARING = SharingConfig(**SMALL_SHARING)
SITE = BayesianSite("w", "", "weight", torch.Size([3, 4]), "Linear", 4)


def _tensors(d) -> list[torch.Tensor]:
    """Every tensor parameter of a distribution, through wrappers."""
    out = []
    for v in vars(d).values():
        if torch.is_tensor(v):
            out.append(v)
        elif isinstance(v, torch.distributions.Distribution):
            out += _tensors(v)
    return out


# ---------------------------------------------------------------------------- priors
PRIORS = {
    "normal": NormalPrior(0.1, loc=0.3),
    "laplace": LaplacePrior(0.2),
    "layerwise": LayerwiseNormalPrior(gain=1.5),
    "cauchy": CauchyPrior(0.1),
    "site_student_t": SitePrior(dist.StudentT(3.0, 0.0, 0.1)),
    "site_lognormal_fn": SitePrior(lambda site: dist.LogNormal(0.0, 0.5)),
    "site_mixture": SitePrior(
        dist.MixtureSameFamily(
            dist.Categorical(torch.tensor([0.5, 0.5])),
            dist.Normal(torch.zeros(2), torch.tensor([1.0, 0.1])),
        )
    ),
}


@pytest.mark.parametrize("name", sorted(PRIORS))
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_every_prior_follows_the_device_and_dtype_of_like(name, device):
    like = torch.empty(SITE.shape, device=device, dtype=F64)
    d = PRIORS[name](SITE, like)
    assert d.event_shape == SITE.shape
    params = _tensors(d.base_dist)
    assert params
    for t in params:
        assert t.device.type == device
        assert t.dtype == F64 or not t.is_floating_point()


def test_library_priors_hold_exact_float64_values_dtype():
    like = torch.empty(SITE.shape, dtype=F64)
    d = NormalPrior(0.1, loc=0.3)(SITE, like).base_dist
    # exactly the float64 numbers, not float32 ones widened (0.1 -> 0.10000000149...)
    assert d.scale.reshape(-1)[0].item() == 0.1 and d.loc.reshape(-1)[0].item() == 0.3
    scale = LayerwiseNormalPrior(gain=1.5)(SITE, like).base_dist.scale.reshape(-1)[0].item()
    assert scale == 1.5 / math.sqrt(4)
    # without like: the CPU in torch's default dtype, as before
    d32 = NormalPrior(0.1)(SITE).base_dist
    assert d32.scale.dtype == torch.get_default_dtype() and d32.scale.device.type == "cpu"


def test_prior_tensors_are_made_once_per_device_and_dtype():
    like = torch.empty(SITE.shape, dtype=F64)
    for prior in (NormalPrior(0.5), PRIORS["site_student_t"]):
        a, b = prior(SITE, like).base_dist, prior(SITE, like).base_dist
        assert a.scale.data_ptr() == b.scale.data_ptr()  # no copy per step
    t = torch.tensor(0.5)
    moved = distribution_to(dist.Normal(t, t), "cpu", F64)
    t.fill_(0.25)  # an in-place change of the source is seen, not a stale copy
    assert distribution_to(dist.Normal(t, t), "cpu", F64).loc.item() == 0.25
    assert moved.loc.item() == 0.5


def test_a_learnt_prior_parameter_keeps_its_gradient_dtype():
    scale = torch.tensor(0.3, requires_grad=True)
    d = SitePrior(lambda site: dist.Normal(0.0, scale))(SITE, torch.empty(3, 4, dtype=F64))
    d.log_prob(torch.zeros(3, 4, dtype=F64)).backward()
    assert d.base_dist.scale.dtype == F64 and scale.grad is not None


# ---------------------------------------------------------------------------- library
@pytest.fixture(scope="module")
def f64_mean_field(digits):
    """A float64 64-16-10 mean-field BNN trained 3 epochs, its stage-2 structure."""
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    net = MLP(64, (16,), 10).to(F64)
    model = BNNModel(net, prior=NormalPrior(0.3), likelihood=Categorical(len(digits.train)))
    guide = MeanFieldGuide(model, seed=0)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    fit(model, guide, loader, epochs=3, lr=1e-2, progress=False)
    structure, report = build_sharing(model, guide, loader, SHARING, seed=0)
    return model, guide, structure, loader


def _all_f64(tensors) -> None:
    for k, t in tensors.items():
        assert t.dtype == F64, (k, t.dtype)


def test_float64_mean_field_kl_matches_the_closed_form_dtype(f64_mean_field, digits):
    model, guide, _, _ = f64_mean_field
    x, y = digits.train.tensors[0][:32], digits.train.tensors[1][:32]
    terms = DecomposedELBO().loss_terms(model, guide, x, y)
    _all_f64(terms)
    # KL(N(mu, s^2) || N(0, 0.3^2)) summed, in float64 by hand (a prior scale made in
    # float32 is 0.30000001192...: off by 4e-8, far beyond the tolerance)
    kl = 0.0
    for s in model.sites:
        mu, sd = guide.loc(s.name).detach(), guide.scale(s.name).detach()
        kl += (torch.log(0.3 / sd) + (sd**2 + mu**2) / (2 * 0.3**2) - 0.5).sum()
    assert torch.allclose(terms["kl"].detach(), kl, rtol=1e-13, atol=0)
    _all_f64(guide.sample_weights(3))
    assert predict(model, guide, digits.test.tensors, 4).mean.dtype == F64


def test_float64_network_gives_a_float64_mixture_dtype(f64_mean_field):
    model, _, structure, _ = f64_mean_field
    for name in ("means", "covariances", "outlier_loc", "inlier_points", "ellipse_alphas"):
        assert getattr(structure, name).dtype == F64, name
    guide = SharedGMMGuide(model, structure)
    # the guide's parameters are the mixture's, in float64 (not float32 round trips)
    assert guide.centre_mu.dtype == F64
    assert torch.equal(guide.centres()[:, 0].detach(), structure.means[:, 0])


@pytest.mark.parametrize("tying", ["representative", "stochastic", "tied"])
@pytest.mark.parametrize("prior", ["normal", "laplace", "pretrained"])
def test_float64_shared_gmm_terms_draws_and_hooks_dtype(f64_mean_field, digits, tying, prior):
    model, _, structure, loader = f64_mean_field
    if prior == "pretrained" and tying == "tied":
        pytest.skip("tied needs one prior for every weight of a site")
    if prior == "laplace":  # a Monte Carlo KL: the prior's log density at the draws
        model = BNNModel(model.net, prior=LaplacePrior(0.3), likelihood=model.likelihood)
    if prior == "pretrained":  # a different Normal per weight, made from float32 centres
        centres = {k: v.float() for k, v in model.initial_values().items()}
        prior_ = PretrainedPrior(centres, scale=0.05, delta=0.1)
        model = BNNModel(model.net, prior=prior_, likelihood=model.likelihood)
    guide = SharedGMMGuide(model, structure, tying=tying)
    for name, t in list(guide.named_parameters()) + list(guide.named_buffers()):
        assert t.dtype == F64 or not t.is_floating_point(), name
    x, y = digits.train.tensors[0][:32], digits.train.tensors[1][:32]
    _all_f64(DecomposedELBO().loss_terms(model, guide, x, y))
    _all_f64(guide.sample_weights(2))
    hooks = [MergeHook(tau_d=0.05, every=1), MahalanobisHook(every=1)]
    fit(model, guide, loader, epochs=1, lr=1e-2, callbacks=hooks, progress=False)
    assert guide.centre_mu.dtype == F64 and guide.ellipse_alphas.dtype == F64
    assert guide.structure().means.dtype == F64
    assert predict(model, guide, digits.test.tensors, 3).mean.dtype == F64


def test_float64_rank1_and_ssvi_dtype(digits):
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    x, y = digits.train.tensors[0][:16], digits.train.tensors[1][:16]
    for prior in ("normal", CauchyPrior(0.5)):
        model = Rank1BNNModel(MLP(64, (16,), 10).to(F64), prior=prior, likelihood=1000)
        guide = Rank1Guide(model)
        _all_f64(dict(guide.named_parameters()))
        _all_f64(DecomposedELBO().loss_terms(model, guide, x, y))
        fit(model, guide, loader, epochs=1, lr=1e-2, progress=False)
        assert predict(model, guide, digits.test.tensors, 2).mean.dtype == F64
    model = BNNModel(MLP(64, (16,), 10).to(F64), likelihood=1000)
    guide = SSVIGuide(model, density=0.2)
    _all_f64(dict(guide.named_parameters()))
    _all_f64(DecomposedELBO().loss_terms(model, guide, x, y))
    update = SubspaceUpdate(loader, update_every=1, move_fraction=0.5, stop_fraction=1.0)
    fit(model, guide, loader, epochs=2, lr=1e-2, callbacks=[update], progress=False)
    assert update.updates and update.updates[0]["moved"] > 0
    _all_f64(dict(guide.named_parameters()))  # the moved coordinates too
    assert predict(model, guide, digits.test.tensors, 2).mean.dtype == F64


def test_float64_model_file_round_trip_and_evaluate_dtype(f64_mean_field, digits, tmp_path):
    model, _, structure, _ = f64_mean_field
    guide = SharedGMMGuide(model, structure, tying="stochastic")
    path = tmp_path / "m.pt"
    spec = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [16], "num_classes": 10}}
    save_2dg(path, model, guide, network=spec)
    loaded, lguide = load_2dg(path)
    assert loaded.dtype == F64 and lguide.centre_mu.dtype == F64
    x = digits.test.tensors[0][:8]
    torch.manual_seed(3)
    a = torch.func.vmap(loaded.network_forward, in_dims=(0, None))(lguide.sample_weights(2), x)
    torch.manual_seed(3)
    b = torch.func.vmap(model.network_forward, in_dims=(0, None))(guide.sample_weights(2), x)
    assert a.dtype == F64 and torch.equal(a, b)
    metrics = evaluate_model_file(path, num_samples=3)
    assert 0.0 <= metrics["accuracy"] <= 1.0 and math.isfinite(metrics["nll"])
    report = diagnose_model_file(
        path, tmp_path / "diag", num_samples=5, khat_samples=30, max_train_examples=100
    )
    assert report["errors"] == {} and report["vi"]["n_examples"] == 100


# ---------------------------------------------------------------------------- pipeline
TINY = {
    "methods": ["deterministic", "mean_field", "2dg", "rank1", "ssvi"],
    "num_samples": 4,
    "progress": False,
    "network": {"hidden": [16], "dtype": "float64"},
    "stage1": {"epochs": 3, "deterministic_epochs": 2},
    "sharing": SMALL_SHARING,
    "stage3": {"epochs": 2, "merge_every": 1, "reassign_every": 1, "tying": "tied"},
    "rank1": {"epochs": 2, "components": 2},
    "ssvi": {"epochs": 2, "update_every": 1},
    "diagnostics": {"khat_samples": 30, "max_examples": 200},
}


def test_pipeline_float64_every_method_dtype(tmp_path, monkeypatch):
    """Every method of the pipeline trains float64 parameters and ends in float64."""
    import twodg_pyro.pipeline.methods.guide_row as alt

    seen = {}
    real_fit = alt.fit

    def spy(model, guide, *args, **kwargs):
        state = real_fit(model, guide, *args, **kwargs)
        seen[type(guide).__name__] = {p.dtype for p in guide.parameters()}
        return state

    monkeypatch.setattr(alt, "fit", spy)
    art = run(config_from_dict(TINY), tmp_path)
    assert seen == {"Rank1Guide": {F64}, "SSVIGuide": {F64}}
    assert {p.dtype for p in art.trained["mean_field"].guide.parameters()} == {F64}
    entry = art.trained["2dg"]
    assert {p.dtype for p in entry.guide.parameters()} == {F64}
    assert entry.structure.means.dtype == F64
    records = json.loads((tmp_path / "results.json").read_text())["records"]
    assert [r["method"] for r in records] == TINY["methods"]
    for r in records:
        assert all(math.isfinite(r[k]) for k in ("accuracy", "nll", "ece", "brier")), r
    model, guide = load_2dg(tmp_path / "model_2dg.pt")
    assert model.dtype == F64 and guide.tying == "tied"


def test_float64_checkpoint_resume_is_exact_dtype(tmp_path, interrupt_after):
    cfg = {**TINY, "methods": ["mean_field", "2dg"], "checkpoint_every": 1}
    cfg["diagnostics"] = {"enabled": False}
    run(config_from_dict(cfg), tmp_path / "ref")
    interrupt_after("stage3", 1)
    with pytest.raises(KeyboardInterrupt):
        run(config_from_dict(cfg), tmp_path / "r")
    interrupt_after(None)
    art = run(config_from_dict(cfg), tmp_path / "r", resume=True)
    assert art.trained["2dg"].guide.centre_mu.dtype == F64

    def metrics(folder):
        recs = json.loads((folder / "results.json").read_text())["records"]
        return [{k: r[k] for k in ("method", "accuracy", "nll", "ece")} for r in recs]

    assert metrics(tmp_path / "r") == metrics(tmp_path / "ref")


def test_network_dtype_setting_is_validated(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('methods = ["mean_field"]\n[network]\ndtype = "float64"\n')
    assert load_config(path).network.dtype == "float64"
    for bad in ("float16", "double", 64):
        with pytest.raises(ConfigError, match="network.dtype"):
            config_from_dict({"network": {"dtype": bad}})


# ---------------------------------------------------------------------------- devices
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_device_without_cuda_is_a_clear_error_before_anything_is_written(tmp_path):
    cfg = config_from_dict({**TINY, "device": "cuda"})
    with pytest.raises(ConfigError, match="CUDA is not available"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    from twodg_pyro.cli import main

    assert main(["evaluate", str(tmp_path / "none.pt"), "--device", "cuda"]) == 2


def test_distributed_backend_follows_the_run_device():
    from twodg_pyro.distributed.parallel import default_backend

    assert default_backend("cpu") == "gloo"  # even on a GPU machine: NCCL moves CUDA only
    expected = "nccl" if torch.cuda.is_available() else "gloo"
    assert default_backend("cuda") == expected


def test_inputs_follow_the_network_dtype_and_device():
    from twodg_pyro.bnn import match_input

    like = torch.zeros(2, dtype=F64)
    assert match_input(torch.ones(3), like).dtype == F64
    ids = torch.arange(3)
    assert match_input(ids, like) is ids  # integer inputs keep their dtype
    x = torch.ones(3, dtype=F64)
    assert match_input(x, like) is x


@pytest.mark.slow
def test_gpu_check_script_runs_on_the_cpu_device(tmp_path):
    """The device script's sections on the CPU at small sizes (no timings asserted)."""
    script = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
    cmd = [sys.executable, str(script), "--device", "cpu", "--quick", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    payload = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    for name, sec in payload["sections"].items():
        assert sec["status"] == "ok", (name, sec)
    assert set(payload["sections"]["float64"]["dtypes"].values()) == {"torch.float64"}
    assert payload["sections"]["resume"]["same_device_identical"]
    steps = payload["sections"]["steps"]["mlp_b32"]
    from gpu_check import CONTENDERS

    assert set(steps) == {*CONTENDERS, "ratios"}


def test_committed_float64_recipe_run_matches_float32():
    """``experiments/configs/lenet5_float{64,32}.toml``: the recommended LeNet-5 recipe run
    end to end in float64 (every method, the uncertainty evaluation) agrees with its
    float32 twin of the same seed within the run-to-run noise of one seed."""
    import json
    import statistics
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "experiments" / "results" / "float64"
    if not (root / "lenet5_f64.json").exists():
        pytest.skip("the float64 results are not committed")
    runs = {d: json.loads((root / f"lenet5_{d}.json").read_text()) for d in ("f32", "f64")}
    assert runs["f64"]["config"]["network"]["dtype"] == "float64"
    assert runs["f32"]["config"]["network"]["dtype"] == "float32"
    recs = {d: {r["method"]: r for r in run["records"]} for d, run in runs.items()}
    assert set(recs["f64"]) == set(recs["f32"]) == {"deterministic", "mean_field", "2dg"}
    for method, a in recs["f64"].items():
        b = recs["f32"][method]
        assert abs(a["accuracy"] - b["accuracy"]) <= 0.005, method
        assert abs(a["nll"] - b["nll"]) <= 0.02, method
        auroc = [statistics.fmean(v["entropy_auroc"] for v in r["ood"].values()) for r in (a, b)]
        assert abs(auroc[0] - auroc[1]) <= 0.01 and min(auroc) > 0.9, method
