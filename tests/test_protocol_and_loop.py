"""The redesign's seams (issue 15): the guide protocol, the tyings as objects, the one
training loop with its step strategies, the optimiser-row remapping and the registry of
methods."""

import pyro
import pytest
import torch
from torch.utils.data import TensorDataset

from twodg_pyro.bnn import BNNModel
from twodg_pyro.distributed import DataParallelStep, ShardedLoader, fit_distributed
from twodg_pyro.guide import BNNGuide, FastStepGuide, GuideSample, SharingGuide
from twodg_pyro.guides import (
    MeanFieldGuide,
    Rank1BNNModel,
    Rank1Guide,
    SharedGMMGuide,
    SSVIGuide,
    Stochastic,
    Tied,
    tying_named,
)
from twodg_pyro.infer import DecomposedELBO, TrainingStep, fit, remap_optimizer_rows
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.pipeline.runtime.data_parallel import SUPPORTED_METHODS
from twodg_pyro.pipeline.runtime.runner import METHOD_REGISTRY
from twodg_pyro.pipeline.settings.config import METHODS
from twodg_pyro.sharing import SharingStructure
from twodg_pyro.sharing.build import site_layouts


def _model(seed=0, n=100):
    torch.manual_seed(seed)
    return BNNModel(MLP(6, (5,), 3), prior=1.0, likelihood=Categorical(n))


def toy_structure(model, K=3, n_out=4, n_ell=3, seed=0):
    """A structure over ``model``'s weights: ``n_out`` outliers, ``n_ell`` ellipse weights
    over 2 components, the rest plain inliers spread over ``K`` components."""
    gen = torch.Generator().manual_seed(seed)
    sites, off = site_layouts(model.sites)
    perm = torch.randperm(off, generator=gen)
    out, ell = perm[:n_out].sort().values, perm[n_out : n_out + n_ell].sort().values
    plain = perm[n_out + n_ell :].sort().values
    means = torch.stack([torch.linspace(-0.3, 0.3, K), torch.full((K,), 0.05)], 1)
    covs = torch.eye(2).expand(K, 2, 2) * 1e-3
    comps = torch.stack([torch.arange(n_ell) % K, (torch.arange(n_ell) + 1) % K], 1)
    return SharingStructure(
        sites=sites,
        coordinates="sigma",
        means=means,
        covariances=covs.clone(),
        outlier_index=out,
        outlier_loc=torch.randn(n_out, generator=gen) * 0.1,
        outlier_scale=torch.full((n_out,), 0.05),
        plain_index=plain,
        plain_component=torch.randint(0, K, (plain.numel(),), generator=gen),
        ellipse_index=ell,
        ellipse_components=comps,
        ellipse_alphas=torch.tensor([[0.7, 0.3]]).expand(n_ell, 2).clone(),
        inlier_points=torch.randn(plain.numel() + n_ell, 2, generator=gen) * 0.01,
    )


def _guides():
    model = _model()
    yield "mean_field", model, MeanFieldGuide(model)
    for tying in ("representative", "stochastic", "tied"):
        yield tying, model, SharedGMMGuide(model, toy_structure(model), tying=tying)
    yield "ssvi", model, SSVIGuide(model, density=0.5)
    r1 = Rank1BNNModel(MLP(6, (5,), 3), likelihood=100, components=2)
    yield "rank1", r1, Rank1Guide(r1, init_scale=0.1)


@pytest.mark.parametrize("name", ["mean_field", "representative", "stochastic", "tied", "ssvi"])
def test_kl_terms_of_a_draw_are_the_elbo_kl_terms(name):
    """The protocol's closed-form KL (one call, no tracing: what a fused step uses) equals
    the ELBO's KL terms with a Normal prior."""
    model, guide = next((m, g) for n, m, g in _guides() if n == name)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    pyro.set_rng_seed(0)
    terms = DecomposedELBO().loss_terms(model, guide, x, y)
    sample = guide.draw()
    assert isinstance(sample, GuideSample)
    priors = {s.name: model.prior_distribution(s) for s in model.sites}
    kl = guide.kl_terms(priors, sample.weights)
    assert set(kl) == set(terms) - {"nll"}
    for key, value in kl.items():
        torch.testing.assert_close(value, terms[key])


def test_rank1_kl_terms_count_each_factor_site_one_mth():
    model, guide = next((m, g) for n, m, g in _guides() if n == "rank1")
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    terms = DecomposedELBO().loss_terms(model, guide, x, y)
    sample = guide.draw()
    priors = {s.name: model.prior_distribution(s) for s in model.sites}
    torch.testing.assert_close(guide.kl_terms(priors, sample.weights)["kl"], terms["kl"])


