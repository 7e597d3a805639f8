"""Sparse Subspace VI: fixed-size subspace, exact zeros, removal criteria, KL, bad input."""

import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.distributions.kl import kl_divergence
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.guides import SSVIGuide, SubspaceUpdate
from twodg_pyro.guides.ssvi_subspace import folded_normal_moments, removal_scores
from twodg_pyro.infer import Callback, DecomposedELBO, TrainState, fit
from twodg_pyro.infer.optim import build_optimizer
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.models import MLP
from twodg_pyro.nn.functional import inverse_softplus
from twodg_pyro.pipeline import ConfigError, config_from_dict
from twodg_pyro.pipeline.settings.config import SSVIConfig
from twodg_pyro.prediction import predict
from twodg_pyro.priors import LaplacePrior


class CheckSubspace(Callback):
    """After every epoch (so after every subspace update): exactly s active coordinates,
    and zeros outside the subspace in every sampled weight (both sampling paths)."""

    def __init__(self, s, counts):
        self.s, self.counts, self.checked, self.subspaces = s, counts, 0, []

    def on_epoch_end(self, state):
        guide = state.guide
        assert guide.num_active == self.s
        assert guide.active_counts() == self.counts
        self.subspaces.append({n: guide.active_indices(n).clone() for n in self.counts})
        draws = guide.sample_weights(4)
        trace = poutine.trace(guide).get_trace()
        for site in guide.sites:
            idx = guide.active_indices(site.name)
            assert idx.unique().numel() == len(idx)
            assert guide.loc(site.name).shape == guide.scale(site.name).shape == idx.shape
            inactive = ~guide.active_mask(site.name)
            assert int(inactive.sum()) == site.numel - len(idx)
            assert torch.all(draws[site.name][:, inactive] == 0)
            assert torch.all(trace.nodes[site.name]["value"][inactive] == 0)
            # and the active ones are actually random (non-zero almost surely)
            assert torch.all(draws[site.name][:, ~inactive] != 0)
        self.checked += 1


@pytest.mark.parametrize("addition", ["gradient", "random"])
def test_exactly_s_active_after_every_update_and_inactive_exactly_zero(digits, addition):
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    model = BNNModel(MLP(64, (32,), 10), likelihood=Categorical(len(digits.train)))
    guide = SSVIGuide(model, density=0.1, seed=0)
    counts = {s.name: max(1, round(0.1 * s.numel)) for s in model.sites}
    assert guide.active_counts() == counts
    s = sum(counts.values())
    assert guide.num_active == s and guide.num_trainable() == 2 * s
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    update = SubspaceUpdate(
        loader, removal="snr_abs_theta", addition=addition, update_every=1, stop_fraction=1.0
    )
    check = CheckSubspace(s, counts)
    state = fit(model, guide, loader, epochs=8, lr=1e-2, callbacks=[update, check], progress=False)
    assert check.checked == 8
    assert len(update.updates) == 7  # after epochs 1..7, none after the last
    assert all(u["active"] == s and u["moved"] > 0 for u in update.updates)
    fractions = [u["fraction"] for u in update.updates]
    assert fractions == sorted(fractions, reverse=True)  # cosine decay
    # the subspace really moves, yet its size never changes
    first, last = check.subspaces[0]["layers.0.weight"], check.subspaces[-1]["layers.0.weight"]
    assert set(first.tolist()) != set(last.tolist())
    assert state.history[-1]["nll"] < state.history[0]["nll"]
    x, y = digits.test.tensors
    pred = predict(model, guide, (x, y), num_samples=10)
    assert classification_metrics(pred.mean, pred.targets)["accuracy"] > 0.3  # chance: 0.1


def test_gradient_addition_reads_only_its_batches(digits):
    """The gradient criterion reads ``grad_batches`` batches of its data, not one more:
    the scores of two batches are the sum of each batch's own."""
    model = BNNModel(MLP(64, (32,), 10), likelihood=Categorical(len(digits.train)))
    guide = SSVIGuide(model, density=0.1, seed=0)
    batches = list(make_loader(digits.train, 64, shuffle=False))
    fetched = []

    class Counting:
        def __init__(self, first=0):
            self.first = first

        def __iter__(self):
            for i, batch in enumerate(batches[self.first :], self.first):
                fetched.append(i)
                yield batch

    both = SubspaceUpdate(Counting(), grad_batches=2)._addition_scores(model, guide)
    assert fetched == [0, 1]
    one = SubspaceUpdate(Counting(), grad_batches=1)._addition_scores(model, guide)
    two = SubspaceUpdate(Counting(1), grad_batches=1)._addition_scores(model, guide)
    assert fetched == [0, 1, 0, 1]
    for name, score in both.items():
        assert torch.all(score <= one[name] + two[name] + 1e-5)  # |g1 + g2| <= |g1| + |g2|
        assert not torch.equal(score, one[name])


