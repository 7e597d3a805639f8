"""A last-layer Laplace under a BNN's draws of the body (``experiments/body_laplace.py``,
the study rows of ``experiments/uncertainty.py``): known answers where the body's spread
vanishes, and the curvature's change where it does not (digits, a trained mean-field
MLP)."""

from __future__ import annotations

import copy

import pytest
import torch

from twodg_pyro.data import make_loader
from twodg_pyro.methods import GuidePosterior, fit_laplace
from twodg_pyro.methods.laplace_settings import LaplaceConfig

pytest.importorskip("laplace")

#: the Laplace fits' settings, around the mean network and under the body's draws alike
SETTINGS = LaplaceConfig(marglik_steps=30)


def _settled(model, guide, sites=None):
    """A copy of the guide whose scales (of ``sites``; all by default) are about 1e-13."""
    guide = copy.deepcopy(guide)
    with torch.no_grad():
        for name, rho in guide.rhos.items():
            if sites is None or name in sites:
                rho.fill_(-30.0)
    return GuidePosterior(model, guide)


@pytest.fixture(scope="module")
def study():
    import body_laplace  # experiments/ is on the tests' path (pyproject)

    return body_laplace


@pytest.fixture(scope="module")
def loader(digits):
    return make_loader(digits.train, 256)


def test_a_settled_body_gives_the_mean_networks_laplace(study, trained_mean_field, loader, digits):
    """Body scales of ~1e-13: the fit under the body's draws is the fit around the mean
    network (the same Kronecker factors and prior precision), and the body-draw
    predictive is the Laplace posterior's own (the same last-layer draws; its linearised
    predictive against our drawn weights: float32 rounding, 2e-5 here)."""
    model, guide = trained_mean_field
    bnn = _settled(model, guide)
    around = fit_laplace(bnn.mean_network(), loader, SETTINGS)
    under = study.fit_under_body_draws(bnn, loader, SETTINGS, seed=0)
    assert under.param_names == around.param_names == ["layers.2.weight", "layers.2.bias"]
    for a, b in zip(under.factors, around.factors, strict=True):
        for fa, fb in zip(a, b, strict=True):
            torch.testing.assert_close(fa, fb, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(under.prior_precision, around.prior_precision, rtol=1e-4, atol=0)
    x = digits.test.tensors[0][:200]
    row = study.BodyDrawLaplace(bnn, around, "body draws")
    torch.testing.assert_close(
        row.sample_probs(x, 12, seed=3), around.sample_probs(x, 12, seed=3), rtol=0, atol=1e-4
    )


def test_the_body_draws_are_the_posteriors_own(study, trained_mean_field, loader, digits):
    """The last layer settled, the Laplace head at a vanishing variance: every draw of the
    row is the plain posterior's draw of the same seed (its chunks of 10 included)."""
    model, guide = trained_mean_field
    last = {"layers__2__weight", "layers__2__bias"}
    assert last <= set(guide.rhos), list(guide.rhos)
    bnn = _settled(model, guide, last)
    head = fit_laplace(bnn.mean_network(), loader, marglik_steps=0)
    head.prior_precision.fill_(1e14)
    x = digits.test.tensors[0][:200]
    row = study.BodyDrawLaplace(bnn, head, "body draws")
    mine, plain = row.sample_probs(x, 25, seed=1), bnn.sample_probs(x, 25, seed=1)
    torch.testing.assert_close(mine, plain, rtol=0, atol=1e-4)  # vmapped there: 1e-5
    # and the body does spread: the draws differ
    assert float((plain - plain.mean(0)).abs().amax()) > 1e-2


def test_under_the_body_draws_the_curvature_moves(study, trained_mean_field, loader):
    """With the trained body's spread, the averaged curvature differs from the mean
    network's, and the fit is seeded: the same seed gives the same factors."""
    model, guide = trained_mean_field
    bnn = GuidePosterior(model, guide)
    around = fit_laplace(bnn.mean_network(), loader, SETTINGS)
    under = study.fit_under_body_draws(bnn, loader, SETTINGS, seed=0)
    again = study.fit_under_body_draws(bnn, loader, SETTINGS, seed=0)
    (a_in, _), (u_in, _) = around.factors[0], under.factors[0]
    assert float((u_in - a_in).norm() / a_in.norm()) > 1e-3
    for a, b in zip(under.factors, again.factors, strict=True):
        for fa, fb in zip(a, b, strict=True):
            torch.testing.assert_close(fa, fb, rtol=0, atol=0)


def test_a_laplace_over_all_layers_is_refused(study, trained_mean_field, digits):
    model, guide = trained_mean_field
    bnn = GuidePosterior(model, guide)
    few = make_loader(torch.utils.data.Subset(digits.train, range(64)), 64)  # the fit's size
    post = fit_laplace(bnn.mean_network(), few, subset="all", hessian="diag", marglik_steps=0)
    with pytest.raises(ValueError, match="last-layer Laplace is needed, not subset = 'all'"):
        study.BodyDrawLaplace(bnn, post, "body draws")
