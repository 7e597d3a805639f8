"""Bit-identical training under a seed (the shared-GMM guide's gathers have deterministic
backward passes on CPU), and the fast prediction draws have the guide's distribution."""

import pyro
import pytest
import torch
from bench_svi_step import make_structure

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide, stochastic_draw
from twodg_pyro.infer import fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP


def _data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    return [(x[i : i + 64], (x[i : i + 64, :10].argmax(1))) for i in range(0, n, 64)]


@pytest.mark.parametrize("tying", ["representative", "stochastic", "tied"])
def test_two_seeded_fits_are_bit_identical(tying):
    # 45k weights: above the size where torch's CPU index_put(accumulate) goes parallel
    # with atomic adds (nondeterministic); the guide must not rely on it
    torch.manual_seed(0)
    model = BNNModel(MLP(64, (600,), 10), likelihood=Categorical(256))
    structure = make_structure(model, n_components=16)
    data = _data()
    runs = []
    for _ in range(2):
        pyro.set_rng_seed(3)
        guide = SharedGMMGuide(model, structure, tying)
        state = fit(model, guide, data, 2, 1e-2, progress=False)
        runs.append((state.history, {k: v.clone() for k, v in guide.state_dict().items()}))
    assert runs[0][0] == runs[1][0]
    for k, v in runs[0][1].items():
        assert torch.equal(v, runs[1][1][k]), k


@pytest.mark.parametrize("coordinates", ["sigma", "log_sigma"])
@pytest.mark.parametrize("columns_per_block", [None, 5])
def test_fast_stochastic_draw_has_the_guide_distribution(
    coordinates, columns_per_block, monkeypatch
):
    n = 60000
    if columns_per_block:  # blocks of 5 weights x all draws: 23 weights = 4 blocks + 3
        monkeypatch.setattr(stochastic_draw, "DRAW_BLOCK", columns_per_block * n)
    torch.manual_seed(0)
    model = BNNModel(MLP(4, (3,), 2), likelihood=Categorical(10))  # 12 + 3 + 6 + 2 = 23
    s = make_structure(model, n_components=3, outlier_frac=0.15, ellipse_frac=0.15, seed=1)
    s.coordinates = coordinates
    s.means = torch.tensor([[0.1, 0.05], [-0.2, 0.1], [0.3, 0.02]])
    if coordinates == "log_sigma":
        s.means[:, 1] = s.means[:, 1].log()
    s.covariances = torch.tensor(
        [[[4e-3, 1e-3], [1e-3, 2e-3]], [[1e-3, 0.0], [0.0, 1e-3]], [[2e-3, -5e-4], [-5e-4, 1e-3]]]
    )
    guide = SharedGMMGuide(model, s, "stochastic")
    with torch.no_grad():
        fast = guide._draw(n, fast=True).flat
        full = guide._draw(n, fast=False).flat
    se = (full.var(0) / n).sqrt()
    assert ((fast.mean(0) - full.mean(0)).abs() < 6 * se + 1e-6).all()
    torch.testing.assert_close(fast.var(0), full.var(0), rtol=0.05, atol=1e-7)
    # and the outliers keep exactly their own Normal
    out = s.outlier_index
    torch.testing.assert_close(fast[:, out].mean(0), s.outlier_loc, atol=0.02, rtol=0)


@pytest.mark.parametrize("coordinates", ["sigma", "log_sigma"])
@pytest.mark.parametrize("block", [None, 7 * 4])
def test_stochastic_draw_gathers_per_block_as_the_per_weight_coefficients(
    coordinates, block, monkeypatch
):
    """A ``(5, K')`` table with an index gives, under one seed, the very draws of the five
    per-weight coefficient vectors it gathers to (blocks of 7 weights: a remainder too)."""
    if block:
        monkeypatch.setattr(stochastic_draw, "DRAW_BLOCK", block)
    g = torch.Generator().manual_seed(0)
    K, n, S = 6, 45, 4
    m0, m1 = torch.randn(K, generator=g), torch.rand(K, generator=g) + 0.1
    l00, l11 = torch.rand(K, generator=g) + 0.1, torch.rand(K, generator=g) + 0.1
    l10 = torch.randn(K, generator=g) * 0.1
    l00[-1] = l10[-1] = l11[-1] = 0.0  # an outlier: degenerate S = 0
    table = torch.stack(stochastic_draw.stochastic_coefficients(m0, m1, l00, l10, l11))
    index = torch.randint(K, (n,), generator=g, dtype=torch.int32)
    per_weight = tuple(row.index_select(0, index) for row in table)
    torch.manual_seed(5)
    a = stochastic_draw.draw_stochastic_into(torch.empty(S, n), table, index, coordinates)
    torch.manual_seed(5)
    b = stochastic_draw.draw_stochastic_into(torch.empty(S, n), per_weight, None, coordinates)
    assert torch.equal(a, b)
    assert torch.isfinite(a).all() and a.std() > 0


