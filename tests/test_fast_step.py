"""The fast training step (``twodg_pyro.infer.fast_step``): the traced ELBO's loss and
gradients without tracing, for the mean-field guide and every shared-GMM tying, in
float32 and float64; the automatic fallback to tracing; the setting that turns it off."""

import json
import subprocess
import sys
from pathlib import Path

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from conftest import TiedLinears
from pyro.infer.autoguide import AutoNormal
from torch.utils.data import DataLoader, TensorDataset

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import load_digits_split
from twodg_pyro.guides import MeanFieldGuide, Rank1BNNModel, Rank1Guide, SharedGMMGuide, fast_normal
from twodg_pyro.infer import DecomposedELBO, fit
from twodg_pyro.likelihoods import Categorical, Gaussian
from twodg_pyro.models import MLP, LeNet5
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.priors import (
    LaplacePrior,
    LayerwiseNormalPrior,
    NormalPrior,
    PretrainedPrior,
    Prior,
)
from twodg_pyro.sharing import SharingStructure
from twodg_pyro.sharing.build import site_layouts

TYINGS = ["representative", "stochastic", "tied"]
STAGE3 = [f"stage3_{t}" for t in TYINGS]
PRIORS = {
    "normal": lambda net: NormalPrior(0.5),
    "layerwise": lambda net: LayerwiseNormalPrior(),
    "pretrained": lambda net: PretrainedPrior.from_network(net, 0.1, 0.5),
    "laplace": lambda net: LaplacePrior(0.3),
}


def _structure(model, K=6, seed=0):
    """1% outliers, 3% ellipse weights over 3 components each, the rest plain inliers."""
    g = torch.Generator().manual_seed(seed)
    sites, off = site_layouts(model.sites)
    perm = torch.randperm(off, generator=g)
    n_out, n_ell = max(1, off // 100), max(1, 3 * off // 100)
    out, ell, plain = perm[:n_out], perm[n_out : n_out + n_ell], perm[n_out + n_ell :]
    alphas = torch.rand(n_ell, 3, generator=g)
    return SharingStructure(
        sites=sites,
        coordinates="sigma",
        means=torch.stack([torch.linspace(-0.2, 0.2, K), torch.full((K,), 0.02)], 1),
        covariances=torch.tensor([[1e-4, 2e-5], [2e-5, 1e-4]]).expand(K, 2, 2),
        outlier_index=out.sort().values,
        outlier_loc=torch.randn(n_out, generator=g) * 0.3,
        outlier_scale=torch.full((n_out,), 0.01),
        plain_index=plain.sort().values,
        plain_component=torch.randint(0, K, (plain.numel(),), generator=g),
        ellipse_index=ell.sort().values,
        ellipse_components=torch.randint(0, K, (n_ell, 3), generator=g),
        ellipse_alphas=alphas / alphas.sum(1, keepdim=True),
        inlier_points=torch.randn(off - n_out, 2, generator=g),
    )


def _guide(kind, model):
    return (
        MeanFieldGuide(model)
        if kind == "mean_field"
        else SharedGMMGuide(model, _structure(model), kind)
    )


def _step(kind, prior, dtype, fast, particles=1, fused=False, size=8):
    """Terms and guide gradients of one step on LeNet-5 (``size`` x ``size`` inputs: 8, the
    digits; 28, MNIST, whose ``fc1`` holds 48,000 weights)."""
    torch.manual_seed(0)
    net = LeNet5(10, 1, size).to(dtype)
    model = BNNModel(net, prior=PRIORS[prior](net), likelihood=Categorical(500))
    guide = _guide(kind, model)
    x, y = torch.randn(16, 1, size, size), torch.randint(0, 10, (16,))
    elbo = DecomposedELBO(num_particles=particles, beta=0.7, fast_step=fast, fused_kl=fused)
    torch.manual_seed(1)
    terms = elbo.loss_terms(model, guide, x, y)
    elbo.combine(terms).backward()
    grads = {n: p.grad.clone() for n, p in guide.named_parameters() if p.grad is not None}
    return elbo, {k: v.detach() for k, v in terms.items()}, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["mean_field", *TYINGS])
