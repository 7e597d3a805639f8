"""Variational online Newton (twodg_pyro.infer.von): one step is IVON's published update in
its own units (ess = N / beta, weight decay = beta * prior precision / N); on Bayesian
linear regression with real data it reaches the mean-field optimum known in closed form;
in the pipeline it trains, checkpoints and resumes like SVI, and bad settings are named."""

from __future__ import annotations

import functools

import pytest
import torch
from sklearn.datasets import load_diabetes
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import DecomposedELBO, VariationalOnlineNewton, build_optimizer, fit
from twodg_pyro.likelihoods import Categorical, Gaussian
from twodg_pyro.models import MLP
from twodg_pyro.pipeline import ConfigError, config_from_dict, run
from twodg_pyro.priors import NormalPrior


def _ivon_by_hand(mu, sigma, g, eps, n, beta, prior_precision, lr, b1, b2, radius):
    """IVON's Algorithm 1, first step, in its per-example units."""
    ess = n / beta
    delta = beta * prior_precision / n  # the weight decay
    h = 1.0 / (ess * sigma**2) - delta
    h_hat = g * eps / sigma
    h = b2 * h + (1 - b2) * h_hat + 0.5 * (1 - b2) ** 2 * (h - h_hat) ** 2 / (h + delta)
    g_bar = (1 - b1) * g / (1 - b1)  # momentum from zero, debiased
    step = ((g_bar + delta * mu) / (h + delta)).clamp(-radius, radius)
    return mu - lr * step, (ess * (h + delta)).rsqrt()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_step_is_ivons_update(digits, dtype):
    """float64 to rounding; float32 (the flat step's exp/log softplus) to its precision."""
    torch.manual_seed(0)
    net = MLP(64, (16,), 10).to(dtype)
    n, beta, prior_scale = len(digits.train), 0.1, 0.5
    model = BNNModel(net, prior=NormalPrior(prior_scale), likelihood=Categorical(n))
    guide = MeanFieldGuide(model, init_scale=0.05)
    x, y = digits.train.tensors[0][:64].to(dtype), digits.train.tensors[1][:64]
    b1, b2, lr, radius = 0.9, 0.99, 0.3, 1e-3
    opt = build_optimizer(
        model,
        guide,
        {"loc": lr, "scale": lr},
        functools.partial(VariationalOnlineNewton, kl_weight=beta, beta1=b1, beta2=b2),
    )
    mu0 = {s.name: guide.loc(s.name).detach().clone() for s in guide.sites}
    sigma0 = {s.name: guide.scale(s.name).detach().clone() for s in guide.sites}
    torch.manual_seed(7)  # the guide's draw: one standard normal per site, in site order
    eps = {s.name: torch.randn(s.shape, dtype=dtype) for s in guide.sites}
    w = {k: mu0[k] + sigma0[k] * eps[k] for k in mu0}
    w_req = {k: v.clone().requires_grad_() for k, v in w.items()}
    mean_nll = nn.functional.cross_entropy(model.network_forward(w_req, x), y)
    grads = dict(zip(w_req, torch.autograd.grad(mean_nll, list(w_req.values())), strict=True))

    torch.manual_seed(7)
    elbo = DecomposedELBO(beta=beta)
    loss = elbo.combine(elbo.loss_terms(model, guide, x, y))
    loss.backward()
    opt.step()
    for s in guide.sites:
        mu, sigma = _ivon_by_hand(
            mu0[s.name], sigma0[s.name], grads[s.name], eps[s.name], n, beta,
            prior_scale**-2, lr, b1, b2, radius,
        )  # fmt: skip
        tol = (
            {"rtol": 1e-9, "atol": 1e-12}
            if dtype == torch.float64
            else {"rtol": 1e-5, "atol": 1e-7}
        )
        torch.testing.assert_close(guide.loc(s.name).detach(), mu, **tol)
        torch.testing.assert_close(
            guide.scale(s.name).detach(), sigma, rtol=max(tol["rtol"], 1e-7), atol=tol["atol"]
        )


