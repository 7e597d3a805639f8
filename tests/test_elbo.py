"""The ELBO's KL terms against closed forms and Monte Carlo, and its scaling."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import DecomposedELBO
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.priors import LaplacePrior, NormalPrior


def _model(prior):
    torch.manual_seed(0)
    return BNNModel(
        nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)),
        prior=prior,
        likelihood=Categorical(200),
    )


def test_analytic_kl_equals_closed_form_and_monte_carlo():
    model = _model(NormalPrior(0.7))
    guide = MeanFieldGuide(model, init_scale=0.3)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    terms = DecomposedELBO().loss_terms(model, guide, x, y)
    # closed form: sum_i log(s_p/s_i) + (s_i^2 + mu_i^2)/(2 s_p^2) - 1/2
    closed = 0.0
    mc = 0.0
    for site in model.sites:
        mu, s = guide.loc(site.name).detach(), guide.scale(site.name).detach()
        closed += (torch.log(0.7 / s) + (s**2 + mu**2) / (2 * 0.7**2) - 0.5).sum()
        q = dist.Normal(mu, s)
        w = q.sample((20000,))
        mc += (
            (q.log_prob(w) - dist.Normal(0.0, 0.7).log_prob(w)).sum(tuple(range(1, w.dim()))).mean()
        )
    assert terms["kl"].item() == pytest.approx(closed.item(), rel=1e-5)
    assert terms["kl"].item() == pytest.approx(mc.item(), rel=0.02)


def test_laplace_prior_uses_an_unbiased_monte_carlo_kl():
    model = _model(LaplacePrior(0.5))
    guide = MeanFieldGuide(model, init_scale=0.2)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    elbo = DecomposedELBO()
    with torch.no_grad():
        estimates = torch.stack([elbo.loss_terms(model, guide, x, y)["kl"] for _ in range(400)])
    # exact: E_q[log q] - E_q[log p] = -H(q) + log(2b) + E|w|/b, E|w| of a folded normal
    exact = 0.0
    for site in model.sites:
        mu, s = guide.loc(site.name).detach(), guide.scale(site.name).detach()
        entropy = 0.5 * torch.log(2 * torch.pi * torch.e * s**2)
        folded = s * (2 / torch.pi) ** 0.5 * torch.exp(-(mu**2) / (2 * s**2)) + mu * (
            1 - 2 * dist.Normal(0.0, 1.0).cdf(-mu / s)
        )
        exact += (-entropy + torch.log(torch.tensor(1.0)) + folded / 0.5).sum()
    se = estimates.std() / 400**0.5
    assert abs(estimates.mean() - exact) < 4 * se + 1e-3


def test_nll_is_scaled_to_the_dataset_and_beta_weights_kl():
    model = _model(NormalPrior(1.0))
    guide = MeanFieldGuide(model, init_scale=1e-6)  # practically deterministic weights
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    elbo = DecomposedELBO(beta=0.25)
    terms = elbo.loss_terms(model, guide, x, y)
    logits = model.network_forward({n: guide.loc(n) for n in model.site_names}, x)
    ce = torch.nn.functional.cross_entropy(logits, y, reduction="mean")
    assert terms["nll"].item() == pytest.approx(200 * ce.item(), rel=1e-3)
    loss = elbo.differentiable_loss(model, guide, x, y)
    assert loss.item() == pytest.approx((terms["nll"] + 0.25 * terms["kl"]).item(), rel=1e-3)


def test_works_with_pyro_svi_and_as_a_module():
    model = _model(NormalPrior(1.0))
    guide = MeanFieldGuide(model, init_scale=0.1)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    loss_module = DecomposedELBO()(model, guide)
    assert isinstance(loss_module, nn.Module)
    params = [p for p in loss_module.parameters() if p.requires_grad]
    assert len(params) == 8  # loc and rho of 4 sites
    before = guide.loc("0.weight").detach().clone()
    opt = torch.optim.Adam(params, lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        loss_module(x, y).backward()
        opt.step()
    assert not torch.allclose(before, guide.loc("0.weight"))
    with pytest.raises(ValueError, match="num_particles must be at least 1"):
        DecomposedELBO(num_particles=0)
    pyro.clear_param_store()
