"""The regularised horseshoe prior (Piironen and Vehtari 2017): its marginal density
against SciPy's adaptive quadrature and the plain horseshoe's closed form, its sampler
against its density, its name in settings, and what it does to a regression on the
bundled diabetes data."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from scipy import integrate, special
from torch import nn

import twodg_pyro as tp
from twodg_pyro.data import load_dataset
from twodg_pyro.pipeline.settings.build import build_prior
from twodg_pyro.pipeline.settings.config import PriorConfig
from twodg_pyro.priors.horseshoe import RegularizedHorseshoe

F64 = torch.float64


def horseshoe(tau: float, c: float) -> RegularizedHorseshoe:
    return RegularizedHorseshoe(torch.tensor(tau, dtype=F64), torch.tensor(c, dtype=F64))


def reference_log_density(w: float, tau: float, c: float) -> float:
    """log of the integral over t = log(lambda) of N(w; 0, tau^2 lambda~^2) sech(t) / pi."""

    def f(t):
        lam = math.exp(t)
        s = tau * lam / math.sqrt(1 + (tau * lam / c) ** 2)
        return math.exp(-0.5 * (w / s) ** 2) / (math.sqrt(2 * math.pi) * s * math.pi * math.cosh(t))

    point = [math.log(abs(w) / tau)]
    return math.log(integrate.quad(f, -60, 60, limit=500, epsabs=0, epsrel=1e-12, points=point)[0])


@pytest.mark.parametrize("tau, c", [(0.1, 2.0), (1.0, 0.5)])
def test_the_marginal_density_is_the_integral_over_the_local_scale(tau, c):
    d = horseshoe(tau, c)
    for w in (1e-6, 1e-2, 0.3, 1.0, 4.0):
        got = float(d.log_prob(torch.tensor(w, dtype=F64)))
        assert got == pytest.approx(reference_log_density(w, tau, c), abs=1e-6), w


def test_a_wide_slab_is_the_horseshoe_closed_form():
    """c -> inf: p(w) = (2 pi^3 tau^2)^(-1/2) exp(u) E_1(u), u = w^2 / (2 tau^2)."""
    tau = 0.2
    d = horseshoe(tau, 1e9)
    for w in (1e-3, 0.05, 0.2, 1.0):
        u = w * w / (2 * tau * tau)
        closed = -0.5 * math.log(2 * math.pi**3 * tau**2) + u + math.log(special.exp1(u))
        assert float(d.log_prob(torch.tensor(w, dtype=F64))) == pytest.approx(closed, abs=1e-6)


def test_the_sampler_draws_from_the_density():
    torch.manual_seed(0)
    d = horseshoe(0.1, 2.0)
    draws = d.expand((100_000,)).sample()
    for a in (0.01, 0.1, 1.0):
        grid = torch.linspace(-a, a, 100_001, dtype=F64)
        mass = float(torch.trapezoid(d.log_prob(grid).exp(), grid))
        share = float((draws.abs() < a).double().mean())
        assert share == pytest.approx(mass, abs=4 * math.sqrt(mass * (1 - mass) / 1e5) + 1e-3)


def test_settings_name_it_and_the_model_program_takes_it_in_float64():
    prior = build_prior(PriorConfig(kind="horseshoe", scale=0.05, delta=1.5))
    assert isinstance(prior, tp.RegularizedHorseshoePrior)
    assert (prior.global_scale, prior.slab_scale) == (0.05, 1.5)
    assert build_prior(PriorConfig(kind="horseshoe", scale=0.3)).slab_scale == 2.0
    with pytest.raises(ValueError, match="global_scale must be a positive finite number"):
        tp.RegularizedHorseshoePrior(global_scale=0.0)
    model = tp.BNNModel(nn.Linear(3, 1).double(), prior=prior, likelihood=tp.Gaussian(5))
    d = model.prior_distribution(model.sites[0])
    assert d.event_shape == (1, 3) and d.sample().dtype == F64


def test_it_shrinks_the_noise_more_than_the_signal_on_a_diabetes_regression():
    """Linear regression on diabetes with 10 noise features added, mean-field VI: under the
    horseshoe (global scale by the paper's rule, 4 of 20 inputs expected relevant) the noise
    features' posterior is less than 0.6 times as wide as under N(0, 1), the real
    features' more; the held-out RMSE is the same."""
    split = load_dataset("diabetes", seed=0)
    g = torch.Generator().manual_seed(0)

    def with_noise(ds):
        x, y = ds.tensors
        return torch.cat([x, torch.randn(len(x), 10, generator=g)], 1), y

    train, test = with_noise(split.train), with_noise(split.test)
    n = len(train[1])
    horseshoe = tp.RegularizedHorseshoePrior(4 / (20 - 4) * 0.7 / math.sqrt(n))
    scales, rmse = {}, {}
    for name, prior in (("normal", tp.NormalPrior(1.0)), ("hs", horseshoe)):
        torch.manual_seed(0)
        pyro.set_rng_seed(0)
        model = tp.BNNModel(nn.Linear(20, 1), prior=prior, likelihood=tp.Gaussian(n, 0.7))
        guide = tp.MeanFieldGuide(model)
        tp.fit(model, guide, [train], epochs=400, lr=1e-2, progress=False)
        scales[name] = guide.scale("weight").detach()[0]
        rmse[name] = tp.evaluate(model, guide, test, num_samples=50)["rmse"]
    ratio = scales["hs"] / scales["normal"]
    assert float(ratio[10:].mean()) < 0.6 < float(ratio[:10].mean()), ratio
    assert rmse["hs"] == pytest.approx(rmse["normal"], rel=0.05)