# ---------------------------------------------------------------- removal criteria
# hand-made (mu, sigma): |mu| order and |mu|/sigma order differ
HAND = {
    "A": (0.5, 0.1),  # |mu| 0.5,  snr 5
    "B": (-0.2, 0.01),  # |mu| 0.2,  snr 20
    "C": (1.0, 1.0),  # |mu| 1.0,  snr 1
    "D": (0.0, 0.05),  # |mu| 0.0,  snr 0
    "E": (0.05, 0.5),  # |mu| 0.05, snr 0.1
}


def _folded_snr_by_hand(mu, sigma):
    """E|theta| / std|theta| with the textbook folded-normal moments."""
    phi = 0.5 * (1 + math.erf((-mu / sigma) / math.sqrt(2)))  # Phi(-mu / sigma)
    mean = sigma * math.sqrt(2 / math.pi) * math.exp(-(mu**2) / (2 * sigma**2)) + mu * (1 - 2 * phi)
    var = mu**2 + sigma**2 - mean**2
    return mean / math.sqrt(var)


@pytest.mark.parametrize(
    "criterion, expected_order",
    [
        ("mu", "DEBAC"),  # |mu|: 0 < 0.05 < 0.2 < 0.5 < 1
        ("snr", "DECAB"),  # |mu|/sigma: 0 < 0.1 < 1 < 5 < 20
        ("snr_abs_theta", "DECAB"),  # increasing in |mu|/sigma: same order as snr
    ],
)
def test_each_removal_criterion_ranks_hand_made_weights(criterion, expected_order):
    names = list(HAND)
    loc = torch.tensor([HAND[n][0] for n in names])
    scale = torch.tensor([HAND[n][1] for n in names])
    scores = removal_scores(loc, scale, criterion)
    order = "".join(names[i] for i in scores.argsort().tolist())
    assert order == expected_order
    if criterion == "snr_abs_theta":
        by_hand = torch.tensor([_folded_snr_by_hand(*HAND[n]) for n in names])
        torch.testing.assert_close(scores, by_hand, rtol=1e-5, atol=1e-6)
        # t = 0: sqrt(2/pi) / sqrt(1 - 2/pi)
        assert float(scores[names.index("D")]) == pytest.approx(1.3236, abs=1e-4)


def test_folded_normal_moments_are_stable_far_from_zero():
    mean, std = folded_normal_moments(
        torch.tensor([3.0, -40.0, 0.0]), torch.tensor([1.0, 0.1, 2.0])
    )
    by_hand = _folded_snr_by_hand(3.0, 1.0)
    assert float(mean[0] / std[0]) == pytest.approx(by_hand, rel=1e-5)
    # |mu| >> sigma: |theta| is theta's Normal reflected, E = |mu|, std = sigma
    assert float(mean[1]) == pytest.approx(40.0) and float(std[1]) == pytest.approx(0.1, rel=1e-5)
    assert float(mean[2]) == pytest.approx(2 * math.sqrt(2 / math.pi), rel=1e-6)


