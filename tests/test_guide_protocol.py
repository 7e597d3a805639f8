"""The guide protocol's shape (``twodg_pyro.guide``, issue 22): a small core on
``BNNGuide``, the fast step and the sharing structure as extensions stated apart, tyings
that use only the shared-GMM guide's public members, and each diagonal-Normal and SSVI
guide's program and draws derived from one definition of its distribution."""

import ast
import inspect

import pyro.poutine as poutine
import torch
from test_protocol_and_loop import toy_structure  # the small structure the tests share

import twodg_pyro.guide as protocol
from twodg_pyro.bnn import BNNModel
from twodg_pyro.guide import BNNGuide, FastStepGuide, SharingGuide
from twodg_pyro.guides import (
    MeanFieldGuide,
    Rank1BNNModel,
    Rank1Guide,
    SharedGMMGuide,
    SSVIGuide,
    stochastic_draw,
    tyings,
)
from twodg_pyro.guides.assignment import TyingGuide
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP

#: the core protocol, and what the base derives from it (the module docstring's lists)
CORE = {
    "sites",
    "method",
    "forward",
    "draw",
    "site_kl",
    "kl_terms",
    "marginal_log_density",
    "param_groups",
    "site_parameters",
    "mean_weights",
}
DERIVED = {"sample_weights", "num_trainable", "site"}
FAST_STEP = {"fast_draw", "fast_kl"}
SHARING = {"structure", "load_structure", "tying", "component_parameters"}
#: what typing.Protocol (and abc) put on a protocol class
_PROTOCOL_MARKERS = {"_is_protocol", "_is_runtime_protocol", "_abc_impl"}


def _members(cls) -> set[str]:
    """The names a class defines or annotates itself (not inherited), dunders left out."""
    names = set(vars(cls)) | set(vars(cls).get("__annotations__", {}))
    return {n for n in names if not n.startswith("__")} - _PROTOCOL_MARKERS


def _public(cls) -> set[str]:
    return {n for n in _members(cls) if not n.startswith("_")}


def _model():
    torch.manual_seed(0)
    return BNNModel(MLP(6, (5,), 3), prior=1.0, likelihood=Categorical(100))


def test_the_core_protocol_is_small_and_stated_once():
    assert _public(BNNGuide) == CORE | DERIVED
    assert _public(FastStepGuide) == FAST_STEP
    assert _public(SharingGuide) == SHARING
    for name in CORE | DERIVED | FAST_STEP | SHARING:  # all in the one statement
        assert name in protocol.__doc__, name
    for name in FAST_STEP | SHARING:  # the extensions are not on the base
        assert not hasattr(BNNGuide, name), name


def test_only_the_shared_gmm_guide_has_a_sharing_structure():
    model = _model()
    r1 = Rank1BNNModel(MLP(6, (5,), 3), likelihood=100, components=2)
    others = [MeanFieldGuide(model), SSVIGuide(model, density=0.5), Rank1Guide(r1)]
    for guide in others:
        assert not isinstance(guide, SharingGuide)
        assert not any(hasattr(guide, m) for m in SHARING), type(guide).__name__
    for tying in ("representative", "stochastic", "tied"):
        guide = SharedGMMGuide(model, toy_structure(model), tying)
        assert isinstance(guide, SharingGuide) and isinstance(guide, FastStepGuide)
        assert guide.tying == tying and guide.structure().n_gaussians == 3
    assert isinstance(others[0], FastStepGuide) and not isinstance(others[1], FastStepGuide)


def test_tyings_use_only_public_members_of_the_guide():
    private = {n for n in _members(TyingGuide) if n.startswith("_")}
    assert private == set()
    for module in (tyings, stochastic_draw):
        tree = ast.parse(inspect.getsource(module))
        used = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "guide"
        }
        assert used and not {n for n in used if n.startswith("_")}, module.__name__
        assert used <= set(_members(TyingGuide)), used - _members(TyingGuide)


def _program_draw(guide, seed):
    torch.manual_seed(seed)
    trace = poutine.trace(guide).get_trace()
    return {s.name: trace.nodes[s.name]["value"] for s in guide.sites}


def test_program_and_draws_follow_one_distribution():
    """The mean-field program's draw is ``normal_draws`` (and the fast draw), bit for bit;
    SSVI's program and ``draw`` are the same rsample of its active distribution."""
    model = _model()
    mf = MeanFieldGuide(model, init_scale=0.1)
    program = _program_draw(mf, 3)
    torch.manual_seed(3)
    drawn, params = mf.normal_draws()
    priors = {s.name: model.prior_distribution(s) for s in model.sites}
    torch.manual_seed(3)
    fast = mf.fast_draw(priors)
    for s in model.sites:
        assert torch.equal(program[s.name], drawn[s.name])
        assert torch.equal(program[s.name], fast[s.name])
    assert [p[0] for p in params] == [mf.loc(s.name) for s in model.sites]
    torch.manual_seed(3)
    fused = mf.draw().weights  # one fused addcmul: the same law, the same noise
    for s in model.sites:
        torch.testing.assert_close(fused[s.name], program[s.name])

    ssvi = SSVIGuide(model, density=0.5)
    program = _program_draw(ssvi, 4)
    torch.manual_seed(4)
    drawn = ssvi.draw().weights
    for s in model.sites:
        assert torch.equal(program[s.name], drawn[s.name])
        off = ~ssvi.active_mask(s.name)
        assert (drawn[s.name][off] == 0).all()
    q = ssvi.active_distribution(model.sites[0].name)
    assert torch.equal(q.loc, ssvi.loc(model.sites[0].name))


def test_structure_users_refuse_a_guide_without_a_sharing_structure(tmp_path):
    """The refinement hooks, the compression report and the compact export name what
    they need instead of failing on a missing attribute."""
    from types import SimpleNamespace

    import pytest

    from twodg_pyro.accounting import compression_report
    from twodg_pyro.io import export_compact
    from twodg_pyro.sharing import MahalanobisHook, MergeHook

    model = _model()
    guide = MeanFieldGuide(model)
    state = SimpleNamespace(guide=guide, model=model)
    for hook in (MergeHook(), MahalanobisHook()):
        with pytest.raises(TypeError, match=f"{type(hook).__name__} needs .*MeanFieldGuide"):
            hook.apply(state)
    with pytest.raises(TypeError, match="compression_report needs .*MeanFieldGuide"):
        compression_report(guide, model)
    with pytest.raises(TypeError, match="export_compact needs .*MeanFieldGuide"):
        export_compact(tmp_path / "m.2dgz", model, guide)
    assert not (tmp_path / "m.2dgz").exists()
