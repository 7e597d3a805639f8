"""Shared fixtures: the bundled digits and a mean-field BNN trained on them once."""

from __future__ import annotations

import copy
import os
import warnings

# under pytest-xdist (``make test`` runs one worker per core) every worker, and every
# process a test starts, takes one torch thread: two threads per worker would
# oversubscribe the cores; set before torch is imported
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import pyro
import pytest
import torch
from fault_injection import TINY  # the tiny digits run, with checkpoints

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import load_digits_split, make_loader
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP

warnings.filterwarnings("ignore", message=".*was not registered in the param store.*")
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


class TiedLinears(torch.nn.Module):
    """Two Linear layers ``a`` and ``b`` sharing one weight (tied weights): one
    ``nn.Parameter`` under the names ``a.weight`` and ``b.weight``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


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
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as under xdist: the same network however run
    try:
        fit(model, guide, loader, epochs=200, lr=1e-2, progress=False)
    finally:
        torch.set_num_threads(threads)
    return model, guide


@pytest.fixture(scope="session")
def stage2_structure(trained_mean_field, digits):
    """Stage 2 on the trained mean-field BNN: quantile outliers, 24 components, no merging."""
    from twodg_pyro.pipeline import SharingConfig
    from twodg_pyro.sharing import build_sharing

    model, mf_guide = trained_mean_field
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    cfg = SharingConfig(
        outlier_rule="quantile",
        mu_quantile=0.995,
        grad_percentile=0.005,
        n_components=24,
        n_min=20,
        use_merging=False,
    )
    torch.manual_seed(0)  # the gradients' draws: the same structure whatever ran before
    structure, _ = build_sharing(model, mf_guide, loader, cfg)
    return structure


#: The groups of the ArviZ tree of a shared-GMM BNN (``diagnostics.to_inference_data``).
ARVIZ_GROUPS = {
    "posterior",
    "posterior_predictive",
    "log_likelihood",
    "observed_data",
    "constant_data",
    "sample_stats",
    "sharing",
}

#: Stage 2 for the small digits models: quantile outliers, 8 components of >= 5 weights.
SMALL_SHARING = {
    "outlier_rule": "quantile",
    "mu_quantile": 0.99,
    "grad_percentile": 0.005,
    "n_components": 8,
    "n_min": 5,
}

#: The whole pipeline on digits in about two seconds, with checkpoints: a 64-16-10 MLP,
#: two epochs per stage (``tiny_run_config``, ``tiny_run``).
_TINY_RUN = {**TINY, "seed": 0}


@pytest.fixture
def interrupt_after(monkeypatch):
    """``interrupt_after(stage, epoch)``: runs raise ``KeyboardInterrupt`` right after the
    checkpoint of ``stage`` at ``epoch`` is written; ``interrupt_after(None)`` ends it."""
    from gpu_check import interrupting_save

    from twodg_pyro.infer.checkpoint import Checkpoint

    real = Checkpoint.save

    def patch(stage: str | None, epoch: int = 0) -> None:
        save = real if stage is None else interrupting_save(real, stage, epoch)
        monkeypatch.setattr(Checkpoint, "save", save)

    return patch


@pytest.fixture
def tiny_run_config() -> dict:
    """The settings of the tiny digits run (a fresh copy: tests may change it)."""
    return copy.deepcopy(_TINY_RUN)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished tiny digits run folder (results, model file, checkpoints), made once;
    tests copy what they change."""
    from twodg_pyro.pipeline import config_from_dict, run

    out = tmp_path_factory.mktemp("tiny") / "run"
    run(config_from_dict(copy.deepcopy(_TINY_RUN)), out)
    return out
