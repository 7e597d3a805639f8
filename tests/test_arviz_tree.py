"""The ArviZ tree of a trained BNN on the installed ArviZ major (1.x: ``xarray.DataTree``;
0.x: ``InferenceData``): its groups, dims and dtypes, ``sample_stats`` against a direct
computation, PSIS with known answers, PSIS-LOO per observation, ``compare`` with
warnings as errors, block k-hats with a known answer, summaries and ArviZ's figures.

Run on both majors: ``.venv/bin/python -m pytest tests/test_arviz_tree.py`` (0.x) and the
same with a Python 3.12 interpreter that has ArviZ 1.x."""

from __future__ import annotations

import json
import math
import warnings
from importlib import metadata

import matplotlib
import numpy as np
import pyro
import pytest
import torch
import xarray as xr
from conftest import ARVIZ_GROUPS, SMALL_SHARING
from torch import nn

from twodg_pyro import diagnostics as D
from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.diagnostics import _arviz as A
from twodg_pyro.diagnostics.arviz_stats import psislw
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.guides.base import site_key
from twodg_pyro.infer import fit
from twodg_pyro.likelihoods import Categorical, Gaussian
from twodg_pyro.models import MLP
from twodg_pyro.pipeline import SharingConfig
from twodg_pyro.sharing import build_sharing

matplotlib.use("Agg")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
S = 30
SITES = ["layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"]


@pytest.fixture(scope="module")
def small(digits):
    """A 64-16-10 mean-field BNN (20 epochs) and a shared-GMM guide on it (2 epochs)."""
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    model = BNNModel(MLP(64, (16,), 10), prior=1.0, likelihood=Categorical(len(digits.train)))
    mf = MeanFieldGuide(model, seed=0)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    fit(model, mf, loader, epochs=20, lr=1e-2, progress=False)
    cfg = SharingConfig(**SMALL_SHARING)
    structure, _ = build_sharing(model, mf, loader, cfg, seed=0)
    guide = SharedGMMGuide(model, structure)
    fit(model, guide, loader, epochs=2, lr=1e-2, progress=False)
    return {"model": model, "mf": mf, "guide": guide}


@pytest.fixture(scope="module")
def trees(small, digits):
    xy = digits.test.tensors
    return {
        "2dg": D.to_inference_data(small["model"], small["guide"], xy, S, seed=0),
        "mean_field": D.to_inference_data(small["model"], small["mf"], xy, S, seed=0),
    }


def _is_png(path) -> bool:
    data = open(path, "rb").read()
    return len(data) > 1000 and data[:8] == PNG_MAGIC


# ---------------------------------------------------------------------------- the tree
def test_the_tree_type_groups_dims_and_dtypes(trees, small, digits):
    tree = trees["2dg"]
    assert isinstance(tree, xr.DataTree) if D.DATATREE else not isinstance(tree, xr.DataTree)
    assert set(D.group_names(tree)) == ARVIZ_GROUPS
    post = D.group(tree, "posterior")
    assert post.sizes["chain"] == 1 and post.sizes["draw"] == S
    assert post["layers.0.weight"].dims == (
        "chain",
        "draw",
        "layers.0.weight_out",
        "layers.0.weight_in",
    )
    N = len(digits.test)
    ll = D.group(tree, "log_likelihood")["y"]
    assert ll.dims == ("chain", "draw", "obs") and ll.shape == (1, S, N)
    assert ll.dtype == np.float64
    assert D.group(tree, "posterior_predictive")["y"].shape == (1, S, N)
    assert D.group(tree, "observed_data")["y"].dims == ("obs",)
    stats = D.group(tree, "sample_stats")
    assert set(stats.data_vars) == {"log_p", "log_q", "log_prior"}
    for name in stats.data_vars:
        assert stats[name].dims == ("chain", "draw") and stats[name].dtype == np.float64
        assert np.all(np.isfinite(stats[name].values))
    assert np.all(stats["log_p"].values < stats["log_prior"].values)  # log p(D | w) < 0
    # the sharing structure is a group of its own, with no sample dims
    st = small["guide"].structure()
    sharing = D.group(tree, "sharing")
    assert "chain" not in sharing.dims and "draw" not in sharing.dims
    K = st.n_gaussians
    assert sharing["centre"].dims == ("component", "coord")
    assert sharing["centre"].shape == (K, 2) and sharing["covariance"].shape == (K, 2, 2)
    np.testing.assert_allclose(sharing["centre"].values, st.means.numpy())
    kinds = np.concatenate([sharing[f"{n}.kind"].values.reshape(-1) for n in SITES])
    assert (kinds == 0).sum() == st.n_outliers and (kinds == 2).sum() == st.n_ellipses
    assert sorted(sharing["outlier"].values) == sorted(st.outlier_index.tolist())
    assert list(sharing["site_offset"].values) == [0, 1024, 1040, 1200]
    assert "centre" not in D.group(tree, "constant_data")
    for name in D.group_names(tree):
        attrs = D.group(tree, name).attrs
        assert attrs["method"] == "2dg" and attrs["creation_library"] == "twodg_pyro", name
        assert attrs["arviz_major"] == D.ARVIZ_MAJOR and attrs["log_q_method"] == "exact"
        assert attrs["arviz_version"] == D.ARVIZ_VERSION == metadata.version("arviz")


