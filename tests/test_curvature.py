"""The curvature recipe: the diagonal Fisher against closed forms, the quadratic optimum of
the mean-field scales, the empirical-Bayes fixed point, the per-site prior, frozen
normalisation statistics."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.optimize import minimize_scalar
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer.curvature import (
    curvature_scales,
    diagonal_fisher,
    empirical_bayes_scales,
)
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.priors import NormalPrior, PerSiteNormalPrior


def _softmax_regression(seed: int = 0, n: int = 40, d: int = 5, c: int = 3):
    g = torch.Generator().manual_seed(seed)
    net = nn.Linear(d, c).double()
    with torch.no_grad():
        net.weight.copy_(torch.randn(c, d, generator=g, dtype=torch.float64))
        net.bias.copy_(torch.randn(c, generator=g, dtype=torch.float64) * 0.1)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    model = BNNModel(net, prior=NormalPrior(1.0), likelihood=Categorical(n))
    return model, x, y


def test_empirical_fisher_is_the_sum_of_squared_closed_form_gradients():
    model, x, y = _softmax_regression()
    fisher = diagonal_fisher(model, (x, y), labels="true", chunk=7)
    with torch.no_grad():
        p = model.net(x).softmax(-1)
    r = p - torch.nn.functional.one_hot(y, p.shape[1]).double()  # dCE/dlogits
    expected_w = torch.einsum("nc,nd->cd", r**2, x**2)
    expected_b = (r**2).sum(0)
    torch.testing.assert_close(fisher["weight"], expected_w)
    torch.testing.assert_close(fisher["bias"], expected_b)


def test_sampled_fisher_is_unbiased_for_the_gauss_newton_diagonal():
    model, x, y = _softmax_regression(n=30)
    with torch.no_grad():
        p = model.net(x).softmax(-1)
    ggn_w = torch.einsum("nc,nd->cd", p * (1 - p), x**2)  # E_y[(p - e_y)^2] = p (1 - p)
    draws = [diagonal_fisher(model, (x, y), seed=s)["weight"] for s in range(300)]
    mean = torch.stack(draws).mean(0)
    assert torch.allclose(mean, ggn_w, rtol=0.12, atol=0.05)
    # and one draw is not the empirical Fisher (the labels are the model's)
    assert not torch.allclose(draws[0], diagonal_fisher(model, (x, y), labels="true")["weight"])


def test_curvature_scales_minimise_the_quadratic_tempered_objective():
    model, x, y = _softmax_regression()
    fisher = diagonal_fisher(model, (x, y), labels="true")
    beta, s = 0.1, 1.0
    scales = curvature_scales(model, fisher, kl_weight=beta)
    h = float(fisher["weight"][0, 0])

    def objective(log_sigma: float) -> float:  # E_q[0.5 h w^2] + beta KL in sigma
        sig = math.exp(log_sigma)
        return 0.5 * h * sig**2 + beta * (math.log(s / sig) + sig**2 / (2 * s**2) - 0.5)

    best = math.exp(minimize_scalar(objective, bounds=(-20, 5), method="bounded").x)
    assert float(scales["weight"][0, 0]) == pytest.approx(best, rel=1e-4)
    # more curvature or a smaller KL weight: narrower
    assert float(curvature_scales(model, fisher, kl_weight=0.01)["weight"][0, 0]) < best


def test_empirical_bayes_scale_is_the_evidence_fixed_point():
    model, x, y = _softmax_regression()
    fisher = diagonal_fisher(model, (x, y), labels="true")
    beta = 0.5
    scales = empirical_bayes_scales(model, fisher, kl_weight=beta)
    w = model.site_parameter(0).detach()
    s2 = scales["weight"] ** 2
    var = 1.0 / (fisher["weight"] / beta + 1.0 / s2)
    assert s2 == pytest.approx(float((w**2 + var).mean()), rel=1e-5)
    # the same scales through the prior give the same initial scales
    prior = PerSiteNormalPrior(scales)
    model.prior = prior
    a = curvature_scales(model, fisher, beta)
    b = curvature_scales(model, fisher, beta, prior_scales=scales)
    torch.testing.assert_close(a["weight"], b["weight"])


def test_per_site_prior_validates_and_round_trips():
    with pytest.raises(ValueError, match="site 'w'"):
        PerSiteNormalPrior({"w": -1.0})
    with pytest.raises(ValueError, match="non-empty"):
        PerSiteNormalPrior({})
    prior = PerSiteNormalPrior({"weight": 0.3, "bias": 0.1})
    spec, tensors = prior.to_spec()
    back = PerSiteNormalPrior.from_spec(spec, nn.Linear(2, 2), tensors, "f.pt")
    assert back.scales == prior.scales
    model = BNNModel(nn.Linear(2, 2), prior=prior, likelihood=Categorical(4))
    d = model.prior_distribution(model.sites[0])
    assert float(d.base_dist.scale.flatten()[0]) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="learnt from the pretrained network"):
        PerSiteNormalPrior.from_settings(1.0, 0.0, None)


def test_curvature_errors_name_the_value():
    model, x, y = _softmax_regression()
    with pytest.raises(ValueError, match="labels"):
        diagonal_fisher(model, (x, y), labels="oops")
    with pytest.raises(ValueError, match="kl_weight"):
        curvature_scales(model, {}, kl_weight=0.0)
    with pytest.raises(ValueError, match="site 'weight'"):
        curvature_scales(model, {}, kl_weight=1.0)
    with pytest.raises(ValueError, match="init_scale of site 'weight'"):
        MeanFieldGuide(model, init_scale={"weight": torch.zeros(3, 5), "bias": torch.ones(3)})


def test_guide_starts_at_given_scales():
    model, x, y = _softmax_regression()
    fisher = diagonal_fisher(model, (x, y))
    scales = curvature_scales(model, fisher, 0.1)
    guide = MeanFieldGuide(model, init_scale=scales)
    torch.testing.assert_close(guide.scale("weight"), scales["weight"], rtol=1e-6, atol=1e-9)


def _bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_frozen_norm_statistics_stay_in_eval_mode_and_unchanged():
    frozen = BNNModel(_bn_net(), likelihood=Categorical(8), norm_stats="frozen")
    batch = BNNModel(_bn_net(), likelihood=Categorical(8))
    before = frozen.net[1].running_mean.clone()
    frozen.train()
    batch.train()
    assert not frozen.net[1].training and frozen.net[0].training
    assert batch.net[1].training
    x = torch.randn(8, 3)
    w = frozen.initial_values()
    frozen.network_forward(w, x)
    batch.network_forward(batch.initial_values(), x)
    torch.testing.assert_close(frozen.net[1].running_mean, before)
    assert not torch.equal(batch.net[1].running_mean, before)
    with pytest.raises(ValueError, match="norm_stats"):
        BNNModel(_bn_net(), norm_stats="moving")


def test_fisher_through_trainable_batchnorm_holds_no_graph_and_matches_one_chunk():
    """BatchNorm's affine parameters are not sites but require gradients: the Fisher
    must not carry an autograd graph through them (it kept every chunk's activations
    alive and ran a ResNet-20 out of memory), and chunking must not change it."""
    model = BNNModel(_bn_net(), likelihood=Categorical(40), norm_stats="frozen")
    assert any(p.requires_grad for p in model.net[1].parameters())
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    chunked = diagonal_fisher(model, (x, y), labels="true", chunk=8)
    whole = diagonal_fisher(model, (x, y), labels="true", chunk=40)
    for k, v in chunked.items():
        assert not v.requires_grad and v.grad_fn is None, k
        torch.testing.assert_close(v, whole[k])


def test_fisher_of_a_subset_equals_that_of_its_tensors():
    model, x, y = _softmax_regression()
    ds = torch.utils.data.TensorDataset(x, y)
    sub = torch.utils.data.Subset(ds, list(range(10, 30)))
    a = diagonal_fisher(model, sub, labels="true")
    b = diagonal_fisher(model, (x[10:30], y[10:30]), labels="true")
    torch.testing.assert_close(a["weight"], b["weight"])


def test_scale_convergence_reads_the_last_tenth_of_the_epochs():
    from twodg_pyro.pipeline.methods.mean_field import scale_convergence

    settled = [{"sigma_median": 1.0 + 0.5 * (i < 10)} for i in range(20)]
    got = scale_convergence(settled)
    assert got["over_epochs"] == 2 and got["converged"] and got["median_scale_change"] == 0
    rising = [{"sigma_median": 1.1**i} for i in range(20)]
    got = scale_convergence(rising)
    assert not got["converged"] and got["median_scale_change"] == pytest.approx(1.1**2 - 1)
    assert scale_convergence([{"loss": 1.0}, {"loss": 0.5}]) is None
    assert "site" not in got  # no per-site records: nothing said about sites


def test_scale_convergence_names_a_small_site_that_drifts_under_a_still_median():
    """The gap MLP's first layer: its scales grew while the median of all weights stood
    still; the per-site change names it, ``converged`` stays the median's rule."""
    from twodg_pyro.pipeline.methods.mean_field import scale_convergence

    history = [
        {"sigma_median": 0.3, "sigma_median_by_site": {"big": 0.3, "small": 0.1 * 1.05**i}}
        for i in range(20)
    ]
    got = scale_convergence(history)
    assert got["converged"] and got["median_scale_change"] == 0
    assert got["site"] == "small" and got["site_scale_change"] == pytest.approx(1.05**2 - 1)


