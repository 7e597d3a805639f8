"""ArviZ export, VI diagnostics, figures, the evaluate/diagnose commands and the run's
artifacts, on a small 64-16-10 BNN trained briefly on the bundled digits."""

from __future__ import annotations

import json
import math

import numpy as np
import pyro
import pytest
import torch

from twodg_pyro import diagnostics as D
from twodg_pyro.cli import main
from twodg_pyro.data import make_loader
from twodg_pyro.diagnostics.arviz_export import _component_marginals, _mixture_log_prob
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.infer import fit
from twodg_pyro.io import load_2dg, save_2dg
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.model import BNNModel
from twodg_pyro.models import MLP
from twodg_pyro.pipeline import SharingConfig, config_from_dict
from twodg_pyro.pipeline import run as run_pipeline
from twodg_pyro.sharing import build_sharing

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
S = 12  # draws exported in these tests


@pytest.fixture(scope="module")
def small(digits):
    """A 64-16-10 mean-field BNN (20 epochs), its sharing structure, a shared-GMM guide
    trained 2 epochs: dict with model, mf_guide, mf_state, structure, guide, state."""
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    model = BNNModel(MLP(64, (16,), 10), prior=1.0, likelihood=Categorical(len(digits.train)))
    mf = MeanFieldGuide(model, seed=0)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    mf_state = fit(model, mf, loader, epochs=20, lr=1e-2, progress=False)
    cfg = SharingConfig(
        outlier_rule="quantile",
        mu_quantile=0.99,
        grad_percentile=0.005,
        n_components=8,
        n_min=5,
    )
    structure, report = build_sharing(model, mf, loader, cfg, seed=0)
    guide = SharedGMMGuide(model, structure)
    state = fit(model, guide, loader, epochs=2, lr=1e-2, progress=False)
    return {
        "model": model,
        "mf_guide": mf,
        "mf_state": mf_state,
        "structure": structure,
        "report": report,
        "guide": guide,
        "state": state,
    }


def _is_png(path) -> bool:
    data = open(path, "rb").read()
    return len(data) > 1000 and data[:8] == PNG_MAGIC


# ---------------------------------------------------------------------------- InferenceData
def test_inference_data_groups_shapes_and_round_trip(small, digits, tmp_path):
    model, guide = small["model"], small["guide"]
    x, y = digits.test.tensors
    st = guide.structure()
    idata = D.to_inference_data(model, guide, (x, y), num_samples=S, n_weights=50, seed=3)
    assert set(idata.groups()) == {
        "posterior",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
        "constant_data",
    }
    post, N, K = idata.posterior, len(y), st.n_gaussians
    assert post.sizes["chain"] == 1 and post.sizes["draw"] == S
    assert post["w"].shape == (1, S, 50)
    assert post["centre"].shape == (1, S, K, 2)
    assert post["covariance"].shape == (1, S, K, 2, 2)
    assert post["component_count"].shape == (1, S, K)
    n_o = min(50, st.n_outliers)
    assert post["outlier_loc"].shape == post["outlier_scale"].shape == (1, S, n_o)
    assert list(post["coord"].values) == ["mu", "sigma"]
    # variational parameters are constant over draws, the weights are not
    spread = post.max("draw") - post.min("draw")
    assert float(spread["centre"].max()) == 0.0 and float(spread["covariance"].max()) == 0.0
    assert float(spread["w"].min()) > 0.0
    assert idata.posterior_predictive["y"].shape == (1, S, N)
    assert idata.posterior_predictive["class_probs"].shape == (1, S, N, 10)
    assert idata.log_likelihood["y"].shape == (1, S, N)
    assert idata.observed_data["y"].shape == (N,)
    assert np.array_equal(idata.observed_data["y"].values, y.numpy())
    assert idata.constant_data["weight_kind"].shape == (50,)
    # the log-likelihood is the log class probability of the label under the same draw
    probs = idata.posterior_predictive["class_probs"].values[0]
    ll = idata.log_likelihood["y"].values[0]
    picked = np.take_along_axis(probs, y.numpy()[None, :, None], -1)[..., 0]
    np.testing.assert_allclose(ll, np.log(picked), rtol=1e-4, atol=1e-5)
    # seeded: the same seed gives the same draws, and the caller's RNG is left alone
    before = torch.get_rng_state()
    again = D.to_inference_data(model, guide, (x, y), num_samples=S, n_weights=50, seed=3)
    assert torch.equal(before, torch.get_rng_state())
    np.testing.assert_array_equal(again.posterior["w"].values, post["w"].values)

    path = D.save_inference_data(idata, tmp_path / "sub" / "idata.nc")
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["idata.nc"]
    back = D.load_inference_data(path)
    assert set(back.groups()) == set(idata.groups())
    np.testing.assert_array_equal(back.posterior["w"].values, post["w"].values)
    assert json.loads(back.attrs["counts"])["n_gaussians"] == K