def test_component_value_is_a_weight_tied_to_each_component(small, digits):
    xy = tuple(t[:40] for t in digits.test.tensors)
    tree = D.to_inference_data(small["model"], small["guide"], xy, 8, max_site_values=None)
    post, sharing = D.group(tree, "posterior"), D.group(tree, "sharing")
    flat = np.concatenate([post[n].values[0].reshape(8, -1) for n in SITES], axis=1)
    rep = sharing["representative"].sel(component=post["component"].values).values
    np.testing.assert_array_equal(post["component_value"].values[0], flat[:, rep])
    comp = np.concatenate([sharing[f"{n}.component"].values.reshape(-1) for n in SITES])
    assert np.all(comp[rep] == post["component"].values)  # plain inliers of their component


def test_sample_stats_of_a_mean_field_guide_match_torch_distributions(digits):
    torch.manual_seed(1)
    model = BNNModel(MLP(64, (8,), 10), prior=1.0, likelihood=Categorical(len(digits.train)))
    guide = MeanFieldGuide(model, init_scale=0.05, seed=1)
    x, y = digits.test.tensors
    xt, yt = (t[:300] for t in digits.train.tensors)
    tree = D.to_inference_data(
        model, guide, (x[:50], y[:50]), 12, seed=4, train_data=(xt, yt), max_site_values=None
    )
    post, stats = D.group(tree, "posterior"), D.group(tree, "sample_stats")
    w = {s.name: torch.as_tensor(post[s.name].values[0]) for s in guide.sites}
    normal = torch.distributions.Normal
    log_q = sum(
        normal(guide.loc(s.name).detach(), guide.scale(s.name).detach())
        .log_prob(w[s.name])
        .reshape(12, -1)
        .double()
        .sum(1)
        for s in guide.sites
    )
    log_prior = sum(
        normal(0.0, 1.0).log_prob(w[s.name]).reshape(12, -1).double().sum(1) for s in guide.sites
    )
    logits = torch.func.vmap(model.network_forward, in_dims=(0, None))(w, xt)
    ll = logits.double().log_softmax(-1).gather(-1, yt[None, :, None].expand(12, -1, 1))
    log_p = log_prior + len(digits.train) / 300 * ll.sum((1, 2))
    np.testing.assert_allclose(stats["log_q"].values[0], log_q.numpy(), rtol=1e-5)
    np.testing.assert_allclose(stats["log_prior"].values[0], log_prior.numpy(), rtol=1e-6)
    np.testing.assert_allclose(stats["log_p"].values[0], log_p.numpy(), rtol=1e-6)
    assert stats.attrs["log_p_data"] == "train_data" and stats.attrs["log_p_examples"] == 300


def test_netcdf_round_trip_keeps_every_group(trees, tmp_path):
    tree = trees["2dg"]
    path = D.save_inference_data(tree, tmp_path / "sub" / "tree.nc")
    back = D.load_inference_data(path)
    assert set(D.group_names(back)) == ARVIZ_GROUPS
    for name in ("posterior", "sample_stats", "sharing", "log_likelihood"):
        a, b = D.group(tree, name), D.group(back, name)
        for var in a.data_vars:
            np.testing.assert_array_equal(a[var].values, b[var].values)
            assert a[var].dims == b[var].dims
    assert json.loads(D.group(back, "posterior").attrs["counts"])["n_outliers"] > 0


# ---------------------------------------------------------------------------- PSIS
@pytest.mark.parametrize(
    "n, expected", [(100, 0.5), (1000, 2 / 3), (30, 1 - 1 / math.log10(30)), (10**8, 0.7)]
)
def test_khat_threshold_is_min_of_one_minus_inverse_log10_and_0_7(n, expected):
    assert D.khat_threshold(n) == pytest.approx(expected)


def test_khat_threshold_is_arvizs_good_k(trees):
    assert D.loo(trees["2dg"])["good_k"] == pytest.approx(D.khat_threshold(S))
    assert D.khat_threshold(1) == -math.inf


