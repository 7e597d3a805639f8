"""Stock Pyro inference on the library's models and guides: SVI with pyro.optim trains
every guide, stock ELBOs agree with DecomposedELBO (or refuse clearly), Predictive
(sequential and parallel) agrees with predict, the logits site, Pyro's autoguides with
fit and predict, and the param store when fit and SVI are mixed."""

from __future__ import annotations

import math
import pickle

import pyro
import pyro.optim
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoNormal

from twodg_pyro.bnn import LOGITS_SITE, BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.guides import MeanFieldGuide, NoSiteDensityError, SharedGMMGuide
from twodg_pyro.guides.rank1 import Rank1BNNModel, Rank1Guide
from twodg_pyro.guides.ssvi import SSVIGuide
from twodg_pyro.infer import DecomposedELBO, fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.metrics import accuracy
from twodg_pyro.models import MLP
from twodg_pyro.prediction import predict
from twodg_pyro.sharing import SharingStructure
from twodg_pyro.sharing.build import site_layouts

GUIDES = ["mean_field", "representative", "stochastic", "tied", "rank1", "ssvi"]


@pytest.fixture(autouse=True)
def _clean_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _structure(model, n_components=6, seed=0) -> SharingStructure:
    """A random sharing structure: 5% outliers, 5% ellipse weights, the rest plain."""
    g = torch.Generator().manual_seed(seed)
    sites, off = site_layouts(model.sites)
    perm = torch.randperm(off, generator=g)
    n_out, n_ell = off // 20, off // 20
    out, ell, plain = perm[:n_out], perm[n_out : n_out + n_ell], perm[n_out + n_ell :]
    K = n_components
    alphas = torch.rand(n_ell, 3, generator=g) + 0.1
    return SharingStructure(
        sites=sites,
        coordinates="sigma",
        means=torch.stack([torch.linspace(-0.3, 0.3, K), torch.full((K,), 0.05)], 1),
        covariances=torch.tensor([[4e-3, 1e-3], [1e-3, 2e-3]]).expand(K, 2, 2).clone(),
        outlier_index=out.sort().values,
        outlier_loc=torch.randn(n_out, generator=g) * 0.3,
        outlier_scale=torch.full((n_out,), 0.05),
        plain_index=plain.sort().values,
        plain_component=torch.randint(0, K, (plain.numel(),), generator=g),
        ellipse_index=ell.sort().values,
        ellipse_components=torch.stack([torch.randperm(K, generator=g)[:3] for _ in range(n_ell)]),
        ellipse_alphas=alphas / alphas.sum(1, keepdim=True),
        inlier_points=torch.randn(off - n_out, 2, generator=g),
    )


def make(kind: str, n_train: int, seed: int = 0):
    """``(model, guide)`` of one kind on a 64-16-10 MLP for digits."""
    torch.manual_seed(seed)
    if kind == "rank1":
        model = Rank1BNNModel(MLP(64, (16,), 10), likelihood=n_train, components=3)
        return model, Rank1Guide(model, init_scale=0.05)
    model = BNNModel(MLP(64, (16,), 10), prior=1.0, likelihood=Categorical(n_train))
    if kind == "mean_field":
        return model, MeanFieldGuide(model, init_scale=0.05)
    if kind == "ssvi":
        return model, SSVIGuide(model, density=0.3, init_scale=0.05)
    return model, SharedGMMGuide(model, _structure(model), tying=kind)


def _xy(digits, n=128):
    x, y = digits.train.tensors
    return x[:n], y[:n]


# ---------------------------------------------------------------- SVI trains every guide
@pytest.mark.parametrize("kind", [k for k in GUIDES if k != "tied"])
def test_stock_svi_trains_every_guide_and_the_param_store_holds_it(kind, digits, tmp_path):
    model, guide = make(kind, len(digits.train))
    x, y = _xy(digits)
    before = {n: p.detach().clone() for n, p in guide.named_parameters()}
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    losses = [svi.step(x, y) for _ in range(5)]
    assert all(math.isfinite(v) for v in losses)
    for name, p in guide.named_parameters():
        assert not torch.equal(p, before[name]), f"{kind}: {name} did not move"
    store = pyro.get_param_store()
    for name, p in guide.named_parameters():  # the store holds the guide's own tensors
        assert store._params[f"{guide.pyro_name}.{name}"] is p
    # and Pyro's own save/load round-trips them
    path = tmp_path / "params.pt"
    store.save(path)
    saved = {n: p.detach().clone() for n, p in guide.named_parameters()}
    pickle.dumps(guide)  # the store's weak references do not break pickling
    pyro.clear_param_store()
    store.load(path)
    for name in saved:
        torch.testing.assert_close(store[f"{guide.pyro_name}.{name}"], saved[name])