def test_fast_step_has_the_traced_loss_and_gradients(kind, dtype):
    priors = ["normal", "pretrained"] + ([] if kind == "mean_field" else ["laplace"])
    for prior in priors:
        if kind == "tied" and prior == "pretrained":
            continue  # tied refuses a per-weight prior
        fast, t_fast, g_fast = _step(kind, prior, dtype, fast=True, particles=2)
        traced, t_traced, g_traced = _step(kind, prior, dtype, fast=False, particles=2)
        assert fast.step_path == "fast" and traced.step_path == "traced", prior
        assert list(t_fast) == list(t_traced)  # the same terms, in the same order
        tol = {"rtol": 1e-6, "atol": 0.0} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 0}
        for k in t_traced:
            torch.testing.assert_close(t_fast[k], t_traced[k], **tol)
        assert g_fast.keys() == g_traced.keys() and g_traced
        for n in g_traced:
            # two particles: a weight's four gradient contributions (two draws, two KLs)
            # are added in another order (the mean-field guide adds each particle's draw
            # and KL first), so a sum that cancels differs in its last bits
            scale = g_traced[n].abs().max()
            torch.testing.assert_close(
                g_fast[n], g_traced[n], rtol=tol["rtol"], atol=tol["rtol"] * scale
            )


@pytest.mark.parametrize("size", [8, 28])
@pytest.mark.parametrize("kind", ["mean_field", *TYINGS])
def test_fast_step_is_the_traced_step_bit_for_bit_on_the_cpu(kind, size):
    """Same random numbers, same operations: what keeps committed results reproducible
    (one particle, as every recipe trains)."""
    _, t_fast, g_fast = _step(kind, "layerwise", torch.float32, fast=True, size=size)
    _, t_traced, g_traced = _step(kind, "layerwise", torch.float32, fast=False, size=size)
    assert all(torch.equal(t_fast[k], t_traced[k]) for k in t_traced)
    assert g_fast.keys() == g_traced.keys() and g_traced
    assert all(torch.equal(g_fast[n], g_traced[n]) for n in g_traced)


@pytest.mark.parametrize("size", [8, 28])
def test_the_site_by_site_mean_field_step_is_the_traced_step_bit_for_bit(size, monkeypatch):
    """Above ``FLAT_UP_TO`` weights the mean-field draw and KL run site by site: the same
    bits as the concatenated layout and as tracing."""
    _, t_flat, g_flat = _step("mean_field", "layerwise", torch.float32, fast=True, size=size)
    monkeypatch.setattr(fast_normal, "FLAT_UP_TO", 0)
    _, t_fast, g_fast = _step("mean_field", "layerwise", torch.float32, fast=True, size=size)
    _, t_traced, g_traced = _step("mean_field", "layerwise", torch.float32, fast=False, size=size)
    for terms in (t_flat, t_fast):
        assert all(torch.equal(terms[k], t_traced[k]) for k in t_traced)
    for grads in (g_flat, g_fast):
        assert grads.keys() == g_traced.keys()
        assert all(torch.equal(grads[n], g_traced[n]) for n in g_traced)


def test_a_trained_prior_gets_the_traced_gradient_from_the_flat_mean_field_step():
    """A prior whose parameters take gradients (here one learnt scale for every weight):
    the flat draw and KL reduce its gradient site by site, as the traced step does."""

    class LearntScale(Prior):
        def __init__(self):
            self.log_scale = torch.zeros((), requires_grad=True)

        def site_distribution(self, site):
            return dist.Normal(torch.zeros(()), self.log_scale.exp(), validate_args=False)

    results = []
    for fast in (True, False):
        torch.manual_seed(0)
        prior = LearntScale()
        model = BNNModel(LeNet5(10, 1, 8), prior=prior, likelihood=Categorical(500))
        guide = MeanFieldGuide(model)
        x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
        elbo = DecomposedELBO(beta=0.7, fast_step=fast)
        torch.manual_seed(1)
        elbo.combine(elbo.loss_terms(model, guide, x, y)).backward()
        results.append((elbo.step_path, prior.log_scale.grad.clone()))
    assert [r[0] for r in results] == ["fast", "traced"]
    assert results[0][1] != 0 and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", TYINGS)