def test_fused_draws_take_the_updates_own_scale_and_the_default_step_never_does(digits):
    """With fused_kl the update reuses the draw's sigma and leaves its sigma' (whose inverse
    softplus is the rho it wrote, to the bit) for the next draw, which draws with it; an
    edit of rho makes it stale; it goes with the guide.  The default step keeps the
    traced step's arithmetic: three VON steps fast and traced train the same guide, bit
    for bit."""
    import gc

    from twodg_pyro.guides.base import site_key
    from twodg_pyro.infer.fast_step import site_priors
    from twodg_pyro.nn import shared_scale
    from twodg_pyro.nn.functional import inverse_softplus, softplus

    x, y = digits.train.tensors[0][:64], digits.train.tensors[1][:64]
    von = functools.partial(VariationalOnlineNewton, kl_weight=0.1, beta2=0.9)

    def trained(fused: bool, fast: bool = True, steps: int = 1):
        torch.manual_seed(0)
        model = BNNModel(MLP(64, (16,), 10), prior=NormalPrior(0.5), likelihood=Categorical(500))
        guide = MeanFieldGuide(model, init_scale=0.05)
        opt = build_optimizer(model, guide, 0.1, von)
        elbo = DecomposedELBO(beta=0.1, fast_step=fast, fused_kl=fused)
        for _ in range(steps):
            opt.zero_grad()
            elbo.combine(elbo.loss_terms(model, guide, x, y)).backward()
            opt.step()
        return model, guide

    model, guide = trained(fused=True, steps=2)
    rhos = [guide.rhos[site_key(s.name)] for s in guide.sites]

    def flat(tensors):
        return torch.cat([t.detach().reshape(-1) for t in tensors])

    rho = flat(rhos)
    assert shared_scale.scale_of_draw(rhos, rho) is None  # not drawn yet
    torch.manual_seed(3)
    values = guide.fast_draw(site_priors(model), fused=True)
    sigma = shared_scale.scale_of_draw(rhos, rho)
    assert torch.equal(inverse_softplus(sigma), rho)
    torch.testing.assert_close(sigma, softplus(rho), rtol=1e-6, atol=0)
    torch.manual_seed(3)
    eps = flat([torch.randn(s.shape) for s in guide.sites])
    locs = flat([guide.loc(s.name) for s in guide.sites])
    assert torch.equal(flat(values.values()), locs + eps * sigma)

    with torch.no_grad():
        rhos[0].add_(0.01)  # any edit: the next draw computes softplus again
    guide.fast_draw(site_priors(model), fused=True)
    assert torch.equal(shared_scale.scale_of_draw(rhos, flat(rhos)), softplus(flat(rhos)))
    before = len(shared_scale._SHARED)
    del model, guide, rhos, values  # the draw's graph holds the parameters too
    gc.collect()
    assert len(shared_scale._SHARED) == before - 1

    fast, traced = trained(False, steps=3)[1], trained(False, fast=False, steps=3)[1]
    for (n, p), (_, q) in zip(fast.named_parameters(), traced.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    assert not any(id(r) in shared_scale._SHARED for r in fast.rhos.values())  # none kept


def _diabetes_regression(noise: float, beta: float, prior_scale: float = 1.0):
    """Bayesian linear regression on scikit-learn's diabetes data (standardised, float64):
    ``(x, y, model, precision)``, the last the mean-field optimum's diagonal precision
    :math:`S_{ii} = (X^\\top X / s_n^2)_{ii} / \\beta + P`."""
    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float64)
    x = (x - x.mean(0)) / x.std(0)
    y = torch.tensor(data.target, dtype=torch.float64)
    y = (y - y.mean()) / y.std()
    torch.manual_seed(0)
    net = nn.Linear(10, 1, bias=False).double()
    lik = Gaussian(len(y), scale=noise)
    model = BNNModel(net, prior=NormalPrior(prior_scale), likelihood=lik)
    precision = x.T @ x / noise**2 / beta + torch.eye(10) / prior_scale**2
    return x, y, model, precision