def test_inference_data_of_mean_field_and_tied_guides(small, digits):
    model = small["model"]
    x, y = (t[:64] for t in digits.test.tensors)
    mf = D.to_inference_data(model, small["mf_guide"], (x, y), num_samples=6, n_weights=20)
    assert mf.posterior["w"].shape == (1, 6, 20)
    assert "centre" not in mf.posterior
    assert mf.constant_data["weight_scale"].shape == (20,)

    st = small["structure"]
    tied = SharedGMMGuide(model, st, tying="tied")
    idata = D.to_inference_data(model, tied, (x, y), num_samples=6, n_weights=2000)
    z = idata.posterior["component_value"]
    assert z.shape == (1, 6, st.n_gaussians)
    # a plain inlier of component k takes the value z_k of the same draw
    kind = idata.constant_data["weight_kind"].values
    comp = idata.constant_data["weight_component"].values
    w = idata.posterior["w"].values[0]
    plain = np.flatnonzero(kind == 1)
    np.testing.assert_allclose(w[:, plain], z.values[0][:, comp[plain]])


# ---------------------------------------------------------------------------- k-hat, LOO
def test_khat_is_finite_for_each_guide(small, digits):
    model, train = small["model"], digits.train.tensors
    for guide, method in ((small["mf_guide"], "exact"), (small["guide"], "exact")):
        res = D.vi_diagnostics(model, guide, train, num_samples=40, seed=0)
        assert math.isfinite(res["khat"]) and res["log_q_method"] == method
        assert res["khat_assessment"] in ("good", "ok", "unreliable")
        assert res["n_examples"] == len(digits.train) and res["loglik_scale"] == 1.0
        assert math.isfinite(res["elbo"]) and 1.0 <= res["ess"] <= 40
    for tying, method in (("stochastic", "quadrature"), ("tied", "marginal_product")):
        guide = SharedGMMGuide(model, small["structure"], tying=tying)
        res = D.vi_diagnostics(model, guide, train, num_samples=25, seed=0, max_examples=300)
        assert math.isfinite(res["khat"]) and res["log_q_method"] == method
        assert res["exact"] is (method == "quadrature")
        assert res["loglik_scale"] == pytest.approx(len(digits.train) / 300)


def test_stochastic_marginal_matches_the_guide_draws(small):
    """The Gauss-Hermite marginal q_c(w) of the stochastic tying against the empirical
    distribution of the guide's own draws of the plain inliers of each component: the
    Kolmogorov-Smirnov statistic sqrt(n) D (on a grid of order statistics) stays below
    2.0 (p < 5e-4 per component)."""
    guide = SharedGMMGuide(small["model"], small["structure"], tying="stochastic")
    log_w, mean, sd, method = _component_marginals(guide, 64)
    assert method == "quadrature"
    torch.manual_seed(0)
    with torch.no_grad():
        flat = guide.sample_weights(2000)
        flat = torch.cat([flat[s.name].reshape(2000, -1) for s in guide.sites], 1)
        for k in range(guide.n_components):
            members = guide.plain_index[guide.plain_component == k]
            if members.numel() < 20:
                continue
            w = flat[:, members].reshape(-1).double().sort().values
            n = w.numel()
            at = torch.linspace(0, n - 1, 257).long()  # the CDFs compared at 257 order statistics
            normal = torch.distributions.Normal(mean[k].double(), sd[k].double())
            cdf = (log_w[k].double().exp() * normal.cdf(w[at, None])).sum(-1)
            ks = float(((at + 1).double() / n - cdf).abs().max()) * math.sqrt(n)
            assert ks < 2.0, (k, ks)
    # the per-weight mixture evaluation agrees with the component table
    table = (log_w[0] - sd[0].log() - 0.5 * math.log(2 * math.pi), mean[0], 1 / sd[0])
    x = mean[0, :1] + torch.linspace(-1, 1, 5)[:, None] * sd[0, :1]
    direct = torch.logsumexp(log_w[0] + torch.distributions.Normal(mean[0], sd[0]).log_prob(x), -1)
    got = _mixture_log_prob(x.T, tuple(t[None].expand(5, -1) for t in table))[0]
    torch.testing.assert_close(got, direct)


