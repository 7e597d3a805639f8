"""Stage 1 end to end on the bundled digits: the mean-field BNN on the true ELBO."""

import pytest
import torch
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import Callback, KLAnnealing, fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.models import MLP
from twodg_pyro.prediction import predict
from twodg_pyro.priors import LaplacePrior


def test_mean_field_reaches_95_percent_with_low_ece(trained_mean_field, digits):
    model, guide = trained_mean_field
    x, y = digits.test.tensors
    metrics = classification_metrics(*_pred(model, guide, x, y))
    assert metrics["accuracy"] >= 0.95, metrics
    assert metrics["ece"] < 0.06, metrics


def _pred(model, guide, x, y):
    p = predict(model, guide, (x, y), num_samples=30)
    return p.mean, p.targets


def test_vectorised_prediction_equals_sequential_bma(trained_mean_field, digits):
    model, guide = trained_mean_field
    x, y = digits.test.tensors
    torch.manual_seed(3)
    fast = predict(model, guide, (x, y), num_samples=12, sample_chunk=5, keep_samples=True)
    torch.manual_seed(3)
    slow = []
    for chunk in (5, 5, 2):
        ws = guide.sample_weights(chunk)
        for s in range(chunk):
            w = {k: v[s] for k, v in ws.items()}
            slow.append(model.network_forward(w, x).softmax(-1))
    slow = torch.stack(slow)
    assert fast.samples.shape == (12, len(x), 10)
    torch.testing.assert_close(fast.samples, slow, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fast.mean, slow.mean(0), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="num_samples .* at least 1, got 0"):
        predict(model, guide, x, num_samples=0)


def test_laplace_prior_trains(digits):
    net = MLP(64, (32,), 10)
    model = BNNModel(net, prior=LaplacePrior(0.5), likelihood=Categorical(len(digits.train)))
    guide = MeanFieldGuide(model)
    state = fit(
        model,
        guide,
        make_loader(digits.train, 128, shuffle=True),
        epochs=30,
        lr=1e-2,
        progress=False,
    )
    first, last = state.history[0], state.history[-1]
    assert last["loss"] < first["loss"]
    x, y = digits.test.tensors
    assert classification_metrics(*_pred(model, guide, x, y))["accuracy"] > 0.85


class StopAfter(Callback):
    def __init__(self, n):
        self.n, self.seen = n, []

    def on_epoch_end(self, state):
        self.seen.append(state.elbo.beta)
        return state.epoch >= self.n


def test_callbacks_stop_training_and_annealing_sets_beta(digits):
    model = BNNModel(MLP(64, (16,), 10), likelihood=Categorical(len(digits.train)))
    guide = MeanFieldGuide(model)
    stopper = StopAfter(3)
    state = fit(
        model,
        guide,
        make_loader(digits.train, 256),
        epochs=50,
        lr=1e-2,
        callbacks=[KLAnnealing(4), stopper],
        progress=False,
    )
    assert state.epoch == 3 and len(state.history) == 3
    assert stopper.seen == [0.0, 0.25, 0.5]
    assert [h["beta"] for h in state.history] == [0.0, 0.25, 0.5]
    assert {"nll", "kl", "loss"} <= set(state.history[-1])


def test_bad_settings_are_clear_errors(digits):
    model = BNNModel(nn.Linear(64, 10), likelihood=Categorical(10))
    guide = MeanFieldGuide(model)
    loader = make_loader(digits.train, 64)
    with pytest.raises(
        ValueError, match="learning rate for group 'loc' must be positive, got -0.1"
    ):
        fit(model, guide, loader, epochs=1, lr=-0.1, progress=False)
    with pytest.raises(ValueError, match="unknown parameter group"):
        fit(model, guide, loader, epochs=1, lr={"centres": 0.1}, progress=False)
    with pytest.raises(ValueError, match="init_scale must be a positive float, got -1"):
        MeanFieldGuide(model, init_scale=-1.0)


def test_nan_loss_stops_with_the_bad_term_named(digits):
    model = BNNModel(nn.Linear(64, 10), likelihood=Categorical(10))
    guide = MeanFieldGuide(model)
    with torch.no_grad():
        guide.loc("weight")[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"epoch 0, step 0.*'nll'"):
        fit(model, guide, make_loader(digits.train, 64), epochs=1, progress=False)
