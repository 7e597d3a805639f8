"""Outlier rules, cluster-size reduction and the stage-2 builder on real data."""

import contextlib

import pytest
import torch
from bench_stage2_scale import STAGE2_STEPS

from twodg_pyro.data import make_loader
from twodg_pyro.pipeline import SharingConfig
from twodg_pyro.pipeline.settings.config import ConfigError
from twodg_pyro.sharing import (
    SharingStructure,
    build_sharing,
    drop_small_components,
    select_outliers,
)


def test_outlier_rules_select_the_right_elements():
    mus = torch.tensor([0.1, -0.3, 0.05, 0.25, -0.01, 0.0, 0.19, -0.21])
    grads = torch.tensor([0.0, 0.0, 9.0, 0.0, 0.0, 8.0, 0.0, 0.0])
    rep = select_outliers(mus, grads, rule="absolute", tau_w=0.2, grad_percentile=0.25)
    assert rep.mask.nonzero().squeeze(1).tolist() == [1, 2, 3, 5, 7]
    assert (rep.by_mean, rep.by_gradient, rep.both) == (3, 2, 0)
    q = select_outliers(mus, None, rule="quantile", mu_quantile=0.8)
    assert q.mask.nonzero().squeeze(1).tolist() == [1, 3]  # |mu| above the 80% quantile
    # layer rule: second "layer" has one far value
    mus2 = torch.tensor([0.0, 0.1, -0.1, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 5.0])
    lay = select_outliers(mus2, None, rule="layer_std", layer_std_multiple=2.0, layer_sizes=[4, 6])
    assert lay.mask.nonzero().squeeze(1).tolist() == [9]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rule": "absolute", "tau_w": -0.1}, "tau_w must be a positive number, got -0.1"),
        ({"rule": "quantile", "mu_quantile": 1.5}, r"mu_quantile must be in \(0, 1\), got 1.5"),
        ({"grad_percentile": 1.0}, r"P_g\) must be in \[0, 1\), got 1.0"),
        ({"rule": "nearest"}, "unknown outlier rule 'nearest'"),
    ],
)
def test_outlier_settings_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_outliers(torch.zeros(4), torch.zeros(4), **kwargs)