def test_every_guide_states_the_protocol():
    for name, model, guide in _guides():
        assert isinstance(guide, BNNGuide)
        sample = guide.draw(4)
        assert {k: tuple(v.shape) for k, v in sample.weights.items()} == {
            s.name: (4, *s.shape) for s in model.sites
        }
        single = guide.sample_weights()
        assert all(single[s.name].shape == s.shape for s in model.sites)
        assert (sample.component_values is not None) == (name == "tied")
        with torch.no_grad():
            density = guide.marginal_log_density()
            assert density.fn(sample.weights).shape == (4,)
        assert density.exact == (name != "tied")
        groups = {p for g in guide.param_groups() for p in g["params"]}
        assert groups == set(guide.parameters())
        assert guide.method == ("2dg" if name in ("representative", "stochastic", "tied") else name)
        assert isinstance(guide, SharingGuide) == isinstance(guide, SharedGMMGuide)
        assert isinstance(guide, FastStepGuide) == (name != "ssvi")
        if isinstance(guide, SharedGMMGuide):
            assert guide.structure() is not None and guide.tying == name
            n_comp = 4 if guide.tying_rule.trains_covariances else 2
            assert len(guide.component_parameters()) == n_comp
        else:  # no structure members at all
            for member in ("structure", "load_structure", "tying", "component_parameters"):
                assert not hasattr(guide, member), (name, member)


def test_tyings_are_strategy_objects_with_their_trainable_count():
    model = _model()
    s = toy_structure(model, K=3, n_out=4)
    for name in ("representative", "stochastic", "tied"):
        rule = tying_named(name)
        guide = SharedGMMGuide(model, s, tying=name)
        assert guide.tying_rule is rule and rule.name == name
        assert guide.num_trainable() == rule.parameters_per_component * 3 + 2 * 4
    assert isinstance(tying_named("stochastic"), Stochastic)
    assert isinstance(tying_named("tied"), Tied)
    with pytest.raises(ValueError, match="unknown tying 'shared'"):
        tying_named("shared")
    with pytest.raises(ValueError, match="unknown tying"):
        SharedGMMGuide(model, s, tying="shared")


def test_remap_optimizer_rows_averages_merged_rows_and_drops_or_adds_others():
    old = torch.nn.Parameter(torch.zeros(4, 2))
    opt = torch.optim.Adam([old])
    old.grad = torch.arange(8.0).reshape(4, 2)
    opt.step()
    moment = opt.state[old]["exp_avg"].clone()
    step = opt.state[old]["step"]
    # a merge: rows 1 and 3 become row 1, rows 0 and 2 stay (renumbered 0 and 2)
    new = torch.nn.Parameter(torch.zeros(3, 2))
    remap_optimizer_rows(opt, [(old, new)], torch.tensor([0, 1, 2, 1]), 3)
    assert old not in opt.state
    merged = opt.state[new]["exp_avg"]
    torch.testing.assert_close(merged[1], (moment[1] + moment[3]) / 2)
    assert torch.equal(merged[0], moment[0]) and torch.equal(merged[2], moment[2])
    assert opt.state[new]["step"] is step
    # a subspace move: rows 0 and 2 are kept (as rows 1 and 0), row 1 dropped, one added
    newer = torch.nn.Parameter(torch.zeros(3, 2))
    remap_optimizer_rows(opt, [(new, newer)], torch.tensor([1, -1, 0]), 3)
    moved = opt.state[newer]["exp_avg"]
    assert torch.equal(moved[0], merged[2]) and torch.equal(moved[1], merged[0])
    assert torch.equal(moved[2], torch.zeros(2))


class _NoBatches(ShardedLoader):
    def __iter__(self):
        self.epoch += 1
        return iter(())


def test_one_loop_an_empty_epoch_is_an_error_in_one_process_and_under_ddp():
    """Before the one loop, fit raised and fit_distributed wrote a record without a loss."""
    model = _model()
    with pytest.raises(ValueError, match="no minibatches in epoch 0"):
        fit(model, MeanFieldGuide(model), [], 1, progress=False)
    data = TensorDataset(torch.randn(10, 6), torch.randint(0, 3, (10,)))
    with pytest.raises(ValueError, match="no minibatches in epoch 0"):
        fit_distributed(model, MeanFieldGuide(model), _NoBatches(data, 4), 1, progress=False)


def test_the_ddp_step_in_one_process_is_the_loop_with_other_seeds(digits):
    """fit_distributed is fit with a DataParallelStep: the same loop, its own seeding and
    global means; the default step is the single-process one."""
    x, y = digits.train.tensors
    data = TensorDataset(x[:256], y[:256])

    def train(step):
        torch.manual_seed(0)
        model = BNNModel(MLP(64, (8,), 10), prior=1.0, likelihood=Categorical(256))
        guide = MeanFieldGuide(model)
        loader = ShardedLoader(data, 64, seed=3)
        if step is None:
            return fit_distributed(model, guide, loader, 2, lr=1e-2, progress=False, seed=3)
        return fit(model, guide, loader, 2, lr=1e-2, progress=False, step=step)

    a, b = train(None), train(DataParallelStep(seed=3))
    assert a.history == b.history and len(a.history) == 2
    assert isinstance(TrainingStep(), TrainingStep) and TrainingStep.is_main


def test_the_registry_of_methods_is_the_settings_choice_set():
    assert tuple(METHOD_REGISTRY) == METHODS
    assert SUPPORTED_METHODS == ("deterministic", "mean_field", "2dg")