def test_fused_kl_is_the_traced_bound_to_float_rounding(kind, dtype):
    """All sites' KL at once (one Normal prior per site): the same terms and gradients up
    to rounding; a per-weight or non-Normal prior takes the site-by-site terms."""
    tol = {"rtol": 2e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    for prior in ("normal", "layerwise", "pretrained", "laplace"):
        if kind == "tied" and prior == "pretrained":
            continue
        _, t_fused, g_fused = _step(kind, prior, dtype, fast=True, fused=True)
        _, t_traced, g_traced = _step(kind, prior, dtype, fast=False)
        assert list(t_fused) == list(t_traced)
        site_by_site = prior in ("pretrained", "laplace")
        for k in t_traced:
            if site_by_site:
                assert torch.equal(t_fused[k], t_traced[k]), (prior, k)
            torch.testing.assert_close(t_fused[k], t_traced[k], **tol)
        for n in g_traced:
            torch.testing.assert_close(g_fused[n], g_traced[n], **tol)


@pytest.mark.parametrize("packed", [False, True])
def test_fused_mean_field_draw_and_kl_are_the_closed_forms_with_their_gradients(packed):
    """The fused node (twodg_pyro.guides.fast_normal): w = mu + eps softplus(rho) and the
    Normal-Normal KL over two sites, against torch's KL, and its hand-written gradients
    against finite differences (a learnt prior's too), float64; with the sites' tensors
    apart and laid end to end (flat views, twodg_pyro.nn.flat_storage)."""
    from twodg_pyro.guides.fast_normal import _DrawKL
    from twodg_pyro.nn.flat_storage import flat_view, pack

    g = torch.Generator().manual_seed(0)
    shapes, n = [(3,), (2, 2)], 7
    eps, m = (torch.randn(n, generator=g, dtype=torch.float64) for _ in range(2))
    s = torch.rand(n, generator=g, dtype=torch.float64) + 0.2
    sites = [torch.randn(sh, generator=g, dtype=torch.float64) for sh in shapes * 2]
    if packed:
        assert pack(sites[:2]) and pack(sites[2:]) and flat_view(sites[2:]) is not None
    kl, *ws = _DrawKL.apply(eps, m, s, None, None, 2, *sites)
    loc, rho = (torch.cat([t.reshape(-1) for t in ts]) for ts in (sites[:2], sites[2:]))
    sigma = torch.nn.functional.softplus(rho)
    assert [w.shape for w in ws] == [torch.Size(sh) for sh in shapes]
    assert torch.equal(torch.cat([w.reshape(-1) for w in ws]), loc + eps * sigma)
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(loc, sigma), torch.distributions.Normal(m, s)
    ).sum()
    torch.testing.assert_close(kl, ref, rtol=1e-12, atol=0)

    def node(out):  # the outputs out (all, the draws only, or the KL only) of the node
        return lambda e, m, s, *sites: _DrawKL.apply(e, m, s, None, None, 2, *sites)[out]

    args = [eps, m.clone().requires_grad_(), s.clone().requires_grad_()]
    args += [t.requires_grad_() for t in sites]
    assert torch.autograd.gradcheck(node(slice(None)), args)
    assert torch.autograd.gradcheck(node(slice(1, None)), args)
    assert torch.autograd.gradcheck(node(0), args)


def test_one_draw_runs_in_the_networks_parameter_slots_as_functional_call_runs_it():
    """run_network puts one draw's tensors in the network's parameter slots for the call:
    functional_call's output and gradients bit for bit, the network's own parameters back
    after it (after an error too); a site whose parameter is shared with a name that is no
    site runs through functional_call, which ties the two."""
    from torch.func import functional_call

    torch.manual_seed(0)
    model = BNNModel(LeNet5(10, 1, 8), likelihood=Categorical(100))
    own = [p for _, p in model.net.named_parameters()]
    x = torch.randn(4, 1, 8, 8)
    draws = {s.name: torch.randn(s.shape, requires_grad=True) for s in model.sites}
    out = model.run_network(draws, x)
    ref = functional_call(model.net, draws, (x,), strict=False)
    assert torch.equal(out, ref)
    grads = torch.autograd.grad(out.square().sum(), list(draws.values()))
    ref_grads = torch.autograd.grad(ref.square().sum(), list(draws.values()))
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads, strict=True))
    assert all(a is b for a, (_, b) in zip(own, model.net.named_parameters(), strict=True))
    with pytest.raises(ValueError, match="input"):
        model.run_network(draws, torch.randn(4, 3, 8, 8))  # three channels for one
    assert all(a is b for a, (_, b) in zip(own, model.net.named_parameters(), strict=True))

    tied = BNNModel(TiedLinears(), likelihood=10, include=["a.*"])
    draws = {s.name: torch.randn(s.shape) for s in tied.sites}
    x = torch.randn(3, 4)
    ref = functional_call(tied.net, draws, (x,), strict=False)
    assert torch.equal(tied.run_network(draws, x), ref)
    assert not torch.equal(ref, tied.net(x))  # b's weight is the drawn one too


