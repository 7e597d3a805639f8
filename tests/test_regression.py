"""Regression as a first-class task: the learnt and heteroscedastic Gaussian likelihoods,
the predictive mean and epistemic / aleatoric standard deviations, the regression
metrics, the bundled regression data, and their files; on scikit-learn's diabetes data
(checked against scikit-learn's least squares) and known answers."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from sklearn.linear_model import LinearRegression
from torch import nn
from torch.func import vmap

import twodg_pyro as tp
from twodg_pyro.data import load_dataset
from twodg_pyro.data.regression import GAP
from twodg_pyro.metrics import regression_metrics
from twodg_pyro.models import MLP


@pytest.fixture(scope="module")
def diabetes():
    return load_dataset("diabetes", seed=0)


@pytest.fixture(scope="module")
def linear_fit(diabetes):
    """Bayesian linear regression on diabetes with a learnt noise, mean-field, full batch."""
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    x, y = diabetes.train.tensors
    model = tp.BNNModel(
        nn.Linear(10, 1), prior=1.0, likelihood=tp.Gaussian(len(y), learn_scale=True)
    )
    guide = tp.MeanFieldGuide(model)
    tp.fit(model, guide, [(x, y)], epochs=600, lr=3e-2, progress=False)
    return model, guide


def test_the_learnt_noise_and_the_mean_are_least_squares_on_diabetes(diabetes, linear_fit):
    """With 11 weights and 354 examples the posterior is narrow: the predictive mean is the
    least-squares fit and the learnt sigma its residual standard deviation."""
    model, guide = linear_fit
    x, y = diabetes.train.tensors
    x_test, y_test = diabetes.test.tensors
    ols = LinearRegression().fit(x.numpy(), y.numpy())
    resid = math.sqrt(((ols.predict(x.numpy()) - y.numpy()) ** 2).mean())
    assert model.likelihood.scale == pytest.approx(resid, rel=0.05)
    pred = tp.predict(model, guide, x_test, num_samples=200)
    assert pred.mean.shape == pred.std.shape == (len(y_test),)
    ols_test = torch.as_tensor(ols.predict(x_test.numpy()))
    assert float((pred.mean - ols_test).abs().max()) < 0.15
    assert float(torch.corrcoef(torch.stack([pred.mean, ols_test.float()]))[0, 1]) > 0.995
    # the noise dominates: aleatoric = sigma everywhere, epistemic small and positive
    assert torch.allclose(pred.aleatoric_std, torch.tensor(model.likelihood.scale))
    assert 0 < float(pred.epistemic_std.max()) < 0.3 * float(pred.aleatoric_std[0])
    metrics = tp.evaluate(model, guide, (x_test, y_test), num_samples=200)
    ols_rmse = float((ols_test - y_test).square().mean().sqrt())
    assert metrics["rmse"] == pytest.approx(ols_rmse, rel=0.03)
    assert 0.8 <= metrics["coverage_90"] <= 1.0 and set(metrics) >= {"nll", "coverage_50"}


def test_predict_splits_the_variance_by_the_law_of_total_variance(diabetes):
    """A heteroscedastic network: the predictive moments are those of the same draws
    computed by hand (epistemic: the spread of the means; aleatoric: the mean noise)."""
    torch.manual_seed(0)
    x = diabetes.test.tensors[0][:20]
    model = tp.BNNModel(MLP(10, (8,), 2), likelihood=tp.HeteroscedasticGaussian(100))
    guide = tp.MeanFieldGuide(model)
    torch.manual_seed(1)
    pred = tp.predict(model, guide, x, num_samples=12, sample_chunk=12, keep_samples=True)
    torch.manual_seed(1)
    out = vmap(model.network_forward, in_dims=(0, None))(guide.sample_weights(12), x)
    loc, scale = out[..., 0], torch.nn.functional.softplus(out[..., 1]) + 1e-6
    assert torch.allclose(pred.samples, loc)
    assert torch.allclose(pred.mean, loc.mean(0), atol=1e-6)
    assert torch.allclose(pred.epistemic_std, loc.std(0, unbiased=False), atol=1e-5)
    assert torch.allclose(pred.aleatoric_std, scale.square().mean(0).sqrt(), atol=1e-6)
    assert torch.allclose(pred.std.square(), pred.epistemic_std**2 + pred.aleatoric_std**2)


def test_regression_metrics_give_known_answers():
    y = torch.tensor([0.0, 0.5, -1.0, 1.5, 3.0])
    mean, std = torch.zeros(5), torch.ones(5)
    m = regression_metrics(mean, std, y)
    assert m["rmse"] == pytest.approx(math.sqrt((0.25 + 1 + 2.25 + 9) / 5))
    assert m["nll"] == pytest.approx(0.5 * math.log(2 * math.pi) + (0.25 + 1 + 2.25 + 9) / 10)
    # |z| <= 0.674 (50 %): 2 of 5; <= 1.645 (90 %): 4; <= 1.960 (95 %): 4
    assert (m["coverage_50"], m["coverage_90"], m["coverage_95"]) == (0.4, 0.8, 0.8)
    with pytest.raises(ValueError, match="floating point"):
        regression_metrics(mean, std, y.long())
    with pytest.raises(ValueError, match="std must be positive"):
        regression_metrics(mean, torch.zeros(5), y)
    with pytest.raises(ValueError, match=r"one shape, got \(5,\), \(5,\) and \(5, 1\)"):
        regression_metrics(mean, std, y[:, None])


def test_bad_targets_are_named(diabetes, linear_fit):
    model, guide = linear_fit
    x, y = diabetes.test.tensors
    with pytest.raises(ValueError, match="regression targets must be floating point.*int64"):
        tp.evaluate(model, guide, (x, y.long()))
    with pytest.raises(ValueError, match=r"targets of shape \(88, 1\) do not match.*\(88,\)"):
        model(x, y[:, None])
    with pytest.raises(ValueError, match="even number of outputs.*\\(4, 3\\)"):
        tp.HeteroscedasticGaussian(10).distribution(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="scale must be positive, got -1.0"):
        tp.Gaussian(10, scale=-1.0, learn_scale=True)


def test_stock_svi_trains_the_learnt_noise_and_files_keep_it(diabetes, tmp_path):
    """The noise is a pyro.param of the model ("BNNModel.likelihood.log_scale"); a model
    file stores it exactly, and the loaded model predicts as the saved one; float64 too."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = diabetes.train.tensors
    model = tp.BNNModel(
        MLP(10, (8,), 1).double(), likelihood=tp.Gaussian(len(y), 2.0, learn_scale=True)
    )
    guide = tp.MeanFieldGuide(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 5e-2}), Trace_ELBO())
    for _ in range(30):
        svi.step(x, y)
    assert pyro.get_param_store()["BNNModel.likelihood.log_scale"] is model.likelihood.log_scale
    assert model.likelihood.scale < 1.5  # from 2.0, towards the residuals
    pyro.clear_param_store()
    spec = {"name": "mlp", "kwargs": {"in_features": 10, "hidden": [8], "num_classes": 1}}
    model2, guide2 = tp.load_model(tp.save_model(tmp_path / "r.pt", model, guide, network=spec))
    assert torch.equal(model2.likelihood.log_scale, model.likelihood.log_scale)
    assert model2.likelihood.log_scale.dtype == torch.float64
    a = tp.evaluate(model, guide, diabetes.test.tensors, num_samples=10)
    assert a == tp.evaluate(model2, guide2, diabetes.test.tensors, num_samples=10)
    hetero = tp.BNNModel(MLP(10, (8,), 2), likelihood=tp.HeteroscedasticGaussian(len(y), 1e-3))
    spec["kwargs"]["num_classes"] = 2
    path = tp.save_model(tmp_path / "h.pt", hetero, tp.MeanFieldGuide(hetero), network=spec)
    assert tp.load_model(path)[0].likelihood.min_scale == 1e-3


