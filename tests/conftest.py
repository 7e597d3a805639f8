"""Shared fixtures: the bundled digits and a mean-field BNN trained on them once."""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch

from twodg_pyro.data import load_digits_split, make_loader
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.model import BNNModel
from twodg_pyro.models import MLP

warnings.filterwarnings("ignore", message=".*was not registered in the param store.*")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    yield


@pytest.fixture(scope="session")
def digits():
    """Seeded digits split (flat, standardised)."""
    return load_digits_split(seed=0)


@pytest.fixture(scope="session")
def trained_mean_field(digits):
    """A 64-128-10 mean-field BNN trained on the true ELBO (N(0, 1) prior): (model, guide)."""
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    net = MLP(64, (128,), 10)
    model = BNNModel(net, prior=1.0, likelihood=Categorical(len(digits.train)))
    guide = MeanFieldGuide(model, seed=0)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    fit(model, guide, loader, epochs=200, lr=1e-2, progress=False)
    return model, guide
