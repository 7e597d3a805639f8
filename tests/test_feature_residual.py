"""The distance-aware residual of a last-layer Laplace approximation
(:mod:`twodg_pyro.methods.feature_residual`): the Gaussian process's posterior variance in
closed form, its settings, its draws on real digits and its model files."""

from __future__ import annotations

import copy

import pytest
import torch
from scipy.spatial.distance import pdist

from twodg_pyro.baselines import train_deterministic
from twodg_pyro.data import make_loader
from twodg_pyro.methods import (
    FeatureResidual,
    LaplacePosterior,
    fit_laplace,
    load_method,
    with_feature_residual,
)
from twodg_pyro.methods.feature_residual import last_layer_module, layer_inputs
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.models import MLP
from twodg_pyro.pipeline import ConfigError, config_from_dict
from twodg_pyro.uncertainty.scores import entropy

torch.set_num_threads(1)


def test_the_variance_is_the_gaussian_process_posterior_variance():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(40, 3, generator=g, dtype=torch.float64)
    x = torch.cat([z[:5] + 1e-3, 3 * torch.randn(7, 3, generator=g, dtype=torch.float64)])
    r = FeatureResidual(z, lengthscale=0.9, prior_precision=2.0, nugget=1e-2)
    # k(x, x) - k_Z(x)^T (K_ZZ + nu I)^-1 k_Z(x), solved directly
    k = lambda a, b: torch.exp(-torch.cdist(a, b).pow(2) / (2 * 0.9**2))  # noqa: E731
    kzz = k(z, z) + 1e-2 * torch.eye(40, dtype=torch.float64)
    kzx = k(z, x)
    expected = 1 - (kzx * torch.linalg.solve(kzz, kzx)).sum(0)
    torch.testing.assert_close(r.variance(x), expected)
    v = r.variance(x)
    assert bool((v >= 0).all() and (v <= 1).all())
    assert float(v[:5].max()) < 0.02  # at the training features: about the nugget
    far = r.variance(z[:3] + 100.0)
    torch.testing.assert_close(far, torch.ones(3, dtype=torch.float64))  # the prior's
    assert r.variance(x.float()).dtype == torch.float32
    # a logit's added standard deviation: the prior's at the feature, times sqrt(v)
    prior = (x.pow(2).sum(1) + 1) / 2.0
    torch.testing.assert_close(r.logit_std(x), (prior * expected).sqrt())