@pytest.mark.parametrize("beta", [1.0, 0.2])
def test_reaches_the_mean_field_optimum_of_bayesian_linear_regression(beta):
    """Mean-field VI of a Gaussian posterior has a closed-form optimum: the exact mean and
    the diagonal of the precision, :math:`S_{ii} = (X^\\top X / s_n^2)_{ii} / \\beta + P`."""
    noise = 0.7
    x, y, model, precision = _diabetes_regression(noise, beta)
    mean = torch.linalg.solve(precision, x.T @ y / noise**2 / beta)
    guide = MeanFieldGuide(model, init_scale=0.1)
    steps = 2500
    von = _unclipped_von(beta, 0.998, steps)
    fit(
        model,
        guide,
        [(x, y)],
        epochs=steps,
        lr={"loc": 0.5, "scale": 0.5},
        elbo=DecomposedELBO(beta=beta),
        optimizer=von,
        progress=False,
    )
    mu, sigma = guide.means_and_scales()
    # within a fifth of a posterior standard deviation, and 6 % (the Price estimates' noise)
    assert float(((mu - mean).abs() / sigma).max()) < 0.2
    torch.testing.assert_close(sigma, precision.diagonal().rsqrt(), rtol=0.06, atol=0)


def _unclipped_von(beta: float, beta2: float, total_steps: int):
    """VON without clipping, 100 warm-up steps: the linear-regression tests' optimiser."""
    return functools.partial(
        VariationalOnlineNewton,
        kl_weight=beta,
        beta2=beta2,
        clip_radius=None,
        warmup_steps=100,
        total_steps=total_steps,
    )


def test_settle_steps_keep_the_means_and_reach_the_precision():
    """After ``total_steps`` the learning rate is 0 (``stage1.von_settle_epochs``): the
    means stay bit for bit while the precisions, reset 10x too wide there, average their
    estimates (a Robbins-Monro rate) into the closed-form mean-field optimum of Bayesian
    linear regression on the diabetes data."""
    beta = 0.5
    x, y, model, precision = _diabetes_regression(0.7, beta)
    guide = MeanFieldGuide(model, init_scale=0.1)
    train, settle = 2500, 3000
    von = _unclipped_von(beta, 0.99, train)
    opt = build_optimizer(model, guide, {"loc": 0.5, "scale": 0.5}, von)
    elbo = DecomposedELBO(beta=beta)
    for step in range(train + settle):
        if step == train:
            mu_at_end_of_schedule = guide.means_and_scales()[0].clone()
            with torch.no_grad():
                scale_group = next(g for g in opt.param_groups if g["name"] == "scale")
                for rho in scale_group["params"]:
                    rho.add_(2.3)  # softplus(rho + 2.3) is about 10 softplus(rho) here
        opt.zero_grad()
        elbo.combine(elbo.loss_terms(model, guide, x, y)).backward()
        opt.step()
    mu, sigma = guide.means_and_scales()
    assert torch.equal(mu, mu_at_end_of_schedule)
    # 2.5 % off at most (a constant rate leaves its last ~100 estimates' noise: 7 %)
    torch.testing.assert_close(sigma, precision.diagonal().rsqrt(), rtol=0.04, atol=0)
    with pytest.raises(ConfigError, match="von_settle_epochs = 5: must be below stage1.epochs"):
        config_from_dict({"stage1": {"trainer": "von", "epochs": 5, "von_settle_epochs": 5}})


def test_a_constant_settling_rate_keeps_the_bias_of_the_positivity_correction():
    r"""VON's correction term keeps the precision positive and biases it: at a constant rate
    :math:`r` the precision's fixed point is :math:`\mathbb E[\hat S] + \tfrac12 r
    \mathbb E[\Delta^2] / S`.  Fed Price estimates :math:`\hat S = S^*(1 + 3z)` (2,000
    independent weights, a spread three times the curvature), the time-averaged precision
    of constant-rate settling sits above :math:`S^*` by that amount (about 9 %), and the
    decaying rate (Robbins-Monro) removes it."""
    n, optimum, spread, beta, r = 2000, 400.0, 3.0, 0.5, 0.02
    settled = {}
    for rate in (r, None):
        gen = torch.Generator().manual_seed(0)
        mu = nn.Parameter(torch.zeros(n, dtype=torch.float64))
        rho = nn.Parameter(torch.full((n,), optimum**-0.5, dtype=torch.float64).expm1().log())
        groups = [{"name": "loc", "params": [mu]}, {"name": "scale", "params": [rho]}]
        opt = VariationalOnlineNewton(groups, kl_weight=beta, total_steps=1, settle_rate=rate)
        precisions, delta_sq = [], []
        for step in range(4000):
            sigma = nn.functional.softplus(rho.detach())
            s = sigma.pow(-2)
            z = torch.randn(n, generator=gen, dtype=torch.float64)
            delta = optimum * (1 + spread * z) - s  # Delta = S_hat - S
            # the gradient whose natural gradient is Delta (module docstring)
            rho.grad = delta * torch.sigmoid(rho.detach()) * sigma * beta
            mu.grad = torch.zeros_like(mu)
            if step >= 1000:
                precisions.append(s)
                delta_sq.append(delta.square() / s)
            opt.step()
        settled[rate] = float(precisions[-1].mean()) / optimum
        if rate is not None:
            bias = float(torch.stack(precisions).mean()) / optimum - 1
            predicted = 0.5 * r * float(torch.stack(delta_sq).mean()) / optimum
            assert bias > 0.06 and bias == pytest.approx(predicted, rel=0.15)
    assert settled[None] == pytest.approx(1.0, abs=0.01)  # the decaying rate: at S*
    assert torch.equal(mu.detach(), torch.zeros(n, dtype=torch.float64))  # the means stay
    with pytest.raises(ValueError, match="settle_rate = 0 is out of range"):
        VariationalOnlineNewton(groups, settle_rate=0)
    with pytest.raises(ConfigError, match="von_settle_rate = 0.01: applies to the settling"):
        config_from_dict({"stage1": {"trainer": "von", "von_settle_rate": 0.01}})