def test_psis_khat_on_proposals_with_known_answers():
    """p = N(0, 1): a wider proposal q = N(0, 1.5^2) has bounded ratios (k-hat low); a
    narrower q = N(0, 0.25^2) has Pareto ratios with k = 1 - 0.25^2 = 0.94 (PSIS's
    estimate is biased low at finite S: 0.82-0.98 over seeds with 4000 draws)."""
    rng = np.random.default_rng(0)
    n = 4000
    for sd_q, lo, hi in ((1.5, -np.inf, 0.3), (0.25, 0.7, 1.3)):
        x = rng.normal(0.0, sd_q, n)
        log_r = -0.5 * x**2 - (-0.5 * (x / sd_q) ** 2 - math.log(sd_q))
        lw, k = psislw(log_r)
        assert lo < k < hi, (sd_q, k)
        assert np.logaddexp.reduce(lw) == pytest.approx(0.0, abs=1e-9)
    # rows: constant (exact: NaN), too few draws (inf), and a normal row, in one call
    rows = np.stack([np.zeros(40), rng.normal(size=40)])
    lw, k = A.psislw(rows)
    assert math.isnan(k[0]) and math.isfinite(k[1])
    np.testing.assert_allclose(lw[0], -math.log(40))
    assert np.all(np.isinf(A.psislw(rng.normal(size=(3, 10)))[1]))


def test_loo_gives_a_khat_per_observation(trees, digits):
    res = D.loo(trees["2dg"], pointwise=True)
    N = len(digits.test)
    assert res["pareto_k"].shape == (N,) and res["elpd_i"].shape == (N,)
    assert math.isfinite(res["elpd_loo"]) and res["elpd_loo"] < 0
    assert res["elpd_loo"] == pytest.approx(res["elpd_i"].sum())
    assert res["n_bad_k"] == int((res["pareto_k"] > D.khat_threshold(S)).sum())
    assert res["n_samples"] == S and res["n_data_points"] == N


def test_loo_of_observations_predicted_with_certainty():
    """A log-likelihood that is the same in every draw has uniform weights and an exact
    LOO term: k-hat NaN, counted in n_constant (ArviZ 1.x's own loo raises on it)."""
    rng = np.random.default_rng(2)
    ll = rng.normal(-1.0, 0.3, (1, S, 6))
    ll[..., :2] = 0.0
    tree = _tree_of(ll)
    res = D.loo(tree, pointwise=True)
    assert res["n_constant"] == 2 and np.all(np.isnan(res["pareto_k"][:2]))
    assert np.all(np.isfinite(res["pareto_k"][2:])) and math.isfinite(res["elpd_loo"])
    np.testing.assert_allclose(res["elpd_i"][:2], 0.0, atol=1e-12)


def _tree_of(ll: np.ndarray):
    n = ll.shape[-1]
    groups = {"log_likelihood": {"y": ll}, "observed_data": {"y": np.zeros(n, dtype=np.int64)}}
    return A.build_tree(groups, {"log_likelihood"}, {"obs": np.arange(n)}, {"y": ["obs"]}, {})


# ---------------------------------------------------------------------------- compare
def test_compare_of_the_run_methods_raises_no_warning(trees):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = D.compare(trees)
    assert set(table.index) == {"2dg", "mean_field"} and table["rank"].min() == 0
    assert table["weight"].sum() == pytest.approx(1.0)
    other = {"a": trees["2dg"], "b": _tree_of(np.zeros((1, S, 5)))}
    with pytest.raises(ValueError, match="other observations"):
        D.compare(other)


def test_compare_when_an_observations_elpd_underflows_in_every_method():
    """The cause of ArviZ's `divide by zero encountered in log`: its stacking takes
    exp(elpd_i), 0 for an elpd_i below about -745 in every method."""
    rng = np.random.default_rng(3)
    ll_a, ll_b = rng.normal(-0.5, 0.2, (2, 1, S, 20))
    ll_a[..., 0], ll_b[..., 0] = -1300.0 + rng.normal(0, 1, S), -1200.0 + rng.normal(0, 1, S)
    trees = {"a": _tree_of(ll_a), "b": _tree_of(ll_b)}
    elpd_i = np.stack([D.loo(t, pointwise=True)["elpd_i"] for t in trees.values()], 1)
    assert np.all(np.exp(elpd_i[0]) == 0.0)  # the condition of the warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = D.compare(trees)
    w = D.stacking_weights(elpd_i)
    assert np.all(np.isfinite(w)) and w.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(table.loc[["a", "b"], "weight"].values, w)
    assert w[1] > 0.99  # b is better on observation 0 and no worse elsewhere


