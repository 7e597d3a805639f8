"""The shared-GMM guide on a hand-made sharing structure: draws, Eq. 10 KL terms,
gradients, save/load."""

import json

import pyro.distributions as dist
import pytest
import torch
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.files.integrity import seal
from twodg_pyro.guides import SharedGMMGuide
from twodg_pyro.infer import DecomposedELBO
from twodg_pyro.io import load_2dg, save_2dg
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.prediction import predict
from twodg_pyro.priors import LaplacePrior, NormalPrior
from twodg_pyro.sharing import SharingStructure
from twodg_pyro.sharing.build import site_layouts

MEANS = torch.tensor([[0.10, 0.05], [-0.20, 0.10], [0.30, 0.02]])
COVS = torch.tensor(
    [[[4e-3, 1e-3], [1e-3, 2e-3]], [[1e-3, 0.0], [0.0, 1e-3]], [[2e-3, -5e-4], [-5e-4, 1e-3]]]
)


def make(prior=None, seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))  # 12 + 4 + 8 + 2 = 26
    model = BNNModel(
        net, prior=prior if prior is not None else NormalPrior(0.5), likelihood=Categorical(100)
    )
    sites, off = site_layouts(model.sites)
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(off, generator=g)
    structure = SharingStructure(
        sites=sites,
        coordinates="sigma",
        means=MEANS.clone(),
        covariances=COVS.clone(),
        outlier_index=perm[:4].sort().values,
        outlier_loc=torch.tensor([0.5, -0.4, 0.8, -1.0]),
        outlier_scale=torch.tensor([0.05, 0.1, 0.02, 0.2]),
        plain_index=perm[4:20].sort().values,
        plain_component=torch.arange(16) % 3,
        ellipse_index=perm[20:].sort().values,
        ellipse_components=torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2], [1, 0], [2, 1]]),
        ellipse_alphas=torch.tensor(
            [[0.7, 0.3], [0.5, 0.5], [0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]]
        ),
        inlier_points=torch.randn(22, 2, generator=g),
    )
    return model, structure


def _flat(w: dict, model) -> torch.Tensor:
    return torch.cat([w[n].reshape(w[n].shape[0], -1) for n in model.site_names], 1)


@pytest.mark.parametrize("tying", ["representative", "stochastic", "tied"])
def test_draws_have_the_intended_per_weight_mean_and_variance(tying):
    model, s = make()
    guide = SharedGMMGuide(model, s, tying)
    n = 40000
    with torch.no_grad():
        w = _flat(guide.sample_weights(n), model)
    mean, var = w.mean(0), w.var(0)
    m0, m1 = MEANS[:, 0], MEANS[:, 1]
    if tying == "representative":
        comp_mean, comp_second = m0, m1**2 + m0**2
    elif tying == "stochastic":  # mu~ ~ N(m0, S00), E[sigma~^2] = m1^2 + S11
        comp_mean, comp_second = m0, COVS[:, 0, 0] + m1**2 + COVS[:, 1, 1] + m0**2
    else:  # w = z_0, z ~ N(m, S)
        comp_mean, comp_second = m0, COVS[:, 0, 0] + m0**2
    exp_mean = torch.zeros(26)
    exp_var = torch.zeros(26)
    exp_mean[s.outlier_index] = s.outlier_loc
    exp_var[s.outlier_index] = s.outlier_scale**2
    exp_mean[s.plain_index] = comp_mean[s.plain_component]
    exp_var[s.plain_index] = comp_second[s.plain_component] - comp_mean[s.plain_component] ** 2
    a, c = s.ellipse_alphas, s.ellipse_components
    e_mean = (a * comp_mean[c]).sum(1)
    exp_mean[s.ellipse_index] = e_mean
    exp_var[s.ellipse_index] = (a * comp_second[c]).sum(1) - e_mean**2
    se = (exp_var / n).sqrt()
    assert ((mean - exp_mean).abs() < 5 * se + 1e-6).all()
    torch.testing.assert_close(var, exp_var, rtol=0.06, atol=1e-7)
    if tying == "tied":  # shared values: two plain weights of component 0 are identical
        first = s.plain_index[s.plain_component == 0][:2]
        torch.testing.assert_close(w[:, first[0]], w[:, first[1]])


def _kl_normal(m, sd, p_sd):
    return torch.log(p_sd / sd) + (sd**2 + m**2) / (2 * p_sd**2) - 0.5


