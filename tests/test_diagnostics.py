"""ArviZ export, VI diagnostics, figures, the evaluate/diagnose commands and the run's
artifacts, on a small 64-16-10 BNN trained briefly on the bundled digits."""

from __future__ import annotations

import json
import math

import numpy as np
import pyro
import pytest
import torch
from conftest import ARVIZ_GROUPS, SMALL_SHARING

from twodg_pyro import diagnostics as D
from twodg_pyro.bnn import BNNModel
from twodg_pyro.cli import main
from twodg_pyro.data import make_loader
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.guides.marginal_density import component_marginals, mixture_log_prob
from twodg_pyro.infer import fit
from twodg_pyro.io import load_2dg, save_2dg
from twodg_pyro.likelihoods import Categorical
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
    structure, report = build_sharing(model, mf, loader, SharingConfig(**SMALL_SHARING), seed=0)
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
SITES = ["layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"]


def test_inference_data_groups_shapes_and_round_trip(small, digits, tmp_path):
    model, guide = small["model"], small["guide"]
    x, y = digits.test.tensors
    st = guide.structure()
    idata = D.to_inference_data(model, guide, (x, y), S, seed=3)
    assert set(D.group_names(idata)) == ARVIZ_GROUPS
    post, N, K = D.group(idata, "posterior"), len(y), st.n_gaussians
    assert post.sizes["chain"] == 1 and post.sizes["draw"] == S
    # one posterior variable per Pyro site, named as the site, with named dims (and a
    # weight tied to each component)
    assert list(post.data_vars) == SITES + ["component_value"]
    assert post["layers.0.weight"].dims == (
        "chain",
        "draw",
        "layers.0.weight_out",
        "layers.0.weight_in",
    )
    assert post["layers.0.weight"].shape == (1, S, 16, 64)
    assert post["layers.2.bias"].dims == ("chain", "draw", "layers.2.bias_out")
    assert float((post.max("draw") - post.min("draw"))["layers.0.weight"].max()) > 0.0
    # the sharing structure is a group of its own, not posterior variables
    const = D.group(idata, "sharing")
    assert const["centre"].shape == (K, 2) and const["covariance"].shape == (K, 2, 2)
    assert const["component_count"].shape == (K,)
    assert const["outlier_loc"].shape == const["outlier_scale"].shape == (st.n_outliers,)
    assert list(const["coord"].values) == ["mu", "sigma"]
    kinds = np.concatenate([const[f"{n}.kind"].values.reshape(-1) for n in SITES])
    assert (kinds == 0).sum() == st.n_outliers and (kinds == 2).sum() == st.n_ellipses
    assert idata.posterior_predictive["y"].shape == (1, S, N)
    assert idata.posterior_predictive["class_probs"].shape == (1, S, N, 10)
    assert idata.log_likelihood["y"].shape == (1, S, N)
    assert idata.log_likelihood["y"].dtype == np.float64
    assert idata.observed_data["y"].shape == (N,)
    assert np.array_equal(idata.observed_data["y"].values, y.numpy())
    # the log-likelihood is the log class probability of the label under the same draw
    probs = idata.posterior_predictive["class_probs"].values[0]
    ll = idata.log_likelihood["y"].values[0]
    picked = np.take_along_axis(probs, y.numpy()[None, :, None], -1)[..., 0]
    np.testing.assert_allclose(ll, np.log(picked), rtol=1e-4, atol=1e-5)
    # metadata on every group, not only on idata.attrs
    for group in D.group_names(idata):
        attrs = D.group(idata, group).attrs
        assert attrs["method"] == "2dg" and attrs["tying"] == "representative", group
        assert attrs["seed"] == 3 and attrs["num_draws"] == S and attrs["guide"] == "SharedGMMGuide"
        assert attrs["inference_library"] == "pyro" and attrs["creation_library"] == "twodg_pyro"
    # seeded: the same seed gives the same draws, and the caller's RNG is left alone
    before = torch.get_rng_state()
    again = D.to_inference_data(model, guide, (x, y), S, seed=3)
    assert torch.equal(before, torch.get_rng_state())
    np.testing.assert_array_equal(
        again.posterior["layers.0.weight"].values, post["layers.0.weight"].values
    )

    path = D.save_inference_data(idata, tmp_path / "sub" / "idata.nc")
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["idata.nc"]
    back = D.load_inference_data(path)
    assert set(D.group_names(back)) == set(D.group_names(idata))
    np.testing.assert_array_equal(
        back.posterior["layers.0.weight"].values, post["layers.0.weight"].values
    )
    assert back.posterior["layers.0.weight"].dims == post["layers.0.weight"].dims
    assert json.loads(back.posterior.attrs["counts"])["n_gaussians"] == K
    assert back.log_likelihood.attrs["method"] == "2dg"


