"""The Python API's edges: a guide built for another network, constructor arguments,
Pyro-wrapped models, inputs of the wrong width or not finite, labels out of range, a
conditioned weight site, and evaluation draws that do not depend on how the data arrive.
Each refusal is one line naming the value."""

import warnings

import pyro
import pyro.poutine as poutine
import pytest
import torch
from bench_svi_step import make_structure
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch.utils.data import DataLoader, TensorDataset

from twodg_pyro.bnn import BNNModel
from twodg_pyro.evaluation import evaluate, seeded_predict
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide, SSVIGuide
from twodg_pyro.infer import DecomposedELBO, fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.models import MLP
from twodg_pyro.prediction import predict


def _pair(hidden=16, init_scale="paper"):
    torch.manual_seed(0)
    model = BNNModel(MLP(64, (hidden,), 10), prior=1.0, likelihood=Categorical(200))
    return model, MeanFieldGuide(model, init_scale=init_scale, seed=0)


def _data(n=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def _refused_by_predict_evaluate_and_fit(model, guide, x, y, named: str) -> None:
    """``predict``, ``evaluate`` and ``fit`` each refuse the pair with a ValueError
    matching ``named``."""
    with pytest.raises(ValueError, match=named):
        predict(model, guide, x, num_samples=2)
    with pytest.raises(ValueError, match=named):
        evaluate(model, guide, (x, y), num_samples=2)
    with pytest.raises(ValueError, match=named):
        fit(model, guide, [(x, y)], 1, progress=False)


# ---------------------------------------------------------------------- 1. guide sites
def test_a_guide_built_for_another_network_is_refused_naming_the_site_and_shapes():
    model, _ = _pair(16)
    _, other = _pair(32)
    x, y = _data()
    _refused_by_predict_evaluate_and_fit(
        model, other, x, y, r"'layers\.0\.weight'.*\(32, 64\).*\(16, 64\)"
    )


def test_a_guide_with_other_sites_is_refused_naming_the_first_that_differs():
    model, guide = _pair(16)
    x = _data()[0]
    deeper = BNNModel(MLP(64, (16, 16), 10), prior=1.0, likelihood=Categorical(200))
    with pytest.raises(ValueError, match=r"'layers\.2\.weight'.*\(10, 16\).*\(16, 16\)"):
        predict(deeper, guide, x, num_samples=2)
    no_bias = BNNModel(MLP(64, (16,), 10), likelihood=Categorical(200), bias=False)
    with pytest.raises(ValueError, match=r"model's site 'layers\.0\.bias' \(16,\) is not in"):
        predict(model, MeanFieldGuide(no_bias), x, num_samples=2)
    with pytest.raises(ValueError, match=r"guide's site 'layers\.0\.bias' \(16,\) is not a"):
        predict(no_bias, guide, x, num_samples=2)


def test_a_pyro_autoguide_for_another_network_is_refused_naming_the_site():
    from pyro.infer.autoguide import AutoNormal

    model, _ = _pair(16)
    other, _ = _pair(32)
    x, y = _data()
    auto = AutoNormal(other)
    auto(x, y)  # its parameters: those of the 32-wide network
    with pytest.raises(ValueError, match=r"'layers\.0\.weight'.*\(32, 64\).*\(16, 64\)"):
        predict(model, auto, x, num_samples=2)


# ---------------------------------------------------------------------- 2. constructors
def test_guide_constructors_refuse_missing_arguments_by_name():
    model, _ = _pair()
    with pytest.raises(TypeError, match="SharingStructure.*got NoneType"):
        SharedGMMGuide(model, None)
    with pytest.raises(TypeError, match="BNNModel.*got NoneType"):
        SharedGMMGuide(None, make_structure(model))
    with pytest.raises(TypeError, match="BNNModel.*got NoneType"):
        MeanFieldGuide(None)
    with pytest.raises(TypeError, match="BNNModel.*got NoneType"):
        SSVIGuide(None)
    with pytest.raises(TypeError, match="init_loc.*got list"):
        MeanFieldGuide(model, init_loc=[])
    with pytest.raises(ValueError, match=r"init_loc.*'layers\.0\.weight'"):
        MeanFieldGuide(model, init_loc={})
    with pytest.raises(TypeError, match="SharedGMMGuide.*tying.*got NoneType"):
        SharedGMMGuide(model, make_structure(model), tying=None)


def test_a_guide_given_a_pyro_wrapped_model_says_to_pass_the_model_itself():
    model, _ = _pair()
    with pytest.raises(TypeError, match="poutine"):
        MeanFieldGuide(poutine.scale(model, 0.5))


# ---------------------------------------------------------------------- 3. poutine.scale
def test_the_loss_of_a_scaled_model_is_pyros_trace_elbo():
    model, guide = _pair()
    x, y = _data()
    scaled = poutine.scale(model, 0.5)
    torch.manual_seed(3)
    ours = DecomposedELBO(fast_step=False).loss(scaled, guide, x, y)
    torch.manual_seed(3)
    theirs = Trace_ELBO().loss(scaled, guide, x, y)
    assert ours == pytest.approx(theirs, rel=1e-5)
    # and the guide also scaled: the whole bound scales by 0.5
    torch.manual_seed(3)
    both = DecomposedELBO(fast_step=False).loss(scaled, poutine.scale(guide, 0.5), x, y)
    torch.manual_seed(3)
    plain = DecomposedELBO(fast_step=False).loss(model, guide, x, y)
    assert both == pytest.approx(0.5 * plain, rel=1e-5)


def test_fit_trains_a_scaled_model_and_its_likelihood_counts_half():
    x, y = _data()
    records = {}
    for name, scale in (("plain", None), ("scaled", 0.5)):
        model, guide = _pair()
        program = model if scale is None else poutine.scale(model, scale)
        torch.manual_seed(7)
        state = fit(program, guide, [(x, y)], 2, lr=1e-2, progress=False)
        assert state.model is model  # callbacks and checkpoints see the BNNModel
        records[name] = state.history
    # the first epoch's loss is computed before any step: the same draw, half the nll
    first = records["plain"][0]["nll"], records["scaled"][0]["nll"]
    assert first[1] == pytest.approx(0.5 * first[0], rel=1e-5)


def test_fit_and_predict_say_what_they_accept():
    model, guide = _pair()
    x, y = _data()
    with pytest.raises(TypeError, match="fit trains a BNNModel.*got function"):
        fit(lambda x, y: None, guide, [(x, y)], 1, progress=False)
    with pytest.raises(TypeError, match="predict.*BNNModel itself.*poutine"):
        predict(poutine.scale(model, 0.5), guide, x, num_samples=2)
    with pytest.raises(TypeError, match="predict.*BNNModel.*got NoneType"):
        predict(None, guide, x, num_samples=2)


# ---------------------------------------------------------------------- 4. input width
def test_inputs_of_the_wrong_width_name_both_shapes():
    model, guide = _pair()
    x, y = torch.randn(5, 63), torch.randint(0, 10, (5,))
    named = r"\(5, 63\).*takes 64"
    _refused_by_predict_evaluate_and_fit(model, guide, x, y, named)
    with pytest.raises(ValueError, match=named):  # the traced step (vectorised particles)
        DecomposedELBO(fast_step=False).loss(model, guide, x, y)


# ---------------------------------------------------------------------- 5. labels
def test_labels_out_of_range_or_not_integers_are_named():
    model, guide = _pair()
    x, y = _data()
    bad = y.clone()
    bad[4] = 12
    with pytest.raises(ValueError, match=r"label 12 at example 4 is out of range \[0, 10\)"):
        evaluate(model, guide, (x, bad), num_samples=2)
    with pytest.raises(ValueError, match=r"label 12 "):  # a loader: checked after reading
        evaluate(model, guide, DataLoader(TensorDataset(x, bad), batch_size=16), num_samples=2)
    with pytest.raises(ValueError, match=r"label -1 "):
        evaluate(model, guide, (x, torch.full_like(y, -1)), num_samples=2)
    with pytest.raises(ValueError, match="integers.*float32"):
        evaluate(model, guide, (x, y.float()), num_samples=2)
    with pytest.raises(ValueError, match=r"label 12 "):
        classification_metrics(torch.full((50, 10), 0.1), bad)


# ---------------------------------------------------------------------- 6. non-finite inputs
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_inputs_are_refused_naming_the_count_and_first_row(value):
    model, guide = _pair()
    x, y = _data()
    x[3, 2] = value
    x[40, 0] = value
    with pytest.raises(ValueError, match=r"2 of 50 input rows .*not finite.*row 3\b"):
        predict(model, guide, x, num_samples=2)
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    with pytest.raises(ValueError, match=r"2 of 50 input rows .*row 3\b"):
        evaluate(model, guide, loader, num_samples=2)


# ---------------------------------------------------------------------- 7. conditioning
def test_a_conditioned_weight_site_the_guide_samples_warns_and_gives_pyros_loss():
    """Pyro warns ("Found non-auxiliary vars in guide but not model"); its closed-form-KL
    ELBO (TraceMeanField_ELBO) leaves the guide's draw at the site out, as ours does."""
    model, guide = _pair()
    x, y = _data()
    site = model.sites[0]
    conditioned = poutine.condition(model, {site.name: torch.zeros(site.shape)})
    torch.manual_seed(3)
    with pytest.warns(UserWarning, match=r"observes site\(s\) \['layers\.0\.weight'\]"):
        ours = DecomposedELBO(fast_step=False).loss(conditioned, guide, x, y)
    torch.manual_seed(3)
    with pytest.warns(UserWarning, match="Found non-auxiliary vars in guide but not model"):
        theirs = TraceMeanField_ELBO().loss(conditioned, guide, x, y)
    assert ours == pytest.approx(theirs, rel=1e-5)
    with pytest.warns(UserWarning, match="observes"):
        fit(conditioned, guide, [(x, y)], 1, progress=False)


def test_a_weight_site_hidden_from_the_guide_and_conditioned_warns_nothing():
    model, guide = _pair()
    x, y = _data()
    site = model.sites[0]
    conditioned = poutine.condition(model, {site.name: torch.zeros(site.shape)})
    hidden = poutine.block(guide, hide=[site.name])
    torch.manual_seed(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = DecomposedELBO(fast_step=False).loss(conditioned, hidden, x, y)
    assert not [w for w in caught if "observes" in str(w.message)]
    torch.manual_seed(3)
    theirs = TraceMeanField_ELBO().loss(conditioned, hidden, x, y)
    assert ours == pytest.approx(theirs, rel=1e-5)


# ---------------------------------------------------------------------- 8. how data arrive
def test_evaluation_draws_do_not_depend_on_how_the_data_arrive():
    model, guide = _pair(init_scale=0.2)
    x, y = _data(120, seed=1)
    data = TensorDataset(x, y)
    ref = seeded_predict(model, guide, (x, y), 12, seed=5)
    ref_metrics = evaluate(model, guide, (x, y), 12, seed=5)
    for loader in (
        DataLoader(data, batch_size=7),
        DataLoader(data, batch_size=100, shuffle=False),
        DataLoader(data, batch_size=32, num_workers=2),
    ):
        torch.manual_seed(11)  # whatever the state before: the seed fixes the draws
        pred = seeded_predict(model, guide, loader, 12, seed=5)
        torch.testing.assert_close(pred.mean, ref.mean, atol=1e-6, rtol=0)
        assert torch.equal(pred.targets, y)
        got = evaluate(model, guide, loader, 12, seed=5)
        assert got["accuracy"] == ref_metrics["accuracy"]
        assert got["ece"] == pytest.approx(ref_metrics["ece"], abs=1e-6)
    # the caller's stream moves as the draws alone would move it (not at all: seeded)
    torch.manual_seed(2)
    seeded_predict(model, guide, DataLoader(data, batch_size=7, shuffle=True), 12, seed=5)
    after = torch.rand(3)
    torch.manual_seed(2)
    assert torch.equal(torch.rand(3), after)
    pyro.set_rng_seed(0)
