"""BatchNorm statistics recomputed at the weights a network holds
(:func:`twodg_pyro.nn.recompute_norm_stats`) and at a BNN's posterior mean
(:meth:`GuidePosterior.with_mean_norm_stats`): known answers on the digits."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.methods import GuidePosterior
from twodg_pyro.nn import recompute_norm_stats


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def test_the_statistics_are_the_batches_averages_and_the_layer_is_left_as_it_was(digits):
    net = _net()
    net[1].momentum = 0.3
    net.eval()
    loader = make_loader(digits.train, 100)  # equal batches: their means average exactly
    xs = [x for x, _ in loader]
    xs = xs[: len(digits.train) // 100]
    out = recompute_norm_stats(net, xs)
    assert out is net and not net.training and net[1].momentum == 0.3
    with torch.no_grad():
        h = [net[0](x) for x in xs]
    mean = torch.stack([b.mean(0) for b in h]).mean(0)
    var = torch.stack([b.var(0, unbiased=True) for b in h]).mean(0)
    torch.testing.assert_close(net[1].running_mean, mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(net[1].running_var, var, rtol=1e-5, atol=1e-6)
    assert int(net[1].num_batches_tracked) == len(xs)
    # the same inputs as (x, y) pairs, and in float64: the same statistics
    wide = recompute_norm_stats(copy.deepcopy(net).double(), [(x, None) for x in xs])
    torch.testing.assert_close(wide[1].running_mean, mean.double(), rtol=1e-5, atol=1e-6)


def test_no_batch_is_refused_and_a_network_without_statistics_is_untouched(digits):
    net = _net()
    with pytest.raises(ValueError, match="holds no batch"):
        recompute_norm_stats(net, [])
    plain = nn.Sequential(nn.Linear(64, 10))
    before = copy.deepcopy(plain.state_dict())
    assert recompute_norm_stats(plain, [digits.train.tensors[0][:10]]) is plain
    assert all(torch.equal(before[k], v) for k, v in plain.state_dict().items())


def test_a_bnn_at_its_mean_statistics_keeps_its_guide_and_the_original(digits):
    model = BNNModel(_net(), prior=1.0, likelihood=Categorical(len(digits.train)))
    guide = MeanFieldGuide(model, seed=0)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    fit(model, guide, loader, epochs=3, lr=1e-2, progress=False)
    bnn = GuidePosterior(model, guide)
    before = {k: v.clone() for k, v in model.net.named_buffers()}
    ordered = make_loader(digits.train, 128)
    at_mean = bnn.with_mean_norm_stats(ordered)
    assert at_mean.guide is guide and at_mean.model is not model
    assert all(torch.equal(before[k], v) for k, v in model.net.named_buffers())  # untouched
    expected = recompute_norm_stats(bnn.mean_network(), ordered)
    got = dict(at_mean.mean_network().named_buffers())
    for name, b in expected.named_buffers():
        assert torch.equal(got[name], b), name
    # the draws' statistics differ from the mean network's
    assert not torch.equal(got["1.running_var"], before["1.running_var"])