def test_export_draws_are_the_seeded_prediction_draws(small, digits):
    """The exported class probabilities average to the prediction of the evaluation with
    the same seed and number of draws (the results table's)."""
    from twodg_pyro.evaluation import seeded_predict

    x, y = digits.test.tensors
    for guide in (small["mf_guide"], small["guide"]):
        idata = D.to_inference_data(small["model"], guide, (x, y), 23, seed=5)
        probs, labels = D.class_probabilities(idata)
        pred = seeded_predict(small["model"], guide, (x, y), 23, seed=5)
        np.testing.assert_allclose(probs, pred.mean.numpy(), rtol=0, atol=1e-6)
        assert np.array_equal(labels, pred.targets.numpy())


def test_thinning_keeps_named_dims_and_original_indices(small, digits):
    model, guide = small["model"], small["mf_guide"]
    xy = tuple(t[:50] for t in digits.test.tensors)
    full = D.to_inference_data(model, guide, xy, 4, seed=1, max_site_values=None)
    thin = D.to_inference_data(model, guide, xy, 4, seed=1, max_site_values=100)
    w = thin.posterior["layers.0.weight"]  # (16, 64) thinned to a sub-grid of <= 100
    assert w.sizes["layers.0.weight_out"] * w.sizes["layers.0.weight_in"] <= 100
    assert w.sizes["layers.0.weight_out"] == 10 and w.sizes["layers.0.weight_in"] == 10
    rows = w["layers.0.weight_out"].values
    cols = w["layers.0.weight_in"].values
    assert np.all(np.diff(rows) > 0) and rows.max() < 16 and cols.max() < 64
    # the same draws, read at the kept coordinates
    ref = full.posterior["layers.0.weight"].sel(
        {"layers.0.weight_out": rows, "layers.0.weight_in": cols}
    )
    np.testing.assert_array_equal(w.values, ref.values)
    np.testing.assert_array_equal(
        thin.constant_data["layers.0.weight.loc"].values,
        guide.loc("layers.0.weight").detach().numpy()[np.ix_(rows, cols)],
    )
    assert thin.posterior["layers.0.bias"].shape == (1, 4, 16)  # small sites stay whole
    assert json.loads(thin.posterior.attrs["thinned_sites"]) == [
        "layers.0.weight",
        "layers.2.weight",
    ]
    # a 3x3 kernel is kept whole while the channels are thinned
    grid = D.thinned_coordinates((64, 32, 3, 3), 1000, seed=0)
    assert [len(g) for g in grid][2:] == [3, 3] and np.prod([len(g) for g in grid]) <= 1000
    assert D.thinned_coordinates((4, 4), 100, seed=0) is None


def test_log_likelihood_is_stable_where_float32_saturates():
    """A logit gap of 20 makes float32 log_softmax exactly 0; the export keeps
    log p = -log(1 + e^-20) ~ -2.06e-9 (float64)."""
    from torch import nn

    net = nn.Sequential(nn.Linear(2, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[20.0, 0.0], [0.0, 0.0]]))
        net[0].bias.zero_()
    model = BNNModel(net, prior=1.0, likelihood=Categorical(4))
    guide = MeanFieldGuide(model, init_scale=1e-9)
    x, y = torch.tensor([[1.0, 0.0]] * 3), torch.zeros(3, dtype=torch.long)
    assert float(torch.log_softmax(torch.tensor([20.0, 0.0]), -1)[0]) == 0.0  # the problem
    idata = D.to_inference_data(model, guide, (x, y), 30, seed=0)
    ll = idata.log_likelihood["y"].values
    assert np.all(ll < 0)
    np.testing.assert_allclose(ll, -np.log1p(np.exp(-20.0)), rtol=1e-5)