@pytest.mark.parametrize(
    "criterion, removed",
    [
        ("mu", {"D", "E", "B"}),
        ("snr", {"D", "E", "C"}),
        ("snr_abs_theta", {"D", "E", "C"}),
        ("mu3", None),
    ],
)
def test_subspace_update_removes_the_lowest_scores(criterion, removed):
    if removed is None:
        with pytest.raises(ValueError, match=r"unknown removal criterion 'mu3'"):
            SubspaceUpdate([], removal=criterion)
        return
    net = nn.Sequential(nn.Linear(5, 2, bias=False))  # 10 weights, 5 active
    model = BNNModel(net, likelihood=10)
    guide = SSVIGuide(model, density=0.5, init_scale=0.1, seed=0)
    names = list(HAND)
    active = guide.active_indices("0.weight").clone()
    with torch.no_grad():
        guide.locs["0__weight"].copy_(torch.tensor([HAND[n][0] for n in names]))
        guide.rhos["0__weight"].copy_(inverse_softplus(torch.tensor([HAND[n][1] for n in names])))
    opt = build_optimizer(model, guide, 1e-2)
    state = TrainState(model, guide, DecomposedELBO(), opt, 1e-2, epochs=10)
    # give Adam some state to carry over
    guide.loc("0.weight").sum().backward()
    opt.step()
    old_avg = opt.state[guide.locs["0__weight"]]["exp_avg"].clone()
    old_loc = guide.loc("0.weight").detach().clone()
    update = SubspaceUpdate([], removal=criterion, addition="random", seed=1)
    moved = update.update(state, fraction=0.6)  # floor(0.6 * 5) = 3 coordinates
    assert moved == 3
    new_active = guide.active_indices("0.weight")
    gone = set(active.tolist()) - set(new_active.tolist())
    assert gone == {int(active[names.index(n)]) for n in removed}
    assert len(new_active) == 5 and len(set(new_active.tolist()) & set(active.tolist())) == 2
    # kept coordinates keep their parameters and Adam moments; added ones start at mu = 0
    kept = [i for i, n in enumerate(names) if n not in removed]
    loc = guide.loc("0.weight").detach()
    torch.testing.assert_close(loc[:2], old_loc[kept])
    assert torch.equal(loc[2:], torch.zeros(3))
    new_state = state.optimizer.state[guide.locs["0__weight"]]
    torch.testing.assert_close(new_state["exp_avg"][:2], old_avg[kept])
    assert torch.equal(new_state["exp_avg"][2:], torch.zeros(3))
    assert guide.locs["0__weight"] in {p for g in state.optimizer.param_groups for p in g["params"]}


# ---------------------------------------------------------------- KL
def test_kl_counts_only_active_coordinates():
    model = BNNModel(MLP(6, (5,), 3), prior=0.7, likelihood=10)
    guide = SSVIGuide(model, density=0.3, init_scale=0.2, seed=0)
    site = model.sites[0]
    q = dist.Normal(guide.loc(site.name), guide.scale(site.name))
    expected = kl_divergence(q, dist.Normal(0.0, 0.7)).sum()
    value = guide.sample_weights()[site.name]
    kl = guide.site_kl(site.name, model.prior(site), value)["kl"]
    torch.testing.assert_close(kl, expected)
    terms = DecomposedELBO().loss_terms(model, guide, torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))
    total = sum(
        kl_divergence(
            dist.Normal(guide.loc(s.name), guide.scale(s.name)), dist.Normal(0.0, 0.7)
        ).sum()
        for s in model.sites
    )
    torch.testing.assert_close(terms["kl"], total)
    # no closed form (Laplace prior): Monte Carlo over the active coordinates only
    lap = BNNModel(MLP(6, (5,), 3), prior=LaplacePrior(0.5), likelihood=10)
    guide = SSVIGuide(lap, density=0.3, seed=0)
    site = lap.sites[0]
    value = guide.sample_weights()[site.name]
    active = value.reshape(-1)[guide.active_indices(site.name)]
    q = dist.Normal(guide.loc(site.name), guide.scale(site.name))
    expected = (q.log_prob(active) - dist.Laplace(0.0, 0.5).log_prob(active)).sum()
    torch.testing.assert_close(guide.site_kl(site.name, lap.prior(site), value)["kl"], expected)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, float("nan")])
def test_density_outside_unit_interval_is_a_clear_error(bad):
    model = BNNModel(MLP(6, (5,), 3), likelihood=10)
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\], got"):
        SSVIGuide(model, density=bad)
    with pytest.raises(ConfigError, match=rf"ssvi.density = {bad!r}: must be in \(0, 1\]"):
        SSVIConfig(density=bad)


def test_unknown_criteria_and_schedules_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown removal criterion 'magnitude'; known: \['mu'"):
        removal_scores(torch.ones(2), torch.ones(2), "magnitude")
    with pytest.raises(ConfigError, match=r"ssvi.removal = 'magnitude': must be one of"):
        config_from_dict({"ssvi": {"removal": "magnitude"}})
    with pytest.raises(ValueError, match=r"unknown addition criterion 'hessian'"):
        SubspaceUpdate([], addition="hessian")
    with pytest.raises(ValueError, match="update_every must be an integer >= 1, got 0"):
        SubspaceUpdate([], update_every=0)
    model = BNNModel(MLP(6, (5,), 3), likelihood=10)
    guide = SSVIGuide(model, density=1.0)
    assert guide.num_active == model.num_weights  # density 1: the mean-field guide