def test_model_deterministic_parameters_are_trained_by_stock_svi(digits):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16))
    net.append(torch.nn.ReLU())
    net.append(torch.nn.Linear(16, 10))
    model = BNNModel(net, prior=1.0, likelihood=Categorical(len(digits.train)))
    guide = MeanFieldGuide(model, init_scale=0.05)
    bn = dict(net.named_parameters())["1.weight"]
    start = bn.detach().clone()
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    for _ in range(3):
        svi.step(*_xy(digits))
    assert not torch.equal(bn, start)
    assert pyro.get_param_store()._params["BNNModel.net.1.weight"] is bn


def test_svi_trains_under_module_local_params_without_touching_the_store(digits):
    model, guide = make("representative", len(digits.train))
    before = guide.centre_mu.detach().clone()
    with pyro.settings.context(module_local_params=True):
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
        for _ in range(3):
            svi.step(*_xy(digits))
    assert not torch.equal(guide.centre_mu, before)
    assert len(pyro.get_param_store()) == 0


# ---------------------------------------------------------------- stock ELBOs agree
def _losses(elbo, model, guide, x, y, n):
    with torch.no_grad():
        return torch.tensor([elbo.loss(model, guide, x, y) for _ in range(n)], dtype=torch.float64)


@pytest.mark.parametrize("kind", [k for k in GUIDES if k != "tied"])
def test_stock_trace_elbo_agrees_with_decomposed_elbo(kind, digits):
    """Same bound in expectation: the means of 300 estimates of each agree within 4
    standard errors (a wrong guide density, a missing 1/M or a missing point-mass term
    would be off by hundreds of nats)."""
    model, guide = make(kind, len(digits.train))
    x, y = _xy(digits, 256)
    n = 300
    stock = _losses(Trace_ELBO(), model, guide, x, y, n)
    ours = _losses(DecomposedELBO(), model, guide, x, y, n)
    se = math.sqrt(stock.var() / n + ours.var() / n)
    assert abs(stock.mean() - ours.mean()) < 4 * se + 1e-3 * abs(ours.mean()), (
        kind,
        stock.mean().item(),
        ours.mean().item(),
        se,
    )


def _same_draw_losses(elbo_a, elbo_b, model, guide, x, y, seed: int) -> tuple[float, float]:
    """The losses of two ELBOs on the same draw (Pyro's RNG seeded with ``seed`` before each)."""
    losses = []
    for elbo in (elbo_a, elbo_b):
        pyro.set_rng_seed(seed)
        losses.append(elbo.loss(model, guide, x, y))
    return losses[0], losses[1]


@pytest.mark.parametrize("kind", ["representative", "stochastic", "ssvi"])
def test_trace_mean_field_elbo_uses_the_guide_density(kind, digits):
    """TraceMeanField_ELBO finds no closed form for a GuideDraw site and falls back to
    log q - log p, so it equals Trace_ELBO on the same draws."""
    model, guide = make(kind, len(digits.train))
    x, y = _xy(digits)
    a, b = _same_draw_losses(TraceMeanField_ELBO(), Trace_ELBO(), model, guide, x, y, seed=3)
    assert a == pytest.approx(b, rel=1e-5)


def test_mean_field_trace_mean_field_elbo_equals_decomposed_elbo_on_the_same_draw(digits):
    model, guide = make("mean_field", len(digits.train))
    x, y = _xy(digits)
    a, b = _same_draw_losses(TraceMeanField_ELBO(), DecomposedELBO(), model, guide, x, y, seed=3)
    assert a == pytest.approx(b, rel=1e-6)


@pytest.mark.parametrize("elbo", [Trace_ELBO, TraceMeanField_ELBO])
def test_tied_tying_under_a_stock_elbo_raises_naming_decomposed_elbo(elbo, digits):
    model, guide = make("tied", len(digits.train))
    x, y = _xy(digits)
    with pytest.raises(NoSiteDensityError) as err:
        elbo().loss(model, guide, x, y)
    first = str(err.value).splitlines()[0]  # not under Pyro's "Error while computing ..."
    assert "tied" in first and "DecomposedELBO" in first, first
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), elbo())
    with pytest.raises(NoSiteDensityError) as err:
        svi.step(x, y)
    assert "DecomposedELBO" in str(err.value).splitlines()[0]
    # the loss it names works, also through stock SVI
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), DecomposedELBO())
    before = guide.chol_log_diag.detach().clone()
    assert math.isfinite(svi.step(x, y))
    assert not torch.equal(guide.chol_log_diag, before)