def test_bad_settings_and_groups_are_named(digits):
    model = BNNModel(MLP(64, (8,), 10), likelihood=Categorical(100))
    guide = MeanFieldGuide(model)
    with pytest.raises(ValueError, match="beta2 = 1.0 is out of range"):
        build_optimizer(model, guide, 0.1, functools.partial(VariationalOnlineNewton, beta2=1.0))
    with pytest.raises(ValueError, match=r"got groups \['loc'\]"):
        VariationalOnlineNewton([{"name": "loc", "params": list(guide.locs.values())}])
    with pytest.raises(ConfigError, match="kl_warmup_epochs.*trainer = 'von'"):
        config_from_dict({"stage1": {"trainer": "von", "kl_warmup_epochs": 2}})


TINY_VON = {
    "methods": ["mean_field", "2dg"],
    "seed": 3,
    "num_samples": 8,
    "progress": False,
    "checkpoint_every": 2,
    "diagnostics": {"enabled": False},
    "network": {"arch": "mlp", "hidden": [32]},
    "prior": {"kind": "layerwise"},
    "stage1": {
        "epochs": 12,
        "trainer": "von",
        "init_scale": "hess_init",
        "kl_weight": 0.1,
        "von_lr": 0.1,
        "von_beta2": 0.999,
        "von_clip_radius": float("inf"),
        "von_warmup_epochs": 1,
    },
    "sharing": {"outlier_rule": "quantile", "mu_quantile": 0.99, "n_components": 8, "n_min": 10},
    "stage3": {"epochs": 2, "lr_centre": 1e-2, "lr_outlier": 1e-2},
}


@pytest.mark.parametrize("fused", [False, True])
def test_pipeline_trains_checkpoints_and_resumes_with_von(tmp_path, interrupt_after, fused):
    """Resumed, the run ends with the uninterrupted run's results; fused too (the shared
    scale comes back with the optimiser's state)."""
    import json

    settings = {**TINY_VON, "fused_kl": fused}
    ref = run(config_from_dict(settings), tmp_path / "ref")
    mf = next(r for r in ref.records if r["method"] == "mean_field")
    assert mf["trainer"] == "von" and mf["accuracy"] > 0.9
    assert next(r for r in ref.records if r["method"] == "2dg")["accuracy"] > 0.85

    interrupt_after("stage1", 4)
    with pytest.raises(KeyboardInterrupt):
        run(config_from_dict(settings), tmp_path / "cut")
    interrupt_after(None)
    run(config_from_dict(settings), tmp_path / "cut", resume=True)

    def untimed(obj):  # results.json without its timings
        if isinstance(obj, dict):
            return {k: untimed(v) for k, v in obj.items() if not k.endswith("seconds")}
        return [untimed(v) for v in obj] if isinstance(obj, list) else obj

    def rows(folder):
        return untimed(json.loads((folder / "results.json").read_text())["records"])

    assert rows(tmp_path / "cut") == rows(tmp_path / "ref")