def test_fit_sets_the_median_heuristic_and_keeps_the_prior():
    g = torch.Generator().manual_seed(1)
    phi = torch.rand(300, 8, generator=g)
    r = FeatureResidual.fit(phi, prior_precision=4.0)
    assert r.lengthscale == pytest.approx(float(torch.tensor(pdist(phi.double().numpy())).median()))
    assert r.prior_precision == 4.0
    assert torch.equal(r.inducing, phi) and r.nugget == 1e-2
    many = torch.rand(2500, 2, generator=g)  # the heuristic on a seeded subset of 2,000
    assert FeatureResidual.fit(many, 1.0).lengthscale == FeatureResidual.fit(many, 1.0).lengthscale


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"inducing": torch.full((3, 2), float("nan"))}, "finite features"),
        ({"inducing": torch.zeros(0, 2)}, r"\(M, D\)"),
        ({"inducing": torch.zeros(20_001, 1)}, "20,001 is more than it can hold"),
        ({"lengthscale": 0.0}, "lengthscale = 0.0"),
        ({"prior_precision": 0.0}, "prior_precision = 0.0"),
        ({"nugget": float("nan")}, "nugget = nan"),
    ],
)
def test_bad_residual_settings_are_refused_naming_the_value(kwargs, match):
    args = {"inducing": torch.zeros(3, 2), "lengthscale": 1.0, "prior_precision": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        FeatureResidual(**args)
    with pytest.raises(ValueError, match="at least 2 features"):
        FeatureResidual.fit(torch.zeros(1, 2), 1.0)
    with pytest.raises(ValueError, match="positive prior precision"):
        FeatureResidual.fit(torch.rand(5, 2), 0.0)


@pytest.fixture(scope="module")
def net_and_laplace(digits):
    torch.manual_seed(0)
    net = MLP(64, (32,), 10)
    train_deterministic(
        net, make_loader(digits.train, 64, shuffle=True, seed=0), 12, progress=False
    )
    return net, fit_laplace(net, make_loader(digits.train, 256))


def test_the_residual_leaves_the_digits_and_spreads_far_from_them(net_and_laplace, digits):
    """On held-out digits the residual changes the Laplace predictive little; on inputs
    far from every training feature (the digits at 5 times their contrast, loud noise) it
    spreads it; its draws are seeded and independent of the batching."""
    net, post = net_and_laplace
    loader = make_loader(digits.train, 256)
    gp = with_feature_residual(post, loader)
    assert post.residual is None and gp.net is post.net  # a new approximation, same net
    features = layer_inputs(net, last_layer_module(net, post.param_names), loader)
    assert features.shape == (len(digits.train), 32)
    torch.testing.assert_close(gp.residual.inducing, features)
    x, y = digits.test.tensors
    before = classification_metrics(post.predict((x, y), 30, 0).mean, y)
    after = classification_metrics(gp.predict((x, y), 30, 0).mean, y)
    assert after["accuracy"] >= before["accuracy"] - 0.01
    assert after["nll"] < 1.1 * before["nll"]
    h_test = float(entropy(gp.predict(x, 30, 0).mean).mean())
    assert h_test < float(entropy(post.predict(x, 30, 0).mean).mean()) + 0.05
    loud = 10 * torch.randn(300, 64, generator=torch.Generator().manual_seed(0))
    for far in (5 * x, loud):
        assert float(gp.residual.variance(layer_inputs(net, net.layers[2], [far])).median()) > 0.9
        h_post = float(entropy(post.predict(far, 30, 0).mean).mean())
        h_gp = float(entropy(gp.predict(far, 30, 0).mean).mean())
        assert h_gp > h_post + 0.5 and h_gp > 2 * h_test
    samples = gp.sample_probs(x, 20, 0)
    torch.testing.assert_close(gp.sample_probs(x, 20, 0, batch_size=37), samples)
    assert not torch.equal(gp.sample_probs(x, 20, 1), samples)
    # the weights' draws are the approximation's own: the residual's normals come after
    torch.testing.assert_close(gp.sample_params(20, 0), post.sample_params(20, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_residual_file_predicts_the_same(net_and_laplace, digits, tmp_path, dtype):
    net, post = net_and_laplace
    gp = with_feature_residual(post, make_loader(digits.train, 256)).to(dtype)
    x = digits.test.tensors[0][:100].to(dtype)
    spec = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [32], "num_classes": 10}}
    path = gp.save(tmp_path / "model_laplace.pt", network=spec)
    loaded = load_method(path)
    assert isinstance(loaded, LaplacePosterior) and loaded.settings == gp.settings
    assert loaded.residual.inducing.dtype == dtype
    torch.testing.assert_close(loaded.sample_probs(x, 10, 3), gp.sample_probs(x, 10, 3))


def test_the_residual_is_the_last_layers_only(net_and_laplace, digits):
    net, post = net_and_laplace
    with pytest.raises(ConfigError, match=r"laplace.residual = 'gp'.*subset = 'last_layer'"):
        config_from_dict({"laplace": {"residual": "gp", "subset": "all", "hessian": "diag"}})
    assert config_from_dict({"laplace": {"residual": "gp"}}).laplace.residual == "gp"
    r = FeatureResidual(torch.zeros(3, 32), lengthscale=1.0, prior_precision=1.0)
    with pytest.raises(ValueError, match="needs subset = 'last_layer', not 'all'"):
        LaplacePosterior(
            net,
            subset="all",
            hessian="diag",
            param_names=["layers.2.bias"],
            factors=torch.ones(10),
            prior_precision=torch.ones(1),
            residual=r,
        )
    full = fit_laplace(net, make_loader(digits.train, 256), residual="gp", marglik_steps=5)
    assert full.residual.prior_precision == float(full.prior_precision[0])


def test_a_residual_on_centres_conditions_on_scikit_learns_kmeans():
    """``centres = M``: the residual's pseudo-data are the M k-means centres of the
    features (scikit-learn's, same seed), its lengthscale the features' median distance;
    bad M is refused naming it."""
    from sklearn.cluster import KMeans

    g = torch.Generator().manual_seed(2)
    blobs = torch.randn(4, 6, generator=g) * 5
    phi = (blobs.repeat_interleave(50, 0) + 0.2 * torch.randn(200, 6, generator=g)).float()
    full = FeatureResidual.fit(phi, 3.0)
    r = FeatureResidual.fit(phi, 3.0, seed=7, centres=8)
    km = KMeans(n_clusters=8, n_init=4, random_state=7).fit(phi.double().numpy())
    expected = torch.as_tensor(km.cluster_centers_, dtype=torch.float32)
    assert r.inducing.shape == (8, 6) and r.inducing.dtype == torch.float32
    torch.testing.assert_close(r.inducing, expected)
    assert r.lengthscale == full.lengthscale and r.prior_precision == 3.0
    v = r.variance(phi)
    assert float(v.max()) < 0.1  # every feature near a centre: small variance
    torch.testing.assert_close(r.variance(phi + 100.0), torch.ones(200))  # far: the prior's
    torch.testing.assert_close(
        FeatureResidual.fit(phi, 3.0, seed=7, centres=8).inducing, r.inducing
    )
    for bad in (-1, 201):
        with pytest.raises(ValueError, match=f"centres = {bad}: .* 1 to 200"):
            FeatureResidual.fit(phi, 3.0, centres=bad)
    with pytest.raises(ConfigError, match="laplace.residual_centres = -2"):
        config_from_dict({"laplace": {"residual": "gp", "residual_centres": -2}})


def test_a_residual_on_centres_nears_the_full_one_and_shrinks_the_file(
    net_and_laplace, digits, tmp_path
):
    """On real digits (1,437 training features) the residual on k-means centres keeps the
    accuracy, nears the full residual's NLL as the centres grow (16: about 1.25x, 128:
    within 5 %) and keeps its spread far from the data, in a file that stores 128
    features instead of 1,437 (config route: ``residual_centres``)."""
    net = copy.deepcopy(net_and_laplace[0]).float()  # a test above moves the shared one
    loader = make_loader(digits.train, 256)
    x, y = digits.test.tensors
    fits, scores = {}, {}
    for m in (0, 16, 128):
        fits[m] = fit_laplace(net, loader, residual="gp", residual_centres=m)
        scores[m] = classification_metrics(fits[m].predict((x, y), 30, 0).mean, y)
    assert fits[128].residual.inducing.shape == (128, 32)
    assert {s["accuracy"] for s in scores.values()} == {scores[0]["accuracy"]}
    assert scores[16]["nll"] > scores[128]["nll"] > scores[0]["nll"]
    assert scores[128]["nll"] < 1.05 * scores[0]["nll"] < scores[16]["nll"]
    far = layer_inputs(net, net.layers[2], [5 * x])
    assert float(fits[16].residual.variance(far).median()) > 0.9
    spec = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [32], "num_classes": 10}}
    sizes = {m: fits[m].save(tmp_path / f"m{m}.pt", network=spec).stat().st_size for m in (0, 128)}
    assert sizes[0] - sizes[128] > (len(digits.train) - 128) * 32 * 4 * 0.9
    torch.testing.assert_close(
        load_method(tmp_path / "m128.pt").sample_probs(x[:50], 5, 1),
        fits[128].sample_probs(x[:50], 5, 1),
    )