@pytest.mark.parametrize("kind", ["mean_field", "stochastic"])
def test_vectorised_elbo_particles_agree_and_train(kind, digits):
    """Trace_ELBO(vectorize_particles=True): the guides draw one value per particle, the
    model runs them in one vectorised call."""
    model, guide = make(kind, len(digits.train))
    x, y = _xy(digits, 256)
    vec = Trace_ELBO(num_particles=40, vectorize_particles=True, max_plate_nesting=1)
    a = _losses(vec, model, guide, x, y, 6)
    b = _losses(DecomposedELBO(num_particles=40), model, guide, x, y, 6)
    se = math.sqrt(a.var() / 6 + b.var() / 6)
    assert abs(a.mean() - b.mean()) < 6 * se + 2e-3 * abs(b.mean()), (a, b)
    before = {n: p.detach().clone() for n, p in guide.named_parameters()}
    SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), vec).step(x, y)
    assert all(not torch.equal(p, before[n]) for n, p in guide.named_parameters())


def test_pyro_name_tells_two_guides_apart_in_one_store(digits):
    model, first = make("mean_field", len(digits.train))
    _, second = make("mean_field", len(digits.train), seed=1)
    second.pyro_name = "second"
    x, y = _xy(digits)
    for g in (first, second):
        SVI(model, g, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO()).step(x, y)
    store = pyro.get_param_store()._params
    for name, p in second.named_parameters():
        assert store[f"second.{name}"] is p
        assert store[f"MeanFieldGuide.{name}"] is dict(first.named_parameters())[name]
    with pytest.raises(ValueError, match="pyro_name"):
        second.pyro_name = ""


# ---------------------------------------------------------------- Predictive
@pytest.mark.parametrize("kind", ["mean_field", "representative", "stochastic", "tied", "ssvi"])
@pytest.mark.parametrize("parallel", [False, True])
def test_predictive_agrees_with_predict(kind, parallel, digits):
    """Pyro's Predictive and our predict draw the same posterior predictive: per test
    example and class, the two 200-sample means of the probabilities differ by a z-score
    (with both samples' variances) that stays within chance."""
    model, guide = make(kind, len(digits.train))
    x = digits.test.tensors[0]
    S = 200
    out = Predictive(
        model, guide=guide, num_samples=S, return_sites=[LOGITS_SITE, "obs"], parallel=parallel
    )(x)
    assert out[LOGITS_SITE].shape == (S, len(x), 10) and out["obs"].shape == (S, len(x))
    theirs = out[LOGITS_SITE].softmax(-1)
    ours = predict(model, guide, x, num_samples=S, keep_samples=True).samples
    var = theirs.var(0) / S + ours.var(0) / S
    assert (theirs.var(0) > 0).any()  # independent draws, not one draw repeated
    z = (theirs.mean(0) - ours.mean(0)) / var.clamp_min(1e-12).sqrt()
    z = z[var > 1e-10]
    assert z.abs().mean() < 1.0 and z.abs().max() < 6.0, (z.abs().mean(), z.abs().max())


def test_model_runs_on_a_particle_dimension_like_one_draw_at_a_time(digits):
    model, guide = make("mean_field", len(digits.train))
    x = digits.test.tensors[0][:50]
    draws = guide.sample_weights(4)
    for lead in [(4,), (4, 1), (2, 2)]:
        w = {k: v.reshape(*lead, *v.shape[1:]) for k, v in draws.items()}
        trace = poutine.trace(poutine.condition(model, data=w)).get_trace(x)
        got = trace.nodes[LOGITS_SITE]["value"]
        stripped = lead[:-1] if lead[-1] == 1 else lead
        assert got.shape == (*stripped, 50, 10)
        for i in range(4):
            one = model.network_forward({k: v[i] for k, v in draws.items()}, x)
            torch.testing.assert_close(got.reshape(4, 50, 10)[i], one)
        assert trace.nodes["obs"]["value"].shape == (*stripped, 50)


def test_rank1_model_refuses_a_particle_dimension_naming_the_fix(digits):
    model, guide = make("rank1", len(digits.train))
    with pytest.raises(ValueError, match="parallel=False"):
        Predictive(model, guide=guide, num_samples=3, parallel=True)(digits.test.tensors[0][:5])
    out = Predictive(model, guide=guide, num_samples=3, return_sites=[LOGITS_SITE])(
        digits.test.tensors[0][:5]
    )
    assert out[LOGITS_SITE].shape == (3, 5, 10)


def test_logits_site_holds_the_network_outputs(digits):
    model, _ = make("mean_field", len(digits.train))
    x, y = _xy(digits, 20)
    trace = poutine.trace(model).get_trace(x, y)
    site = trace.nodes[LOGITS_SITE]
    assert site["value"] is trace.nodes["_RETURN"]["value"]
    torch.testing.assert_close(trace.nodes["obs"]["fn"].logits, site["value"].log_softmax(-1))
    # a bookkeeping site: no term of any ELBO
    assert site["infer"].get("_deterministic")
    trace.compute_log_prob()
    assert float(site["log_prob_sum"]) == 0.0