def test_mean_field_prediction_draws_match_training_draws():
    torch.manual_seed(0)
    model = BNNModel(MLP(8, (5,), 3), likelihood=Categorical(10))
    guide = MeanFieldGuide(model, init_scale=0.3)
    torch.manual_seed(1)
    with torch.no_grad():
        a = guide.sample_weights(4)
    torch.manual_seed(1)
    b = guide.sample_weights(4)  # with gradients: the out-of-place path
    for k in a:
        assert torch.equal(a[k], b[k].detach())
    assert b["layers.0.weight"].requires_grad


def test_seeded_prediction_is_the_network_run_on_the_guides_draws():
    """A conv BNN with BatchNorm frozen at its running statistics (the natural-gradient
    recipe's ResNet-20 set-up, one draw at a time): every drawn prediction of
    ``seeded_predict`` is the plain network run, in evaluation mode, with the weights the
    guide draws under the same seed, bit for bit."""
    from twodg_pyro.evaluation import seeded_predict
    from twodg_pyro.models import build_network

    torch.manual_seed(0)
    net = build_network("resnet20", num_classes=10, in_channels=1)
    with torch.no_grad():  # running statistics other than the initial ones
        net.train()(torch.randn(32, 1, 28, 28))
    model = BNNModel(net, likelihood=Categorical(100), norm_stats="frozen")
    guide = MeanFieldGuide(model, init_scale=0.05)
    x = torch.rand(8, 1, 28, 28)
    pred = seeded_predict(model, guide, x, num_samples=3, seed=4, keep_samples=True)
    torch.manual_seed(4)
    draws = guide.sample_weights(3)
    params = dict(net.named_parameters())
    by_hand = []
    with torch.no_grad():
        for k in range(3):
            for site in guide.sites:
                params[site.name].copy_(draws[site.name][k])
            by_hand.append(net.eval()(x).softmax(-1))
    assert torch.equal(pred.samples, torch.stack(by_hand))
    assert (pred.samples[0] - pred.samples[1]).abs().max() > 1e-3  # the draws differ


@pytest.mark.parametrize("tying", ["representative", "stochastic", "tied"])
def test_mean_weights_are_the_mean_of_the_guides_draws(tying):
    """The closed-form posterior mean of every weight (outliers, plain inliers, ellipse
    weights) against the average of 40,000 draws, and the mean network that carries it."""
    from twodg_pyro.methods import GuidePosterior

    torch.manual_seed(0)
    model = BNNModel(MLP(4, (3,), 2), likelihood=Categorical(10))  # 23 weights
    s = make_structure(model, n_components=3, outlier_frac=0.15, ellipse_frac=0.3, seed=1)
    s.means = torch.tensor([[0.1, 0.05], [-0.2, 0.1], [0.3, 0.02]])
    s.covariances = torch.tensor(
        [[[4e-3, 1e-3], [1e-3, 2e-3]], [[1e-3, 0.0], [0.0, 1e-3]], [[2e-3, -5e-4], [-5e-4, 1e-3]]]
    )
    guide = SharedGMMGuide(model, s, tying)
    assert guide.kinds.ellipses > 0
    n = 40000
    with torch.no_grad():
        flat = guide._draw(n, fast=True).flat
    means = guide.mean_weights()
    exact = torch.cat([means[site.name].reshape(-1) for site in model.sites])
    se = (flat.var(0) / n).sqrt()
    assert ((flat.mean(0) - exact).abs() < 6 * se + 1e-6).all()
    net = GuidePosterior(model, guide).mean_network()
    params = dict(net.named_parameters())
    for site in model.sites:
        assert torch.equal(params[site.name].detach(), means[site.name])
        assert params[site.name].requires_grad
    # mean-field: its locs
    mf = MeanFieldGuide(model, init_scale=0.1)
    assert all(torch.equal(v, mf.loc(k)) for k, v in mf.mean_weights().items())
    # rank-1: its sites are factors of M members, no mean network (it would otherwise
    # inherit the factor means and fail on the missing parameter names)
    from twodg_pyro.guides import Rank1Guide
    from twodg_pyro.rank1_bnn import Rank1BNNModel

    r1 = Rank1BNNModel(MLP(4, (3,), 2), components=2, likelihood=Categorical(10))
    with pytest.raises(TypeError, match="Rank1Guide has no per-weight posterior means"):
        GuidePosterior(r1, Rank1Guide(r1)).mean_network()
