r"""One trained model, one set of numbers: the seeded posterior draws every evaluation uses.

The predictive metrics of a BNN are Monte Carlo estimates over :math:`S` draws
:math:`w^{(s)} \sim q(w)`: two evaluations of the same model with different draws give
different numbers (on the 359 digits test images the NLL moves by a standard deviation
of about 0.04 between 30-draw evaluations).  So that the numbers of one model agree
wherever they are printed, every evaluation of the library draws its weights the same
way:

* torch's random state is set to ``seed`` for the evaluation only (:func:`seeded`; the
  caller's state is restored afterwards, so an evaluation never shifts the draws of
  what comes next);
* the guide draws ``sample_chunk`` (10) samples at a time with ``sample_weights``, each
  chunk evaluated on every data batch before the next is drawn
  (:func:`~twodg_pyro.prediction.predict`): the draws do not depend on the data, their
  order or their batching, nor on how they arrive (``(X, y)`` tensors or a
  ``DataLoader``, whose iterator draws a base seed from the global RNG: ``predict``
  reads the batches with the random state forked, before the first draw).

:func:`seeded_predict` is :func:`~twodg_pyro.prediction.predict` under :func:`seeded`;
:func:`evaluate` adds the metrics and a record of the draws.  The results table of a
run (``results.json``/``results.md``), its ``diagnostics.json``, its reliability figure,
the ArviZ export (:func:`~twodg_pyro.diagnostics.to_inference_data`, whose draws are
these same draws) and ``twodg-pyro evaluate`` on the run's model file all use ``seed`` =
the run's seed and ``num_samples`` = its ``num_samples``: for the same model, device and
evaluation examples they print the same numbers.  (A compact ``.2dgz`` file holds a
rounded model: its numbers are close, not equal; ``benchmarks/bench_compact_export.py``
measures how close.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .likelihoods import RegressionLikelihood
from .metrics import check_labels, classification_metrics, regression_metrics
from .prediction import Prediction, _cuda_devices, _device_of, predict

#: Draws taken from the guide at once; part of what fixes the draws of a seed.
SAMPLE_CHUNK = 10


def n_examples(data) -> int:
    """Examples in ``(X, y)`` tensors, a ``Dataset`` or a ``DataLoader``."""
    if isinstance(data, tuple):
        return int(data[0].shape[0])
    return len(getattr(data, "dataset", data))


def data_to_device(data, device):
    """Evaluation data on ``device``: ``(X, y)`` tensors moved there, a loader as it is
    (its batches are moved when they are used)."""
    if isinstance(data, tuple):
        return tuple(t.to(device) for t in data)
    return data


@contextmanager
def seeded(seed: int, device: torch.device | str | None = None) -> Iterator[None]:
    """Run the block with torch's random state (CPU, and ``device``'s GPU) set to
    ``seed``; the caller's state is restored on exit."""
    with torch.random.fork_rng(devices=_cuda_devices(device)):
        torch.manual_seed(int(seed))
        yield


def seeded_predict(model, guide, data, num_samples: int = 30, seed: int = 0, *, device=None, **kw):
    """:func:`~twodg_pyro.prediction.predict` with ``num_samples`` draws seeded by ``seed``
    (:func:`seeded`; ``sample_chunk`` = :data:`SAMPLE_CHUNK`): the draws every evaluation
    of the library uses.  ``device`` and the keyword arguments ``kw`` (``batch_size``,
    ``keep_samples``, ``progress``) are ``predict``'s.  Returns the
    :class:`~twodg_pyro.prediction.Prediction`."""
    where = device if device is not None else _device_of(guide)  # None: the CPU
    with seeded(seed, where):
        return predict(
            model, guide, data, num_samples, sample_chunk=SAMPLE_CHUNK, device=device, **kw
        )


def draws_record(num_samples: int, seed: int, n_examples: int, split: str = "test") -> dict:
    """How a set of metrics was computed: ``{"num_samples", "seed", "sample_chunk",
    "n_examples", "split"}`` (what results.json, diagnostics.json and ``evaluate`` state)."""
    return {
        "num_samples": int(num_samples),
        "seed": int(seed),
        "sample_chunk": SAMPLE_CHUNK,
        "n_examples": int(n_examples),
        "split": split,
    }


def draws_sentence(draws: dict) -> str:
    """One line saying which draws and examples a set of metrics used."""
    return (
        f"N_s = {draws['num_samples']} posterior draws seeded with {draws['seed']} on the "
        f"{draws['n_examples']:,} {draws.get('split', 'test')} examples"
    )


def prediction_metrics(pred: Prediction) -> dict[str, float]:
    """The metrics of a labelled :class:`~twodg_pyro.prediction.Prediction`: RMSE, Gaussian
    NLL and interval coverage of a regression one (it has a ``std``,
    :func:`~twodg_pyro.metrics.regression_metrics`), else accuracy, NLL, ECE and Brier
    (:func:`~twodg_pyro.metrics.classification_metrics`)."""
    if pred.std is not None:
        return regression_metrics(pred.mean, pred.std, pred.targets)
    return classification_metrics(pred.mean, pred.targets)


def evaluate(model, guide, data, num_samples: int = 30, seed: int = 0, **kw) -> dict:
    """The metrics of the Bayesian model average over the seeded draws
    (:func:`seeded_predict`, which takes the keyword arguments ``kw``: ``batch_size``,
    ``device``, ``progress``) on labelled ``data``, plus ``num_samples``, ``seed`` and
    ``n_examples``: accuracy, NLL, ECE and Brier for classification; RMSE, Gaussian NLL
    and the coverage of the central 50 / 90 / 95 % intervals (``coverage_50``, ...) for a
    regression likelihood (:func:`prediction_metrics`).

    Raises:
        ValueError: ``data`` without labels or targets, class labels that are not integers
            in ``[0, C)`` (checked before predicting for ``(X, y)`` tensors, the first bad
            one named), regression targets that are not floating point, and what
            :func:`~twodg_pyro.prediction.predict` refuses.
    """
    regression = isinstance(getattr(model, "likelihood", None), RegressionLikelihood)
    if isinstance(data, (tuple, list)) and len(data) == 2 and torch.is_tensor(data[1]):
        if not regression:  # dtype and sign now; the classes' range once C is known
            check_labels(data[1])
        elif not data[1].is_floating_point():
            raise ValueError(
                f"regression targets must be floating point, got dtype {data[1].dtype}"
            )
    pred = seeded_predict(model, guide, data, num_samples, seed, **kw)
    if pred.targets is None:
        raise ValueError("evaluate needs labelled data: pass (X, y) or batches of (x, y)")
    return {
        **prediction_metrics(pred),
        "num_samples": int(num_samples),
        "seed": int(seed),
        "n_examples": int(pred.mean.shape[0]),
    }
