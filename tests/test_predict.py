"""Posterior predictive: the optional progress bar."""

import pytest
import torch

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.prediction import predict


def _model_and_guide():
    torch.manual_seed(0)
    model = BNNModel(MLP(8, (16,), 3), prior=1.0, likelihood=Categorical(100))
    return model, MeanFieldGuide(model, seed=0)


def test_progress_bar_goes_to_stderr_and_leaves_the_prediction_unchanged(capsys):
    model, guide = _model_and_guide()
    x, y = torch.randn(50, 8), torch.randint(0, 3, (50,))
    kw = dict(num_samples=7, batch_size=16, sample_chunk=3, keep_samples=True)
    torch.manual_seed(1)
    quiet = predict(model, guide, (x, y), **kw)
    assert capsys.readouterr() == ("", "")
    torch.manual_seed(1)
    shown = predict(model, guide, (x, y), progress=True, **kw)
    out, err = capsys.readouterr()
    assert out == "" and "predict" in err
    assert torch.equal(quiet.mean, shown.mean) and torch.equal(quiet.samples, shown.samples)
    assert torch.equal(quiet.targets, shown.targets)


def test_progress_bar_is_closed_when_prediction_fails(capsys):
    from tqdm import tqdm

    model, guide = _model_and_guide()
    with pytest.raises(ValueError, match=r"\(10, 5\).*takes 8"):  # wrong width
        predict(model, guide, torch.randn(10, 5), num_samples=2, progress=True)
    assert "predict" in capsys.readouterr().err
    assert not [b for b in list(tqdm._instances) if b.desc == "predict"]
