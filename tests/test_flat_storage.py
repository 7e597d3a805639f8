"""Tensors laid end to end (twodg_pyro.nn.flat_storage): a view only where it is one, the
same numbers through the view and the copy, and a VON step on a guide laid end to end
that is the step on the same guide one tensor at a time, bit for bit."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.guides.base import site_key
from twodg_pyro.infer import DecomposedELBO, VariationalOnlineNewton, build_optimizer
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.nn.flat_storage import flat, flat_view, pack, split_as
from twodg_pyro.priors import NormalPrior


def test_pack_keeps_each_tensor_and_its_values_and_the_view_writes_through():
    params = [torch.nn.Parameter(torch.randn(s)) for s in [(3, 2), (4,), (2, 2, 2)]]
    ids, values = [id(p) for p in params], [p.detach().clone() for p in params]
    assert flat_view(params) is None  # allocated one by one
    assert pack(params) and not pack(params)  # a second pack moves nothing
    assert [id(p) for p in params] == ids
    assert all(torch.equal(p, v) for p, v in zip(params, values, strict=True))
    view = flat_view(params)
    assert torch.equal(view, torch.cat([v.reshape(-1) for v in values]))
    parts = split_as(view, [p.shape for p in params])  # the inverse: the tensors' own memory
    assert [(q.shape, q.data_ptr()) for q in parts] == [(p.shape, p.data_ptr()) for p in params]
    view.mul_(2.0)
    assert all(torch.equal(p, 2 * v) for p, v in zip(params, values, strict=True))
    assert flat(params).data_ptr() == params[0].data_ptr()  # the view, not a copy
    loss = sum((p * (i + 1)).sum() for i, p in enumerate(params))
    loss.backward()  # still leaves of their own
    assert all(torch.equal(p.grad, torch.full_like(p, i + 1.0)) for i, p in enumerate(params))


def test_no_view_where_the_tensors_are_not_one_vector():
    buffer = torch.arange(12.0)
    a, b, c = buffer[:4], buffer[4:8], buffer[8:]
    assert torch.equal(flat_view([a, b, c]), buffer)
    assert flat_view([a, c]) is None  # a gap
    assert flat_view([b, a]) is None  # out of order
    assert flat_view([buffer.view(3, 4).t()]) is None  # not contiguous
    assert flat_view([a, b.to(torch.float64)]) is None
    # two storages that happen to follow each other in memory are not one view
    memory = np.arange(8, dtype=np.float32)
    x, y = torch.from_numpy(memory[:4]), torch.from_numpy(memory[4:])
    assert y.data_ptr() == x.data_ptr() + 16 and flat_view([x, y]) is None
    assert torch.equal(flat([x, y]), torch.arange(8.0))  # the copy
    p = torch.nn.Parameter(torch.zeros(2))
    assert not pack([p, p])  # one tensor twice: nothing moved
    assert not pack([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])


def _guide(packed: bool):
    torch.manual_seed(0)
    model = BNNModel(MLP(8, (5,), 3), prior=NormalPrior(0.5), likelihood=Categorical(100))
    guide = MeanFieldGuide(model, init_scale=0.05)
    if packed:
        for group in (guide.locs, guide.rhos):
            assert pack([group[site_key(s.name)] for s in guide.sites])
    von = functools.partial(VariationalOnlineNewton, kl_weight=0.1, beta2=0.9)
    return model, guide, build_optimizer(model, guide, 0.1, von)


def test_a_von_step_on_a_guide_laid_end_to_end_is_the_step_one_tensor_at_a_time():
    """The update's views (one operation on all the weights) against its per-tensor path
    (concatenated copies, foreach): the same guide and momentum, bit for bit, over three
    steps on the same gradients (set by hand: a fast draw would lay the guide out)."""
    runs = []
    for packed in (False, True):
        _, guide, opt = _guide(packed)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            for p in guide.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        locs = [guide.locs[site_key(s.name)] for s in guide.sites]
        assert (flat_view(locs) is not None) == packed
        moms = [opt.state[mu]["momentum"] for mu in locs]
        assert flat_view(moms) is not None  # one flat momentum either way
        runs.append(copy.deepcopy((guide.state_dict(), moms)))
    (first, m1), (second, m2) = runs
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert all(torch.equal(a, b) for a, b in zip(m1, m2, strict=True))


@pytest.mark.parametrize("fused", [False, True])
def test_the_first_fast_draw_lays_the_guide_out_and_training_goes_on(fused):
    """On the CPU a fast draw packs the guide's loc and rho (same tensors, same values) and
    VON trains it through the views: the ELBO falls over twenty steps."""
    model, guide, opt = _guide(False)
    before = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    ids = [id(p) for p in guide.parameters()]
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    elbo = DecomposedELBO(beta=0.1, fast_step=True, fused_kl=fused)
    losses = []
    for step in range(20):
        opt.zero_grad()
        loss = elbo.combine(elbo.loss_terms(model, guide, x, y))
        if step == 0:
            assert all(torch.equal(v, before[k]) for k, v in guide.state_dict().items())
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert [id(p) for p in guide.parameters()] == ids
    for group in (guide.locs, guide.rhos):
        assert flat_view([group[site_key(s.name)] for s in guide.sites]) is not None
    assert sum(losses[-5:]) < sum(losses[:5])


def test_a_resumed_von_lays_its_momentum_out_again():
    """Checkpoints clone every tensor (the momenta come back apart); the first step after
    the load lays them out again and gives the uninterrupted run's guide and momentum."""

    def cloned(obj):
        if torch.is_tensor(obj):
            return obj.detach().clone()
        if isinstance(obj, dict):
            return {k: cloned(v) for k, v in obj.items()}
        return [cloned(v) for v in obj] if isinstance(obj, list) else obj

    g = torch.Generator().manual_seed(2)
    _, guide, opt = _guide(True)
    grads = [[torch.randn(p.shape, generator=g) for p in guide.parameters()] for _ in range(2)]

    def step(guide, opt, gs):
        for p, grad in zip(guide.parameters(), gs, strict=True):
            p.grad = grad.clone()
        opt.step()
        locs = [guide.locs[site_key(s.name)] for s in guide.sites]
        return [opt.state[mu]["momentum"] for mu in locs]

    step(guide, opt, grads[0])
    saved = cloned(guide.state_dict()), cloned(opt.state_dict())
    uninterrupted = step(guide, opt, grads[1])
    _, resumed, opt2 = _guide(True)
    resumed.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    moms = [opt2.state[resumed.locs[site_key(s.name)]]["momentum"] for s in resumed.sites]
    assert flat_view(moms) is None  # apart, as the checkpoint left them
    moms = step(resumed, opt2, grads[1])
    assert flat_view(moms) is not None
    assert all(torch.equal(a, b) for a, b in zip(moms, uninterrupted, strict=True))
    ours, theirs = guide.state_dict(), resumed.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