def test_recipe_presets_are_one_recipe_for_every_network():
    from twodg_pyro.pipeline import config_from_dict
    from twodg_pyro.pipeline.settings.presets import BAYES_RECIPE, PRESETS, preset

    bayes = [n for n in PRESETS if n.endswith("-bayes")]
    assert {"mnist-lenet5-bayes", "mnist-resnet20-bayes"} <= set(bayes)
    for name in bayes:
        cfg = config_from_dict(preset(name))
        assert cfg.stage1.init_scale == "curvature" and cfg.network.norm_stats == "frozen"
        assert cfg.prior.kind == BAYES_RECIPE["prior"]["kind"]
        assert cfg.stage1.kl_weight == cfg.stage3.kl_weight == "data_size"
        assert cfg.sharing.tau_d == 0.002 and cfg.stage3.lr_centre == 1e-4
        assert cfg.sharing.outlier_rule == "quantile"


def test_stage1_learns_the_prior_and_starts_at_the_curvature_scales_on_digits():
    from twodg_pyro.pipeline import config_from_dict
    from twodg_pyro.pipeline.methods.algorithm1 import stage1_model
    from twodg_pyro.pipeline.settings.build import build_net, load_data

    cfg = config_from_dict(
        {
            "prior": {"kind": "empirical_bayes"},
            "stage1": {"init_scale": "curvature", "kl_weight": 0.1},
            "network": {"hidden": [16]},
        }
    )
    split = load_data(cfg.data, image=False)
    torch.manual_seed(0)
    net = build_net(cfg.network, split)
    model, init = stage1_model(cfg, split, net)
    assert isinstance(model.prior, PerSiteNormalPrior)
    assert set(model.prior.scales) == set(model.site_names)
    assert set(init) == set(model.site_names)
    fisher = diagonal_fisher(model, split.train, seed=cfg.seed)
    expected = curvature_scales(model, fisher, 0.1)
    torch.testing.assert_close(init["layers.0.weight"], expected["layers.0.weight"])
    # a resumed stage 1 takes the learnt scales back and computes no Fisher
    again, placeholder = stage1_model(cfg, split, net, model.prior.scales, resumed=True)
    assert again.prior.scales == model.prior.scales and placeholder == "paper"