def test_kl_terms_equal_their_definitions_for_a_normal_prior():
    model, s = make(NormalPrior(0.5))
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    n_k = torch.bincount(s.plain_component, minlength=3).float()
    n_k = n_k.index_add(0, s.ellipse_components.reshape(-1), s.ellipse_alphas.reshape(-1))
    kl_out = _kl_normal(s.outlier_loc, s.outlier_scale, 0.5).sum()
    elbo = DecomposedELBO()
    # representative: sum_k N_k KL(N(m_k0, m_k1^2) || p)
    rep = elbo.loss_terms(model, SharedGMMGuide(model, s, "representative"), x, y)
    expected = (n_k * _kl_normal(MEANS[:, 0], MEANS[:, 1], 0.5)).sum()
    assert rep["kl_inlier"].item() == pytest.approx(expected.item(), rel=1e-4)
    assert rep["kl_outlier"].item() == pytest.approx(kl_out.item(), rel=1e-4)
    # tied: sum_k KL(N(m_k0, S_k00) || p), one term per component
    tied = elbo.loss_terms(model, SharedGMMGuide(model, s, "tied"), x, y)
    expected = _kl_normal(MEANS[:, 0], COVS[:, 0, 0].sqrt(), 0.5).sum()
    assert tied["kl_inlier"].item() == pytest.approx(expected.item(), rel=1e-4)
    # stochastic: N_k E_{N(m_k, S_k)} KL(N(mu~, sigma~^2) || p), exact (no draw noise),
    # checked against a Monte Carlo estimate of the expectation and its standard error
    guide = SharedGMMGuide(model, s, "stochastic")
    with torch.no_grad():
        est = torch.stack([elbo.loss_terms(model, guide, x, y)["kl_inlier"] for _ in range(3)])
        theta = torch.distributions.MultivariateNormal(MEANS.double(), COVS.double()).sample(
            (400000,)
        )
        kl = _kl_normal(theta[..., 0], theta[..., 1].abs(), 0.5)
    assert torch.equal(est[0], est[1]) and torch.equal(est[0], est[2])
    truth, se = (n_k * kl.mean(0)).sum(), (n_k**2 * kl.var(0) / kl.shape[0]).sum().sqrt()
    assert abs(est[0].item() - truth.item()) < 4 * se.item() + 1e-4 * truth.item()


def _laplace_kl_estimates(tying: str, n: int):
    """The guide under a Laplace(0, 0.3) prior and ``n`` one-draw estimates of ``kl_inlier``."""
    model, s = make(LaplacePrior(0.3))
    guide = SharedGMMGuide(model, s, tying)
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    elbo = DecomposedELBO()
    with torch.no_grad():
        est = torch.stack([elbo.loss_terms(model, guide, x, y)["kl_inlier"] for _ in range(n)])
    return guide, est


def test_non_normal_prior_gives_unbiased_monte_carlo_kl():
    guide, est = _laplace_kl_estimates("representative", 2000)
    with torch.no_grad():
        # truth: sum_k N_k KL(N(m_k0, m_k1^2) || Laplace(0, 0.3)) by large Monte Carlo
        q = dist.Normal(MEANS[:, 0], MEANS[:, 1])
        w = q.sample((400000,))
        kl_k = (q.log_prob(w) - dist.Laplace(0.0, 0.3).log_prob(w)).mean(0)
    n_k = guide.component_counts()
    truth = (n_k * kl_k).sum()
    assert abs(est.mean() - truth) < 4 * est.std() / 2000**0.5 + 1e-3


def test_stochastic_monte_carlo_kl_is_unbiased_with_the_conditional_mu_draw():
    """Non-Normal prior: log N(w; mu~, sigma~^2) - log p(w) with mu~ drawn given (t, w)
    after the two-normal draw has the mean of the three-normal construction."""
    guide, est = _laplace_kl_estimates("stochastic", 1500)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        n = 400000
        z = torch.randn(n, 3, 2, generator=g, dtype=torch.float64)
        theta = MEANS.double() + (torch.linalg.cholesky(COVS.double()) @ z[..., None])[..., 0]
        mu, sd = theta[..., 0], theta[..., 1].abs()
        w = mu + sd * torch.randn(n, 3, generator=g, dtype=torch.float64)
        per = dist.Normal(mu, sd).log_prob(w) - dist.Laplace(0.0, 0.3).log_prob(w)
    n_k = guide.component_counts().double()
    truth, se_truth = (n_k * per.mean(0)).sum(), (n_k**2 * per.var(0) / n).sum().sqrt()
    se = (est.double().var() / est.numel() + se_truth**2).sqrt()
    assert abs(est.double().mean() - truth) < 4 * se
    # and its spread is that of independent per-weight terms (a mu~ drawn without
    # regard to w is heavy-tailed: its variance is orders of magnitude larger)
    assert est.double().var() < 1.5 * (n_k * per.var(0)).sum()