def test_a_floor_subtracts_the_training_features_quantile_and_is_saved(
    net_and_laplace, digits, tmp_path
):
    """``floor_quantile = q``: the variance read is max(0, v - v0) / (1 - v0) with v0 the
    q-quantile of v over the training features (a q-share of them then add nothing), far
    inputs keep about 1, and the floor survives a model file (a file without one reads
    as 0)."""
    g = torch.Generator().manual_seed(3)
    phi = torch.randn(300, 5, generator=g, dtype=torch.float64)
    plain = FeatureResidual.fit(phi, 2.0, seed=1, centres=12)
    floored = FeatureResidual.fit(phi, 2.0, seed=1, centres=12, floor_quantile=0.5)
    v = plain.variance(phi)
    assert floored.floor == pytest.approx(float(v.quantile(0.5)))
    torch.testing.assert_close(
        floored.variance(phi), ((v - floored.floor) / (1 - floored.floor)).clamp(0, 1)
    )
    assert float((floored.variance(phi) == 0).double().mean()) >= 0.5
    assert float(floored.variance(phi + 50).min()) > 0.99
    assert "floor" not in plain.settings() and floored.settings()["floor"] == floored.floor
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=f"floor_quantile = {bad}"):
            FeatureResidual.fit(phi, 2.0, centres=12, floor_quantile=bad)
    with pytest.raises(ValueError, match="floor = 1.0 is out of range"):
        FeatureResidual(phi[:3], 1.0, 1.0, floor=1.0)
    with pytest.raises(ConfigError, match="laplace.residual_floor_quantile = 1.5"):
        config_from_dict({"laplace": {"residual": "gp", "residual_floor_quantile": 1.5}})
    net = copy.deepcopy(net_and_laplace[0]).float()
    loader = make_loader(digits.train, 256)
    post = fit_laplace(net, loader, residual="gp", residual_centres=16, residual_floor_quantile=0.9)
    assert 0 < post.residual.floor < 1
    spec = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [32], "num_classes": 10}}
    loaded = load_method(post.save(tmp_path / "f.pt", network=spec))
    assert loaded.residual.floor == post.residual.floor
    x = digits.test.tensors[0][:50]
    torch.testing.assert_close(loaded.sample_probs(x, 5, 1), post.sample_probs(x, 5, 1))