def test_nan_weights_are_named():
    mus = torch.tensor([0.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match=r"1 NaN or infinite value\(s\) \(first at flat index 1\)"):
        select_outliers(mus)


def test_size_reduction_drops_small_clusters():
    points = torch.randn(10, 2)
    assign = torch.tensor([0, 0, 0, 1, 2, 2, 2, 2, 1, 0])
    means, covs = torch.randn(3, 2), torch.eye(2).expand(3, 2, 2)
    keep, new_assign, m, c = drop_small_components(points, assign, means, covs, n_min=3)
    assert keep.tolist() == [True] * 3 + [False] + [True] * 4 + [False, True]
    assert new_assign.tolist() == [0, 0, 0, 1, 1, 1, 1, 0]
    torch.testing.assert_close(m, means[[0, 2]])
    with pytest.raises(ValueError, match="no component has at least N_min = 9"):
        drop_small_components(points, assign, means, covs, n_min=9)


def _cfg(**kw):
    base = dict(
        outlier_rule="quantile",
        mu_quantile=0.995,
        grad_percentile=0.005,
        n_components=16,
        n_min=20,
        tau_d=0.01,
    )
    base.update(kw)
    return SharingConfig(**base)


def test_stage2_on_a_trained_mean_field_bnn(trained_mean_field, digits):
    model, guide = trained_mean_field
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    structure, report = build_sharing(model, guide, loader, _cfg())
    n_w = model.num_weights
    assert structure.num_weights == n_w == 64 * 128 + 128 + 128 * 10 + 10
    rules = report["outlier_rules"]
    assert rules["by_mean"] == pytest.approx(0.005 * n_w, abs=2)
    assert rules["by_gradient"] == int(torch.tensor(0.005 * n_w).ceil())
    assert structure.n_outliers >= rules["n_outliers"]  # + points of deleted clusters
    counts = torch.bincount(structure.plain_component, minlength=structure.n_gaussians)
    assert 1 <= structure.n_gaussians <= 16
    assert structure.ellipse_alphas.sum(1).allclose(torch.ones(structure.n_ellipses))
    assert int(counts.sum()) + structure.n_ellipses + structure.n_outliers == n_w
    # without outliers every weight is an inlier; without ellipses there are none
    s2, _ = build_sharing(model, guide, loader, _cfg(use_outliers=False, use_ellipses=False))
    assert s2.n_outliers == 0 and s2.n_ellipses == 0 and s2.n_inliers == n_w


def test_stage2_bad_inputs(trained_mean_field, digits):
    model, guide = trained_mean_field
    loader = make_loader(digits.train, 128)
    with pytest.raises(ValueError, match=r"n_components K = 20000 is larger than the number"):
        build_sharing(model, guide, loader, _cfg(n_components=20000))
    with pytest.raises(ValueError, match="no inliers would be left"):
        build_sharing(model, guide, loader, _cfg(n_min=100000))


def test_structure_file_round_trip_and_version(tmp_path, trained_mean_field, digits):
    model, guide = trained_mean_field
    structure, _ = build_sharing(model, guide, make_loader(digits.train, 128), _cfg())
    structure.save(tmp_path / "s.pt")
    back = SharingStructure.load(tmp_path / "s.pt")
    assert back.counts() == structure.counts()
    assert torch.equal(back.plain_component, structure.plain_component)
    payload = torch.load(tmp_path / "s.pt", weights_only=True)
    payload["header"] = payload["header"].replace('"format_version": 1', '"format_version": 7')
    with pytest.raises(ValueError, match="format version 7 is not supported"):
        SharingStructure.from_payload(payload)


def test_build_sharing_is_its_named_steps_and_runs_on_points_alone(trained_mean_field, digits):
    from twodg_pyro.sharing import build_sharing_from_points, gather_points

    model, guide = trained_mean_field
    cfg = _cfg(grad_percentile=0.0)  # no gradient rule: the points are all it needs
    names = []

    def step(name):
        names.append(name)
        return contextlib.nullcontext()

    torch.manual_seed(1)
    s1, r1 = build_sharing(model, guide, make_loader(digits.train, 128), cfg, step=step)
    assert names == ["points", "gradients", *STAGE2_STEPS]  # the steps the benchmark times
    torch.manual_seed(1)
    s2, r2 = build_sharing_from_points(gather_points(guide, cfg.coordinates), cfg)
    for name, t in vars(s1).items():
        if torch.is_tensor(t):
            assert torch.equal(t, getattr(s2, name)), name
    assert {k: v for k, v in r1.items() if "seconds" not in k} == {
        k: v for k, v in r2.items() if "seconds" not in k
    }


def test_mixture_subsample_rule(trained_mean_field, digits):
    from twodg_pyro.sharing import mixture_sample

    assert mixture_sample(100, None, 0) is None and mixture_sample(100, 100, 0) is None
    state = torch.get_rng_state()
    rows = mixture_sample(1000, 300, seed=4)
    assert torch.equal(torch.get_rng_state(), state)  # the global random state is untouched
    assert rows.numel() == 300 and rows.unique().numel() == 300
    assert torch.equal(rows, rows.sort().values) and int(rows.max()) < 1000
    assert torch.equal(rows, mixture_sample(1000, 300, seed=4))
    assert not torch.equal(rows, mixture_sample(1000, 300, seed=5))
    # on the digits MLP: a cap above the number of inliers changes nothing; a subsample of
    # 2000 of ~9500 points fits a mixture that still assigns every inlier
    model, guide = trained_mean_field
    runs = {}
    for cap in (None, 100_000, 2000):
        torch.manual_seed(0)
        loader = make_loader(digits.train, 128, shuffle=True, seed=0)
        runs[cap], _ = build_sharing(model, guide, loader, _cfg(gmm_max_points=cap), seed=0)
    assert torch.equal(runs[None].means, runs[100_000].means)
    assert torch.equal(runs[None].plain_component, runs[100_000].plain_component)
    sub = runs[2000]
    assert not torch.equal(sub.means, runs[None].means)
    assert sub.n_inliers + sub.n_outliers == model.num_weights
    assert sub.n_inliers > 0.95 * runs[None].n_inliers
    assert 1 <= sub.n_gaussians <= 16


def test_gmm_max_points_is_validated():
    with pytest.raises(ConfigError, match=r"sharing.gmm_max_points = 10: must be an integer >= "):
        SharingConfig(n_components=16, gmm_max_points=10)
    with pytest.raises(ConfigError, match=r"sharing.gmm_max_points = 5000.5"):
        SharingConfig(gmm_max_points=5000.5)


def test_a_codebook_per_layer_fits_each_layers_points_alone(trained_mean_field):
    """``sharing.codebook = "per_layer"``: min(K, n_l) components per layer, each fitted
    to and holding only its own layer's weights, every layer's centres inside its points'
    range; the layer with the smallest weights gets its own resolution (the global
    codebook spends few of its components there)."""
    from twodg_pyro.sharing import build_sharing_from_points, gather_points

    _, guide = trained_mean_field
    plain = dict(grad_percentile=0.0, use_outliers=False, use_ellipses=False, use_merging=False)
    cfg = _cfg(n_components=8, n_min=0, **plain)
    wp = gather_points(guide, cfg.coordinates)
    s, report = build_sharing_from_points(
        wp, _cfg(codebook="per_layer", n_components=8, n_min=0, **plain)
    )
    sizes = [lay.numel for lay in wp.sites]
    assert report["gmm_components"] == s.n_gaussians == sum(min(8, n) for n in sizes)
    ends = torch.tensor(sizes).cumsum(0)
    layer_of_weight = torch.bucketize(s.plain_index, ends, right=True)
    first = torch.tensor([0, *[min(8, n) for n in sizes]]).cumsum(0)
    layer_of_component = torch.bucketize(s.plain_component, first[1:], right=True)
    assert torch.equal(layer_of_weight, layer_of_component)
    mus = wp.points[:, 0]
    for lay, (lo, hi) in enumerate(zip(first[:-1], first[1:], strict=True)):
        own = mus[layer_of_weight == lay]
        centres = s.means[lo:hi, 0]
        assert own.min() - 1e-6 <= centres.min() and centres.max() <= own.max() + 1e-6
    # the output bias (10 weights): 8 centres of its own against the global codebook's
    g, _ = build_sharing_from_points(wp, cfg)
    bias = s.plain_index >= int(ends[-2])
    assert s.plain_component[bias].unique().numel() == 8
    assert g.plain_component[bias].unique().numel() < 8


def test_the_codebook_setting_is_validated():
    with pytest.raises(ConfigError, match="sharing.codebook"):
        SharingConfig(codebook="per_site")


@pytest.mark.parametrize("coordinates", ["sigma", "log_sigma"])
def test_nearest_assignment_is_the_w2_nearest_representative_normal(coordinates):
    """``nearest_components``: argmin over components of W2(N(mu_i, sigma_i^2),
    N(m_k0, s_k^2))^2 = (mu_i - m_k0)^2 + (sigma_i - s_k)^2, against a brute force over
    the pairs; in (mu, sigma) coordinates it is the plane's Euclidean nearest centre."""
    from twodg_pyro.sharing import nearest_components
    from twodg_pyro.sharing.structure import plane_coordinate

    gen = torch.Generator().manual_seed(0)
    mu, sigma = torch.randn(500, generator=gen), torch.rand(500, generator=gen) + 0.01
    c_mu, c_sigma = torch.randn(7, generator=gen), torch.rand(7, generator=gen) + 0.01
    points = torch.stack([mu, plane_coordinate(sigma, coordinates)], 1)
    means = torch.stack([c_mu, plane_coordinate(c_sigma, coordinates)], 1)
    w2 = (mu[:, None] - c_mu[None]) ** 2 + (sigma[:, None] - c_sigma[None]) ** 2
    got = nearest_components(points, means, coordinates, chunk_size=64)
    assert torch.equal(got, w2.argmin(1))
    if coordinates == "sigma":
        assert torch.equal(got, torch.cdist(points, means).argmin(1))


def test_nearest_assignment_bounds_each_weights_shift_of_mean(trained_mean_field):
    """With few components a broad one is the most responsible for points far from its
    centre: under ``sharing.assignment = "nearest"`` every plain inlier is tied to its
    W2-nearest centre, so the shift of the network's means (the representative tying's
    posterior means against stage 1's) is smaller than under the paper's responsibility;
    per layer, the nearest among its layer's components.  Without merging the index
    symbols are the nearest centres exactly; the settings refuse other rules."""
    from twodg_pyro.sharing import (
        MahalanobisHook,
        build_sharing_from_points,
        gather_points,
        nearest_components,
    )

    _, guide = trained_mean_field
    plain = dict(grad_percentile=0.0, use_ellipses=False, use_merging=False, n_min=1)
    wp = gather_points(guide, "sigma")
    shift = {}
    for rule in ("responsibility", "nearest"):
        s, _ = build_sharing_from_points(wp, _cfg(n_components=6, assignment=rule, **plain))
        pts = s.inlier_points[: s.plain_index.numel()]
        shift[rule] = (s.means[s.plain_component, 0] - pts[:, 0]).pow(2).mean().sqrt()
        if rule == "nearest":
            assert torch.equal(s.plain_component, nearest_components(pts, s.means, "sigma"))
    assert shift["nearest"] < 0.8 * shift["responsibility"]
    s, _ = build_sharing_from_points(
        wp, _cfg(n_components=4, k_nearest=2, assignment="nearest", codebook="per_layer", **plain)
    )
    ends = torch.tensor([lay.numel for lay in wp.sites]).cumsum(0)
    layer = torch.bucketize(s.plain_index, ends, right=True)
    first = torch.tensor([0, *[min(4, lay.numel) for lay in wp.sites]]).cumsum(0)
    pts = s.inlier_points[: s.plain_index.numel()]
    for lay, (lo, hi) in enumerate(zip(first[:-1], first[1:], strict=True)):
        rows = layer == lay
        own = nearest_components(pts[rows], s.means[lo:hi], "sigma") + lo
        assert torch.equal(s.plain_component[rows], own)
    with pytest.raises(ConfigError, match="sharing.assignment"):
        SharingConfig(assignment="closest")
    with pytest.raises(ValueError, match="assignment must be one of"):
        MahalanobisHook(assignment="closest")


def test_own_layer_ellipses_stay_in_their_layers_codebook(trained_mean_field):
    """``sharing.ellipse_scope = "layer"`` with a codebook per layer: every ellipse weight
    is blended from its own layer's components, at stage 2 and when the stage-3 hook
    re-runs the check (:func:`~twodg_pyro.sharing.reassign`); with the paper's ``"all"``
    some are blended from other layers' components; the settings refuse other scopes."""
    from twodg_pyro.sharing import MahalanobisHook, build_sharing_from_points, gather_points
    from twodg_pyro.sharing.refine import layer_scope, reassign

    _, guide = trained_mean_field
    wp = gather_points(guide, "sigma")
    first = torch.tensor([0, *[min(4, lay.numel) for lay in wp.sites]]).cumsum(0)
    ends = torch.tensor([lay.numel for lay in wp.sites]).cumsum(0)

    def crossing(s) -> int:
        layer = torch.bucketize(s.ellipse_index, ends, right=True)
        lo, hi = first[layer][:, None], first[layer + 1][:, None]
        return int(((s.ellipse_components < lo) | (s.ellipse_components >= hi)).sum())

    kw = dict(n_components=4, k_nearest=2, assignment="nearest", codebook="per_layer")
    kw.update(grad_percentile=0.0, use_merging=False, n_min=0, mahalanobis_threshold=1.0)
    wide, _ = build_sharing_from_points(wp, _cfg(**kw))
    own, _ = build_sharing_from_points(wp, _cfg(ellipse_scope="layer", **kw))
    assert own.n_ellipses == wide.n_ellipses > 100
    assert crossing(wide) > 0 and crossing(own) == 0
    again = reassign(own, own.means, own.covariances, 0.5, 2, keep_components=True, scope="layer")
    assert again.n_ellipses > own.n_ellipses and crossing(again) == 0
    with pytest.raises(ConfigError, match="sharing.ellipse_scope"):
        SharingConfig(ellipse_scope="site")
    with pytest.raises(ValueError, match="scope must be one of"):
        MahalanobisHook(scope="site")
    with pytest.raises(ValueError, match="needs the sites of the weights"):
        layer_scope(None, own.ellipse_index, own.ellipse_components[:, 0], len(own.means))