def test_categorical_log_prob_is_torchs_bit_for_bit():
    """The likelihood's per-example log-probability without building the distribution:
    torch's Categorical log_prob to the bit, with leading particle dimensions too."""
    g = torch.Generator().manual_seed(0)
    lik = Categorical(50)
    y = torch.randint(0, 10, (32,), generator=g)
    for shape in ((32, 10), (5, 32, 10)):
        logits = torch.randn(shape, generator=g) * 4
        assert torch.equal(lik.log_prob(logits, y), lik.distribution(logits).log_prob(y))


@pytest.mark.parametrize("kind", ["mean_field", "stochastic"])
def test_fit_on_digits_trains_the_same_guide_fast_or_traced(kind):
    split = load_digits_split(seed=0)
    x, y = split.train.tensors
    data = TensorDataset(x[:256], y[:256])
    states = []
    for fast in (True, False):
        torch.manual_seed(0)
        model = BNNModel(MLP(64, (16,), 10), likelihood=Categorical(256))
        guide = _guide(kind, model)
        gen = torch.Generator().manual_seed(0)
        loader = DataLoader(data, batch_size=64, shuffle=True, generator=gen)
        elbo = DecomposedELBO(fast_step=fast)
        state = fit(model, guide, loader, epochs=3, lr=1e-2, elbo=elbo, progress=False)
        assert elbo.step_path == ("fast" if fast else "traced")
        states.append((state, guide))
    (s1, g1), (s2, g2) = states
    assert s1.history == s2.history
    assert s1.history[-1]["loss"] < s1.history[0]["loss"]  # it trained
    for (n, p), (_, q) in zip(g1.named_parameters(), g2.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_fused_von_fit_in_float64_is_the_traced_fit_to_rounding():
    """Stage 1's natural-gradient trainer on the fused mean-field step, float64 end to end
    on digits: the parameters the traced step trains, to rounding, and it learns."""
    import functools

    from twodg_pyro.infer import VariationalOnlineNewton

    split = load_digits_split(seed=0)
    x, y = split.train.tensors
    data = TensorDataset(x[:256].double(), y[:256])
    von = functools.partial(VariationalOnlineNewton, kl_weight=0.5, warmup_steps=2)
    fits = []
    for fused, fast in ((True, True), (False, False)):
        torch.manual_seed(0)
        model = BNNModel(MLP(64, (16,), 10).double(), likelihood=Categorical(256))
        guide = MeanFieldGuide(model, init_scale=1e-2)
        gen = torch.Generator().manual_seed(0)
        loader = DataLoader(data, batch_size=64, shuffle=True, generator=gen)
        elbo = DecomposedELBO(beta=0.5, fast_step=fast, fused_kl=fused)
        state = fit(
            model, guide, loader, epochs=4, lr=0.05, elbo=elbo, optimizer=von, progress=False
        )
        assert elbo.step_path == ("fast" if fast else "traced")
        assert guide.loc("layers.0.weight").dtype == torch.float64
        fits.append((state, guide))
    (s1, g1), (s2, g2) = fits
    assert s1.history[-1]["loss"] < s1.history[0]["loss"]  # it trained
    for k in ("loss", "nll"):
        assert s1.history[-1][k] == pytest.approx(s2.history[-1][k], rel=1e-9), k
    for (n, p), (_, q) in zip(g1.named_parameters(), g2.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=n)


def _fallback(model, guide, x, y):
    elbo = DecomposedELBO()
    terms = elbo.loss_terms(model, guide, x, y)
    assert torch.isfinite(elbo.combine(terms))
    return elbo


def test_unsupported_guides_priors_likelihoods_fall_back_to_tracing():
    torch.manual_seed(0)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    model = BNNModel(MLP(6, (5,), 3), prior=LaplacePrior(0.3), likelihood=Categorical(50))
    elbo = _fallback(model, MeanFieldGuide(model), x, y)  # Laplace: no closed-form KL here
    assert elbo.step_path == "traced" and "LaplacePrior" in elbo.fallback_reason
    shared = SharedGMMGuide(model, _structure(model), "representative")
    assert _fallback(model, shared, x, y).step_path == "fast"  # it takes any prior

    model = BNNModel(MLP(6, (5,), 3), prior=1.0, likelihood=Categorical(50))
    pyro.clear_param_store()
    auto = AutoNormal(model)
    with poutine.block():
        auto(x, y)
    elbo = _fallback(model, auto, x, y)
    assert elbo.step_path == "traced" and "AutoNormal" in elbo.fallback_reason

    rank1 = Rank1BNNModel(MLP(6, (5,), 3), components=2, likelihood=Categorical(50))
    elbo = _fallback(rank1, Rank1Guide(rank1), x, y)
    assert elbo.step_path == "traced" and "Rank1BNNModel" in elbo.fallback_reason

    class MyLikelihood(Categorical):
        pass

    mine = BNNModel(MLP(6, (5,), 3), prior=1.0, likelihood=MyLikelihood(50))
    elbo = _fallback(mine, MeanFieldGuide(mine), x, y)
    assert elbo.step_path == "traced" and "MyLikelihood" in elbo.fallback_reason

    guide = MeanFieldGuide(model)
    with poutine.scale(scale=1.0):  # a handler must see the sites: traced
        elbo = _fallback(model, guide, x, y)
    assert elbo.step_path == "traced" and "handler" in elbo.fallback_reason

    elbo = DecomposedELBO(fast_step=False)
    elbo.loss_terms(model, guide, x, y)
    assert elbo.step_path == "traced" and elbo.fallback_reason is None


def test_regression_and_a_changed_prior_take_the_fast_step():
    torch.manual_seed(0)
    x, y = torch.randn(8, 6), torch.randn(8)
    model = BNNModel(MLP(6, (5,), 1), prior=NormalPrior(1.0), likelihood=Gaussian(50, 0.5))
    guide = MeanFieldGuide(model)
    results = []
    for fast in (True, False):
        torch.manual_seed(3)
        elbo = DecomposedELBO(fast_step=fast)
        results.append(elbo.loss_terms(model, guide, x, y))
        assert elbo.step_path == ("fast" if fast else "traced")
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[1])
    # the priors are made once per setting: a changed setting is seen at the next step
    elbo = DecomposedELBO()
    before = elbo.loss_terms(model, guide, x, y)["kl"]
    model.prior.scale = 0.1
    after = elbo.loss_terms(model, guide, x, y)["kl"]
    torch.manual_seed(0)
    traced = DecomposedELBO(fast_step=False).loss_terms(model, guide, x, y)["kl"]
    assert after > before and torch.equal(after, traced)


