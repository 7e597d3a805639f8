"""The stochastic tying's expected KL: against numerical integration and Monte Carlo."""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from twodg_pyro.guides.stochastic_kl import expected_log_abs_normal, expected_normal_kl

F64 = torch.float64


def _quad_log_abs(m: float, v: float) -> float:
    """E log|t|, t ~ N(m, v), by adaptive quadrature split at the singularity."""
    s = math.sqrt(v)

    def f(t):
        return np.log(abs(t)) * stats.norm.pdf(t, m, s)

    lo, hi = m - 40 * s, m + 40 * s
    parts = [(lo, 0.0), (0.0, hi)] if lo < 0 < hi else [(lo, hi)]
    with warnings.catch_warnings():  # a far piece of ~1e-11 warns on its relative accuracy
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        return sum(integrate.quad(f, a, b, limit=500, epsabs=1e-13)[0] for a, b in parts)


@pytest.mark.parametrize(
    "m, v",
    [
        (0.0, 1.0),  # E log|z| = -(gamma + log 2) / 2
        (0.3, 1.0),
        (1.0, 1.0),
        (-3.0, 0.5),  # even in m
        (5.0, 0.5),  # h = 25: deep in the series
        (10.0, 1.0),  # h = 50
        (20.0, 1.0),  # h = 200: the switch
        (20.1, 1.0),  # just past it: the expansion
        (0.05, 1e-6),  # h = 1250: a typical narrow stage-2 component
        (1e-3, 1e-2),
    ],
)
def test_expected_log_abs_normal_matches_quadrature(m, v):
    got = expected_log_abs_normal(torch.tensor(m, dtype=F64), torch.tensor(v, dtype=F64))
    assert got.item() == pytest.approx(_quad_log_abs(m, v), abs=1e-10)


def test_expected_log_abs_standard_normal_closed_form():
    got = expected_log_abs_normal(torch.zeros((), dtype=F64), torch.ones((), dtype=F64))
    assert got.item() == pytest.approx(-(0.5772156649015329 + math.log(2.0)) / 2, abs=1e-13)


def test_expected_log_abs_normal_gradients_are_finite_and_correct():
    m = torch.tensor([0.5, 0.07, 3.0, -12.0], dtype=F64, requires_grad=True)
    v = torch.tensor([0.3, 1e-4, 0.2, 1.0], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(expected_log_abs_normal, (m, v))
    # at m = 0 (the series' h = 0 edge) the gradient is finite: 0 in m, 1 / (2 v) in v
    m0 = torch.zeros(2, dtype=F64, requires_grad=True)
    v0 = torch.tensor([1.0, 4.0], dtype=F64, requires_grad=True)
    expected_log_abs_normal(m0, v0).sum().backward()
    assert torch.equal(m0.grad, torch.zeros(2, dtype=F64))
    torch.testing.assert_close(v0.grad, 1 / (2 * v0.detach()))


@pytest.mark.parametrize("coordinates", ["sigma", "log_sigma"])
def test_expected_normal_kl_matches_monte_carlo(coordinates):
    g = torch.Generator().manual_seed(0)
    if coordinates == "sigma":
        centres = torch.tensor([[0.0, 0.05], [0.2, 0.1], [-0.1, 0.02]], dtype=F64)
    else:
        centres = torch.tensor([[0.0, -3.0], [0.2, -2.3], [-0.1, -4.0]], dtype=F64)
    a = torch.tensor([[0.02, 0.0], [0.005, 0.01]], dtype=F64)
    covs = torch.stack([a @ a.T, 4 * a @ a.T, torch.diag(torch.tensor([1e-4, 4e-4]))]).to(F64)
    got = expected_normal_kl(centres, covs, 0.1, 0.5, coordinates)
    n = 400_000
    z = torch.randn(n, 3, 2, generator=g, dtype=F64)
    theta = centres + (torch.linalg.cholesky(covs) @ z.unsqueeze(-1)).squeeze(-1)
    sd = theta[..., 1].abs() if coordinates == "sigma" else theta[..., 1].exp()
    kl = torch.distributions.kl_divergence(
        torch.distributions.Normal(theta[..., 0], sd), torch.distributions.Normal(0.1, 0.5)
    )
    se = kl.std(0) / math.sqrt(n)
    assert ((got - kl.mean(0)).abs() < 4 * se).all(), (got, kl.mean(0), se)


def test_expected_normal_kl_rejects_unknown_coordinates():
    with pytest.raises(ValueError, match="coordinates must be"):
        expected_normal_kl(torch.zeros(1, 2), torch.eye(2)[None], 0.0, 1.0, "polar")