def test_loo_and_summary(small, digits):
    idata = D.to_inference_data(
        small["model"], small["guide"], digits.test.tensors, num_samples=S, n_weights=10
    )
    res = D.loo(idata)
    assert math.isfinite(res["elpd_loo"]) and res["elpd_loo"] < 0
    assert res["n_samples"] == S and res["n_data_points"] == len(digits.test)
    table = D.summary(idata)
    assert {"mean", "sd", "ess_bulk"} <= set(table.columns)
    assert sum(i.startswith("w[") for i in table.index) == 10


# ---------------------------------------------------------------------------- figures
def test_each_plot_is_a_png(small, digits, tmp_path):
    probs = torch.softmax(torch.randn(200, 10), -1)
    labels = torch.randint(0, 10, (200,))
    paths = [
        D.plot_sharing_plane(small["guide"], tmp_path / "plane.png"),
        D.plot_sharing_plane(small["structure"], tmp_path / "plane_s.png", max_points=100),
        D.plot_reliability(probs, labels, tmp_path / "rel.png"),
        D.plot_elbo_terms(small["state"].history, tmp_path / "elbo.png"),
        D.plot_elbo_terms(
            {"stage 1": small["mf_state"].history, "stage 3": []}, tmp_path / "elbo2.png"
        ),
        D.plot_merges([], tmp_path / "none.png"),
        D.plot_merges(
            [{"epoch": 0, "before": 8, "after": 6}, {"epoch": 1, "before": 6, "after": 6}],
            tmp_path / "merges.png",
            stage2=small["report"],
        ),
    ]
    for p in paths:
        assert _is_png(p), p


# ---------------------------------------------------------------------------- commands
def _spec() -> dict:
    return {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [16], "num_classes": 10}}


def test_evaluate_and_diagnose_a_saved_model(small, digits, tmp_path, capsys):
    path = tmp_path / "model_2dg.pt"
    save_2dg(path, small["model"], small["guide"], network=_spec())
    out = tmp_path / "metrics.json"
    assert main(["evaluate", str(path), "--num-samples", "5", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.split("\nwrote")[0])
    saved = json.loads(out.read_text())
    assert printed == saved
    assert saved["n_examples"] == len(digits.test) and saved["num_samples"] == 5
    for key in ("accuracy", "nll", "ece", "brier"):
        assert math.isfinite(saved[key])
    assert 0.5 < saved["accuracy"] <= 1.0

    folder = tmp_path / "diag"
    args = ["diagnose", str(path), "--out", str(folder), "--num-samples", "8"]
    assert main(args + ["--khat-samples", "25", "--n-weights", "30"]) == 0
    report = json.loads((folder / "diagnostics.json").read_text())
    assert report["errors"] == {}
    assert math.isfinite(report["vi"]["khat"]) and math.isfinite(report["loo"]["elpd_loo"])
    for name in ("sharing_plane.png", "reliability.png"):
        assert _is_png(folder / name)
    assert (folder / "posterior_summary.csv").read_text().startswith(",mean,sd")
    idata = D.load_inference_data(folder / "inference_data.nc")
    assert idata.posterior["w"].shape == (1, 8, 30)

    assert main(["evaluate", str(tmp_path / "missing.pt")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_run_writes_model_inference_data_and_plots(tmp_path):
    cfg = config_from_dict(
        {
            "methods": ["2dg"],
            "num_samples": 5,
            "progress": False,
            "network": {"hidden": [16]},
            "stage1": {"epochs": 3},
            "sharing": {
                "outlier_rule": "quantile",
                "mu_quantile": 0.99,
                "grad_percentile": 0.005,
                "n_components": 8,
                "n_min": 5,
            },
            "stage3": {"epochs": 2, "merge_every": 1},
        }
    )
    out = tmp_path / "run"
    art = run_pipeline(cfg, out)
    report = json.loads((out / "diagnostics.json").read_text())
    assert report["errors"] == {} and report["method"] == "2dg"
    assert math.isfinite(report["vi"]["khat"])
    for name in ("sharing_plane.png", "reliability.png", "elbo_terms.png", "merges.png"):
        assert _is_png(out / name), name
    idata = D.load_inference_data(out / "inference_data.nc")
    assert idata.posterior["w"].shape[:2] == (1, 5)
    # the model file rebuilds its network from the stored spec and predicts the same
    model, guide = load_2dg(out / "model_2dg.pt")
    trained = art.extras["2dg"]["guide"]
    x = art.split.test.tensors[0][:16]
    torch.manual_seed(1)
    a = torch.func.vmap(model.network_forward, in_dims=(0, None))(guide.sample_weights(3), x)
    torch.manual_seed(1)
    ref_model = art.extras["2dg"]["model"]
    b = torch.func.vmap(ref_model.network_forward, in_dims=(0, None))(trained.sample_weights(3), x)
    torch.testing.assert_close(a, b)