def test_the_regression_data_are_bundled_standardised_and_deterministic():
    d = load_dataset("diabetes", val_fraction=0.1, seed=1)
    assert (len(d.train), len(d.val), len(d.test)) == (310, 44, 88) and d.task == "regression"
    y = torch.cat([d.train.tensors[1], d.val.tensors[1]])
    assert y.dtype == torch.float32 and abs(float(y.mean())) < 1e-5
    assert float(y.std(unbiased=False)) == pytest.approx(1.0, abs=1e-5)
    # the test set does not depend on the validation split
    test = load_dataset("diabetes", seed=1).test.tensors
    assert all(torch.equal(a, b) for a, b in zip(test, d.test.tensors, strict=True))
    a, b = load_dataset("gap1d"), load_dataset("gap1d")
    assert all(torch.equal(s, t) for s, t in zip(a.train.tensors, b.train.tensors, strict=True))
    raw = a.train.tensors[0] * a.info["input_std"] + a.info["input_mean"]
    assert len(raw) == 80 and not bool(((raw > GAP[0]) & (raw < GAP[1])).any())
    gap = a.info["gap_x"] * a.info["input_std"] + a.info["input_mean"]
    assert float(gap.min()) > GAP[0] and float(gap.max()) < GAP[1]
    assert not torch.equal(load_dataset("gap1d", seed=1).train.tensors[0], a.train.tensors[0])


def test_the_command_line_evaluates_a_regression_model_file_and_a_run_refuses_one(
    diabetes, tmp_path, capsys
):
    """``twodg-pyro evaluate FILE --data diabetes`` gives evaluate's regression metrics; a
    regression model on digits, and a run on a regression data set, are refused by name."""
    import json

    from twodg_pyro.cli import main
    from twodg_pyro.pipeline import config_from_dict
    from twodg_pyro.settings import ConfigError

    torch.manual_seed(0)
    x, y = diabetes.train.tensors
    model = tp.BNNModel(MLP(10, (8,), 1), likelihood=tp.Gaussian(len(y), learn_scale=True))
    guide = tp.MeanFieldGuide(model)
    tp.fit(model, guide, [(x, y)], epochs=20, lr=1e-2, progress=False)
    spec = {"name": "mlp", "kwargs": {"in_features": 10, "hidden": [8], "num_classes": 1}}
    path = str(tp.save_model(tmp_path / "r.pt", model, guide, network=spec))
    out = tmp_path / "m.json"
    assert (
        main(["evaluate", path, "--data", "diabetes", "--num-samples", "20", "--out", str(out)])
        == 0
    )
    got = json.loads(out.read_text())
    want = tp.evaluate(model, guide, diabetes.test.tensors, num_samples=20, seed=0)
    assert {k: got[k] for k in want} == want and got["data"] == "diabetes"
    capsys.readouterr()
    assert main(["evaluate", path, "--num-samples", "2"]) == 2  # digits assumed: refused
    assert "pass --data" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="data.name = 'diabetes'.*regression data set"):
        config_from_dict({"data": {"name": "diabetes"}})