def test_the_setting_turns_the_fast_step_off_and_the_run_is_the_same(tmp_path):
    tiny = {
        "methods": ["mean_field", "2dg"],
        "num_samples": 2,
        "progress": False,
        "network": {"hidden": [16]},
        "stage1": {"epochs": 2, "deterministic_epochs": 1},
        "sharing": {"outlier_rule": "quantile", "n_components": 4, "n_min": 5, "k_nearest": 4},
        "stage3": {"epochs": 2, "tying": "stochastic"},
        "diagnostics": {"enabled": False},
    }
    assert config_from_dict(tiny).fast_step is True
    with pytest.raises(ValueError, match="fast_step"):
        config_from_dict({**tiny, "fast_step": "sometimes"})
    fast = run(config_from_dict(tiny), tmp_path / "fast")
    traced = run(config_from_dict({**tiny, "fast_step": False}), tmp_path / "traced")
    assert fast.trained["2dg"].state.elbo.step_path == "fast"
    assert traced.trained["2dg"].state.elbo.step_path == "traced"
    for a, b in zip(fast.records, traced.records, strict=True):
        assert {k: a[k] for k in ("accuracy", "nll", "ece")} == {
            k: b[k] for k in ("accuracy", "nll", "ece")
        }


@pytest.mark.slow
def test_gpu_check_step_section_runs_its_imagenet_configurations_on_the_cpu(tmp_path):
    """``gpu_check.py --sections steps --smoke``: ResNet-18 and ResNet-50 (the GPU
    configurations' networks at a tiny size), every contender, its path and its ratios."""
    script = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
    cmd = [sys.executable, str(script), "--device", "cpu", "--sections", "steps", "--smoke"]
    subprocess.run([*cmd, "--out", str(tmp_path)], check=True, capture_output=True, timeout=900)
    payload = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    steps = payload["sections"]["steps"]
    assert payload["sections"]["steps"]["status"] == "ok"
    for config in ("resnet18_224_b128_smoke", "resnet50_224_b64_smoke"):
        results = steps[config]
        for name in ("deterministic", "mean_field", "mean_field_traced", *STAGE3):
            assert results[name]["step_ms_median"] > 0, (config, name, results[name])
        assert results["mean_field"]["step_path"] == "fast"
        assert results["mean_field_traced"]["step_path"] == "traced"
        assert all(results[n]["step_path"] == "fast" for n in STAGE3)
        ratios = results["ratios"]
        assert set(ratios["to_mean_field"]) == set(STAGE3)
        assert "mean_field_to_deterministic" in ratios["targets_met"]
    assert "x mean-field" in (tmp_path / "gpu_check_cpu.md").read_text()