def test_regression_export_has_one_log_likelihood_per_example():
    """A Gaussian likelihood: pointwise log N(y_n | f_w(x_n), scale^2) of the same draws."""
    from torch import nn

    from twodg_pyro.evaluation import seeded
    from twodg_pyro.likelihoods import Gaussian

    torch.manual_seed(0)
    x = torch.randn(120, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(120)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    model = BNNModel(net, prior=1.0, likelihood=Gaussian(120, 0.1))
    guide = MeanFieldGuide(model)
    fit(model, guide, [(x, y)], epochs=100, lr=1e-2, progress=False)
    idata = D.to_inference_data(model, guide, (x, y), 20, seed=2)
    assert idata.log_likelihood["y"].shape == idata.posterior_predictive["y"].shape == (1, 20, 120)
    assert "class_probs" not in idata.posterior_predictive
    with torch.no_grad(), seeded(2):
        draws = [guide.sample_weights(10) for _ in range(2)]
    f = torch.cat([torch.func.vmap(model.network_forward, in_dims=(0, None))(w, x) for w in draws])
    expected = torch.distributions.Normal(f.squeeze(-1).double(), 0.1).log_prob(y.double())
    np.testing.assert_allclose(idata.log_likelihood["y"].values[0], expected.numpy(), atol=1e-9)
    assert math.isfinite(D.loo(idata)["elpd_loo"])


def test_inference_data_of_mean_field_and_tied_guides(small, digits):
    model = small["model"]
    x, y = (t[:64] for t in digits.test.tensors)
    mf = D.to_inference_data(model, small["mf_guide"], (x, y), 6)
    assert mf.posterior["layers.0.weight"].shape == (1, 6, 16, 64)
    assert "centre" not in mf.constant_data and mf.posterior.attrs["method"] == "mean_field"
    assert mf.constant_data["layers.0.weight.scale"].shape == (16, 64)

    st = small["structure"]
    tied = SharedGMMGuide(model, st, tying="tied")
    idata = D.to_inference_data(model, tied, (x, y), 6)
    z = idata.posterior["component_value"]
    assert z.shape == (1, 6, st.n_gaussians)
    # a plain inlier of component k takes the value z_k of the same draw
    sharing = D.group(idata, "sharing")
    for name in SITES:
        kind = sharing[f"{name}.kind"].values.reshape(-1)
        comp = sharing[f"{name}.component"].values.reshape(-1)
        w = idata.posterior[name].values[0].reshape(6, -1)
        plain = np.flatnonzero(kind == 1)
        np.testing.assert_allclose(w[:, plain], z.values[0][:, comp[plain]])


def test_rank1_and_ssvi_export_and_khat(digits):
    from twodg_pyro.guides import Rank1BNNModel, Rank1Guide, SSVIGuide

    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    xy = tuple(t[:80] for t in digits.test.tensors)
    r1 = Rank1BNNModel(MLP(64, (16,), 10), likelihood=Categorical(len(digits.train)), components=3)
    rg = Rank1Guide(r1)
    fit(r1, rg, loader, epochs=2, lr=1e-2, progress=False)
    idata = D.to_inference_data(r1, rg, xy, 10, seed=0)
    assert idata.posterior["layers.0.r"].dims == (
        "chain",
        "draw",
        "layers.0.r_component",
        "layers.0.r_out",
    )
    assert idata.posterior["layers.0.s"].shape == (1, 10, 3, 64)
    assert (
        idata.posterior.attrs["method"] == "rank1"
        and idata.posterior.attrs["output_components"] == 3
    )
    from twodg_pyro.evaluation import seeded_predict

    probs, _ = D.class_probabilities(idata)
    np.testing.assert_allclose(probs, seeded_predict(r1, rg, xy, 10, 0).mean.numpy(), atol=1e-6)
    res = D.vi_diagnostics(r1, rg, digits.train.tensors, num_samples=30, max_examples=200)
    assert math.isfinite(res["khat"]) and res["exact"] and "ensemble" in res["target"]

    model = BNNModel(MLP(64, (16,), 10), prior=1.0, likelihood=Categorical(len(digits.train)))
    sv = SSVIGuide(model, density=0.25)
    fit(model, sv, loader, epochs=2, lr=1e-2, progress=False)
    idata = D.to_inference_data(model, sv, xy, 10, seed=0)
    active = idata.constant_data["layers.0.weight.active"].values
    w = idata.posterior["layers.0.weight"].values
    assert active.mean() == pytest.approx(0.25, abs=0.01) and np.all(w[..., ~active] == 0)
    res = D.vi_diagnostics(model, sv, digits.train.tensors, num_samples=30, max_examples=200)
    assert math.isfinite(res["khat"]) and "subspace" in res["target"]


def test_autoguides_are_refused_with_what_to_use(small, digits):
    from pyro.infer.autoguide import AutoNormal

    guide = AutoNormal(small["model"])
    for call in (
        lambda: D.to_inference_data(small["model"], guide, digits.test.tensors, 5),
        lambda: D.vi_diagnostics(small["model"], guide, digits.train.tensors, 25),
    ):
        with pytest.raises(TypeError, match="Pyro autoguide .*AutoNormal.*MeanFieldGuide"):
            call()


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
        res = D.vi_diagnostics(model, guide, train, num_samples=30, seed=0, max_examples=300)
        assert math.isfinite(res["khat"]) and res["log_q_method"] == method
        assert res["exact"] is (method == "quadrature")
        assert res["loglik_scale"] == pytest.approx(len(digits.train) / 300)


def test_stochastic_marginal_matches_the_guide_draws(small):
    """The Gauss-Hermite marginal q_c(w) of the stochastic tying against the empirical
    distribution of the guide's own draws of the plain inliers of each component: the
    Kolmogorov-Smirnov statistic sqrt(n) D (on a grid of order statistics) stays below
    2.0 (p < 5e-4 per component)."""
    guide = SharedGMMGuide(small["model"], small["structure"], tying="stochastic")
    log_w, mean, sd, method = component_marginals(guide, 64)
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
    got = mixture_log_prob(x.T, tuple(t[None].expand(5, -1) for t in table))[0]
    torch.testing.assert_close(got, direct)


def test_loo_compare_plot_ppc_and_summary(small, digits, tmp_path):
    """What an ArviZ user does with our output, on either ArviZ major: PSIS-LOO (ArviZ's
    own object too), compare across methods, the PPC, the summary."""
    from twodg_pyro.diagnostics import _arviz as A

    xy = digits.test.tensors
    idata = D.to_inference_data(small["model"], small["guide"], xy, 30)
    mf = D.to_inference_data(small["model"], small["mf_guide"], xy, 30)
    res = D.loo(idata)
    assert math.isfinite(res["elpd_loo"]) and res["elpd_loo"] < 0 and math.isfinite(res["se"])
    assert res["n_samples"] == 30 and res["n_data_points"] == len(digits.test)
    direct = A.elpd_fields(D.loo_data(idata))
    assert direct["elpd"] == pytest.approx(res["elpd_loo"])
    table = D.compare({"2dg": idata, "mean_field": mf})
    assert set(table.index) == {"2dg", "mean_field"} and table["rank"].min() == 0
    elpd = "elpd" if D.DATATREE else "elpd_loo"
    assert np.all(np.isfinite(table[elpd].values.astype(float)))
    other = D.to_inference_data(small["model"], small["mf_guide"], tuple(t[:50] for t in xy), 30)
    with pytest.raises(ValueError, match="other observations"):
        D.compare({"2dg": idata, "mean_field": other})
    assert _is_png(D.plot_class_ppc(idata, tmp_path / "ppc.png", num_samples=10))
    summary = D.summary(idata, var_names=["layers.2.bias"])
    assert {"mean", "sd", "ess_bulk"} <= set(summary.columns)
    assert list(summary.index) == [f"layers.2.bias[{i}]" for i in range(10)]
    n_components = D.group(idata, "posterior").sizes["component"]
    assert D.summary(idata, kind="stats").shape[0] == 16 * 64 + 16 + 10 * 16 + 10 + n_components


def test_loo_reports_nan_and_inf_without_failing(small, digits):
    """Three draws cannot fit a Pareto tail: k-hat is inf and the numbers may be NaN; loo
    returns them as floats, and constant observations are counted."""
    idata = D.to_inference_data(small["model"], small["guide"], digits.test.tensors, 3)
    res = D.loo(idata)
    assert res["max_pareto_k"] == math.inf
    assert res["n_inf_k"] + res["n_constant"] == len(digits.test)
    assert isinstance(res["elpd_loo"], float)


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
    assert saved["method"] == "2dg" and saved["seed"] == 0
    for key in ("accuracy", "nll", "ece", "brier"):
        assert math.isfinite(saved[key])
    assert 0.5 < saved["accuracy"] <= 1.0

    folder = tmp_path / "diag"
    args = ["diagnose", str(path), "--out", str(folder), "--num-samples", "8"]
    flags = ["--khat-samples", "30", "--max-site-values", "30", "--khat-components", "1"]
    assert main(args + flags) == 0
    report = json.loads((folder / "diagnostics.json").read_text())
    assert report["errors"] == {} and report["method"] == "2dg"
    assert math.isfinite(report["vi"]["khat"]) and math.isfinite(report["loo"]["elpd_loo"])
    kinds = [b["kind"] for b in report["vi"]["blocks"]["blocks"]]  # one component asked for
    assert kinds.count("component") == 1 and "layer" in kinds
    assert "2dg: accuracy" in capsys.readouterr().out
    # diagnose's metrics are evaluate's with the same draws
    assert main(["evaluate", str(path), "--num-samples", "8"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert report["metrics"] == {k: again[k] for k in ("accuracy", "nll", "ece", "brier")}
    for name in ("sharing_plane.png", "reliability.png"):
        assert _is_png(folder / name)
    assert (folder / "posterior_summary.csv").read_text().startswith(",mean,sd")
    idata = D.load_inference_data(folder / "inference_data_2dg.nc")
    assert idata.posterior["layers.0.weight"].shape == (1, 8, 5, 6)  # 30 values: 5 x 6

    assert main(["evaluate", str(tmp_path / "missing.pt")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_diagnose_prints_nan_and_inf_without_failing(small, tmp_path, capsys):
    """Three draws: PSIS-LOO's k-hat is inf and its numbers may be NaN; diagnose and its
    report print them (\"nan\", \"inf\") instead of failing on a format code."""
    from twodg_pyro.cli import _num

    path = tmp_path / "model_2dg.pt"
    save_2dg(path, small["model"], small["guide"], network=_spec())
    args = ["diagnose", str(path), "--out", str(tmp_path / "d"), "--num-samples", "3"]
    assert main(args + ["--khat-samples", "30", "--max-examples", "200", "--no-khat-blocks"]) == 0
    out = capsys.readouterr().out
    assert "PSIS-LOO elpd = " in out and "max Pareto k inf" in out
    report = json.loads((tmp_path / "d" / "diagnostics.json").read_text())
    assert report["loo"]["max_pareto_k"] == "inf"  # JSON has no inf: written as a string
    assert report["vi"]["blocks"] == {"skipped": "not asked for (khat_components=None)"}
    assert [_num(v, ".2f") for v in (math.nan, math.inf, "nan", "inf", None, 1.234)] == [
        "nan",
        "inf",
        "nan",
        "inf",
        "None",
        "1.23",
    ]


def test_report_formats_nan_and_inf(tmp_path, capsys):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    records = [
        {"method": "mean_field", "accuracy": 0.9, "nll": float("nan"), "ece": "inf"},
        {"method": "2dg", "accuracy": float("inf"), "nll": "nan", "ece": None},
    ]
    (run_dir / "results.json").write_text(
        json.dumps({"schema": 1, "config": {}, "records": records})
    )
    assert main(["report", str(run_dir)]) == 0
    table = capsys.readouterr().out
    assert "| mean_field | 0.9000 | nan | inf |" in table and "| 2dg | inf | nan | - |" in table


TINY_RUN = {
    "methods": ["deterministic", "mean_field", "2dg"],
    "num_samples": 30,
    "progress": False,
    "network": {"hidden": [16]},
    "stage1": {"epochs": 3, "deterministic_epochs": 2},
    "sharing": SMALL_SHARING,
    "stage3": {"epochs": 2, "merge_every": 1},
    "diagnostics": {"khat_samples": 30},
}


def test_one_model_one_set_of_numbers(tmp_path, capsys):
    """results.json/md, diagnostics.json (and the figure drawn from the same prediction)
    and `evaluate` on each model file give the same metrics: the same seeded draws on the
    same examples."""
    # a budget that exports every test example (test_diagnostics_budget covers subsets)
    cfg = config_from_dict(
        {**TINY_RUN, "seed": 3, "diagnostics": {"khat_samples": 30, "budget": 100.0}}
    )
    out = tmp_path / "run"
    art = run_pipeline(cfg, out)
    capsys.readouterr()  # the printed table
    results = json.loads((out / "results.json").read_text())
    report = json.loads((out / "diagnostics.json").read_text())
    assert (
        results["evaluation"]
        == report["draws"]
        == {
            "num_samples": 30,
            "seed": 3,
            "sample_chunk": 10,
            "n_examples": len(art.split.test),
            "split": "test",
        }
    )
    assert (
        "N_s = 30 posterior draws seeded with 3 on the 359 test" in (out / "results.md").read_text()
    )
    keys = ("accuracy", "nll", "ece", "brier")
    for record in results["records"]:
        method = record["method"]
        if method == "deterministic":
            continue
        table = {k: record[k] for k in keys}
        assert report["methods"][method]["metrics"] == table, method
        # the InferenceData holds the same draws: its model average gives the same numbers
        idata = D.load_inference_data(out / f"inference_data_{method}.nc")
        probs, labels = D.class_probabilities(idata)
        from twodg_pyro.metrics import classification_metrics

        again = classification_metrics(torch.as_tensor(probs), torch.as_tensor(labels))
        for k in keys:
            assert again[k] == pytest.approx(table[k], abs=1e-6), (method, k)
        # `evaluate` on the model file, with its defaults (the run's seed, draws, data)
        assert main(["evaluate", str(out / f"model_{method}.pt")]) == 0
        evaluated = json.loads(capsys.readouterr().out)
        assert {k: evaluated[k] for k in keys} == table, method
        assert evaluated["seed"] == 3 and evaluated["recorded_metrics"] == table
    assert report["metrics"] == report["methods"]["2dg"]["metrics"]
    assert _is_png(out / "reliability.png")
    assert [r["method"] for r in report["compare"]] and {
        r["method"] for r in report["compare"]
    } == {"mean_field", "2dg"}
    # another seed gives other draws, and says so
    assert main(["evaluate", str(out / "model_2dg.pt"), "--seed", "4"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert other["seed"] == 4 and "recorded_metrics" not in other


def test_run_writes_model_inference_data_and_plots(tmp_path):
    cfg = config_from_dict(
        {**TINY_RUN, "methods": ["2dg"], "num_samples": 5, "stage1": {"epochs": 3}}
    )
    out = tmp_path / "run"
    art = run_pipeline(cfg, out)
    report = json.loads((out / "diagnostics.json").read_text())
    assert report["errors"] == {} and report["method"] == "2dg"
    assert math.isfinite(report["vi"]["khat"])
    for name in ("sharing_plane.png", "reliability.png", "elbo_terms.png", "merges.png"):
        assert _is_png(out / name), name
    idata = D.load_inference_data(out / "inference_data_2dg.nc")
    assert idata.posterior["layers.0.weight"].shape[:2] == (1, 5)
    # the model file rebuilds its network from the stored spec and predicts the same
    model, guide = load_2dg(out / "model_2dg.pt")
    trained = art.trained["2dg"].guide
    x = art.split.test.tensors[0][:16]
    torch.manual_seed(1)
    a = torch.func.vmap(model.network_forward, in_dims=(0, None))(guide.sample_weights(3), x)
    torch.manual_seed(1)
    ref_model = art.trained["2dg"].model
    b = torch.func.vmap(ref_model.network_forward, in_dims=(0, None))(trained.sample_weights(3), x)
    torch.testing.assert_close(a, b)