@pytest.mark.parametrize("tying", ["representative", "stochastic", "tied"])
def test_gradients_reach_centres_cholesky_and_outliers(tying):
    model, s = make()
    guide = SharedGMMGuide(model, s, tying)
    loss = DecomposedELBO().differentiable_loss(
        model, guide, torch.randn(8, 3), torch.randint(0, 2, (8,))
    )
    loss.backward()
    for p in (guide.centre_mu, guide.outlier_loc, guide.outlier_rho):
        assert p.grad is not None and p.grad.abs().sum() > 0
    if tying == "representative":
        assert guide.centre_raw.grad.abs().sum() > 0
        assert "chol_log_diag" not in dict(guide.named_parameters())
        assert guide.num_trainable() == 2 * 3 + 2 * 4
    else:
        assert guide.chol_log_diag.grad.abs().sum() > 0
        assert guide.num_trainable() == 5 * 3 + 2 * 4


def test_save_load_predicts_identically(tmp_path):
    model, s = make()
    guide = SharedGMMGuide(model, s, "stochastic")
    with torch.no_grad():
        guide.centre_mu.add_(0.01)  # a trained state differs from the structure it began with
    x = torch.randn(30, 3)
    path = tmp_path / "m.pt"
    save_2dg(path, model, guide)
    net2 = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model2, guide2 = load_2dg(path, net=net2)
    torch.manual_seed(7)
    a = predict(model, guide, x, num_samples=10).mean
    torch.manual_seed(7)
    b = predict(model2, guide2, x, num_samples=10).mean
    assert torch.equal(a, b)
    raw = torch.load(path, weights_only=True)  # plain tensors and strings only
    assert json.loads(raw["header"])["tying"] == "stochastic"


def test_bad_files_and_mismatches_are_clear_errors(tmp_path):
    model, s = make()
    guide = SharedGMMGuide(model, s)
    path = tmp_path / "m.pt"
    save_2dg(path, model, guide)
    payload = torch.load(path, weights_only=True)
    header = json.loads(payload["header"])
    header["format_version"] = 99
    payload["header"] = json.dumps(header)
    torch.save(seal(payload), tmp_path / "v99.pt")  # a consistent file of a future version
    with pytest.raises(ValueError, match="format version 99"):
        load_2dg(
            tmp_path / "v99.pt", net=nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        )
    with pytest.raises(ValueError, match="does not match"):
        load_2dg(path, net=nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)))
    other = BNNModel(nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)))
    with pytest.raises(ValueError, match="does not match the network"):
        SharedGMMGuide(other, s)
    with pytest.raises(ValueError, match="unknown tying 'shared'"):
        SharedGMMGuide(model, s, "shared")
    (tmp_path / "trunc.pt").write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated, corrupted"):
        load_2dg(tmp_path / "trunc.pt", net=nn.Linear(3, 2))


def test_structure_validation_rejects_overlaps():
    model, s = make()
    with pytest.raises(ValueError, match="exactly one of outlier"):
        SharingStructure(**{**s.__dict__, "outlier_index": s.plain_index[:4]})


def test_weight_sized_buffers_are_32_bit_and_old_state_dicts_still_load():
    model, s = make()
    guide = SharedGMMGuide(model, s, "tied")
    n_w = s.num_weights
    for name in ("plain_index", "plain_component", "nat_index"):
        assert getattr(guide, name).dtype == torch.int32, name
    # per weight: 3 int32 index entries and the 2 float32 coordinates of inlier points
    big = [b for b in guide.buffers() if b.numel() >= s.plain_index.numel()]
    assert sum(b.numel() * b.element_size() for b in big) <= 20 * n_w
    # a state dict of the earlier layout (64-bit indices, an unused inverse_order buffer)
    old = {k: v.clone() for k, v in guide.state_dict().items()}
    old["plain_index"], old["plain_component"] = s.plain_index.long(), s.plain_component.long()
    old["inverse_order"] = torch.arange(n_w)
    fresh = SharedGMMGuide(model, s, "tied")
    fresh.load_state_dict(old)  # strict: the legacy key is dropped, not an error
    assert torch.equal(fresh.plain_index, guide.plain_index)
    assert fresh.plain_index.dtype == torch.int32
    # the structure read back from the guide has the library's 64-bit indices
    back = guide.structure()
    assert back.plain_index.dtype == torch.long and torch.equal(back.plain_index, s.plain_index)
    assert back.plain_component.dtype == torch.long