def test_stacking_weights_match_arvizs_where_nothing_underflows(trees):
    elpds = {name: D.loo_data(t) for name, t in trees.items()}
    with A.quiet():
        if D.DATATREE:
            ref = A.arviz_stats.compare(elpds, method="stacking", round_to="none")
        else:
            ref = A.az.compare(elpds, ic="loo", method="stacking")
    table = D.compare(trees)
    np.testing.assert_allclose(
        table.loc[list(trees), "weight"].values, ref.loc[list(trees), "weight"].values, atol=2e-3
    )


# ---------------------------------------------------------------------------- summaries, plots
def test_summary_and_arviz_figures_of_the_tree(trees, tmp_path):
    tree = trees["2dg"]
    summary = D.summary(tree, var_names=["layers.2.bias"])
    assert {"mean", "sd", "ess_bulk"} <= set(summary.columns)
    assert list(summary.index) == [f"layers.2.bias[{i}]" for i in range(10)]
    assert np.issubdtype(summary["mean"].dtype, np.floating)
    paths = [
        D.plot_component_forest(tree, tmp_path / "forest.png"),
        D.plot_weight_pairs(tree, tmp_path / "pairs.png", "layers.2.weight"),
        D.plot_class_ppc(tree, tmp_path / "ppc.png"),
    ]
    for p in paths:
        assert _is_png(p), p
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # every figure closed
    with pytest.raises(ValueError, match="component_value"):
        D.plot_component_forest(trees["mean_field"], tmp_path / "none.png")


# ---------------------------------------------------------------------------- block k-hat
class TwoBranches(nn.Module):
    """f(x) = a . x[:, :2] + b . x[:, 2:]: two linear layers, one output."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 1, bias=False)
        self.b = nn.Linear(2, 1, bias=False)

    def forward(self, x):
        return self.a(x[:, :2]) + self.b(x[:, 2:])


def test_block_khat_finds_the_layer_whose_approximation_is_off():
    """Linear regression with an orthogonal design (X^T X = 8 I) has a diagonal Gaussian
    posterior N(m, v I): layer a gets q = N(m, (1.3^2) v) (wider: k-hat low), layer b
    q = N(m, 0.25^2 v) (narrower: Pareto ratios, k = 1 - 0.25^2 = 0.94)."""
    h = torch.tensor(
        [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=torch.float
    )
    x = torch.cat([h, -h])  # 8 x 4, columns orthogonal with squared norm 8
    y = x @ torch.tensor([0.5, -1.0, 0.3, 0.8]) + 0.1 * torch.randn(8)
    s = 0.5
    model = BNNModel(TwoBranches(), prior=1.0, likelihood=Gaussian(8, s))
    precision = 8 / s**2 + 1.0
    mean, sd = (x.T @ y / s**2) / precision, precision**-0.5
    guide = MeanFieldGuide(model)
    for name, rows, factor in (("a.weight", slice(0, 2), 1.3), ("b.weight", slice(2, 4), 0.25)):
        guide.loc(name).data.copy_(mean[rows].reshape(1, 2))
        guide.rhos[site_key(name)].data.fill_(math.log(math.expm1(factor * sd)))
    res = D.block_khat(model, guide, (x, y), num_samples=2000, seed=0)
    k = {b["name"]: b["khat"] for b in res["blocks"]}
    assert set(k) == {"layer a", "layer b"}
    assert k["layer a"] < 0.5 < 0.7 < k["layer b"] < 1.5, k
    assert res["n_above_threshold"] == 1 and res["khat_threshold"] == D.khat_threshold(2000)


def test_block_khat_of_a_2dg_guide(small, digits):
    guide = small["guide"]
    blocks = D.default_blocks(guide, max_components=3)
    st = guide.structure()
    assert [b.kind for b in blocks] == ["layer", "layer", "outliers"] + ["component"] * 3
    assert blocks[2].index.numel() == st.n_outliers
    sizes = torch.bincount(st.plain_component, minlength=st.n_gaussians)
    assert [b.index.numel() for b in blocks[3:]] == sorted(sizes.tolist(), reverse=True)[:3]
    res = D.block_khat(
        small["model"], guide, digits.train.tensors, 30, max_components=2, max_examples=200
    )
    assert all(math.isfinite(b["khat"]) for b in res["blocks"])
    assert res["num_samples"] == 30 and res["n_examples"] == 200
    tied = SharedGMMGuide(small["model"], st, tying="tied")
    res = D.block_khat(
        small["model"], tied, digits.train.tensors, 30, max_components=1, max_examples=100
    )
    kinds = {b["kind"]: b for b in res["blocks"]}
    assert "skipped" in kinds["layer"] and "tied" in kinds["layer"]["skipped"]
    assert math.isfinite(kinds["component"]["khat"]) and math.isfinite(kinds["outliers"]["khat"])