# ---------------------------------------------------------------- autoguides
@pytest.mark.parametrize("auto", [AutoNormal, AutoLowRankMultivariateNormal])
def test_autoguides_train_with_fit_and_predict(auto, digits):
    torch.manual_seed(0)
    model = BNNModel(MLP(64, (16,), 10), prior=1.0, likelihood=Categorical(len(digits.train)))
    guide = auto(model, init_scale=0.05)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    state = fit(model, guide, loader, epochs=1, lr=1e-2, progress=False)
    start = {n: p.detach().clone() for n, p in guide.named_parameters()}
    assert start  # fit created the autoguide's parameters
    state = fit(model, guide, loader, epochs=6, lr=1e-2, progress=False, state=state)
    assert all(not torch.equal(p, start[n]) for n, p in guide.named_parameters())
    assert state.history[-1]["loss"] < state.history[0]["loss"]
    pred = predict(model, guide, digits.test.tensors, num_samples=10)
    assert pred.mean.shape == (len(digits.test), 10)
    torch.testing.assert_close(pred.mean.sum(-1), torch.ones(len(digits.test)))
    assert accuracy(pred.mean, pred.targets) > 0.6


def test_decomposed_elbo_counts_an_autoguides_auxiliary_density(digits):
    """AutoNormal draws an auxiliary Normal and emits a Delta at the weight site: the KL
    must include the auxiliary log q (Pyro's Delta "KL" alone is -log p); on the same
    draw DecomposedELBO then equals Trace_ELBO."""
    model, _ = make("mean_field", len(digits.train))
    guide = AutoNormal(model, init_scale=0.05)
    x, y = _xy(digits)
    guide(x, y)  # its set-up traces the model (random draws)
    a, b = _same_draw_losses(Trace_ELBO(), DecomposedELBO(), model, guide, x, y, seed=4)
    assert a == pytest.approx(b, rel=1e-5)


# ---------------------------------------------------------------- mixing fit and SVI
def test_fit_and_svi_train_the_same_tensors_and_fit_leaves_the_store_alone(digits):
    model, guide = make("mean_field", len(digits.train))
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    fit(model, guide, loader, epochs=1, lr=1e-2, progress=False)
    assert len(pyro.get_param_store()) == 0
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    svi.step(*_xy(digits))
    params = dict(guide.named_parameters())
    fit(model, guide, loader, epochs=1, lr=1e-2, progress=False)
    for name, p in guide.named_parameters():
        assert p is params[name]
        assert pyro.get_param_store()._params[f"MeanFieldGuide.{name}"] is p


def test_replaced_parameters_and_new_guides_take_over_their_store_names(digits):
    model, guide = make("representative", len(digits.train))
    x, y = _xy(digits)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    svi.step(x, y)
    # a refinement rebuilds the components: new parameter objects, fewer components
    structure = guide.structure()
    merged = _structure(model, n_components=4, seed=1)
    structure.means, structure.covariances = merged.means, merged.covariances
    structure.plain_component = structure.plain_component.clamp_max(3)
    structure.ellipse_components = merged.ellipse_components.clamp_max(3)
    guide.load_structure(structure)
    svi.step(x, y)
    store = pyro.get_param_store()
    assert store._params["SharedGMMGuide.centre_mu"] is guide.centre_mu
    assert guide.centre_mu.shape == (4,)
    # a second guide of the same class trains its own tensors, not the first one's values
    _, other = make("representative", len(digits.train), seed=5)
    own = other.outlier_loc.detach().clone()
    SVI(model, other, pyro.optim.Adam({"lr": 0.0}), Trace_ELBO()).step(x, y)
    assert torch.equal(other.outlier_loc, own)
    assert store._params["SharedGMMGuide.outlier_loc"] is other.outlier_loc


def test_values_loaded_into_the_store_are_adopted_with_a_warning(digits, tmp_path):
    model, guide = make("mean_field", len(digits.train))
    x, y = _xy(digits)
    SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO()).step(x, y)
    pyro.get_param_store().save(tmp_path / "p.pt")
    trained = {n: p.detach().clone() for n, p in guide.named_parameters()}
    pyro.clear_param_store()
    _, fresh = make("mean_field", len(digits.train), seed=1)
    pyro.get_param_store().load(tmp_path / "p.pt")
    with pytest.warns(UserWarning, match="took their values from Pyro's param store"):
        adopted = fresh.sync_param_store()
    assert len(adopted) == len(trained)
    for name, p in fresh.named_parameters():
        torch.testing.assert_close(p.detach(), trained[name])
    # a stored tensor of another shape under the name is an error, not a silent swap
    pyro.clear_param_store()
    pyro.param("MeanFieldGuide.locs.layers__0__bias", torch.zeros(3))
    with pytest.raises(ValueError, match="clear_param_store"):
        fresh(x, y)
