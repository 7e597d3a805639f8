r"""The uncertainty record of one model: OOD detection, shift, selective prediction.

:func:`uncertainty_report` takes a prediction function ``predict_fn(X) -> (S, N, C)``
per-draw class probabilities (``S = 1`` for a deterministic network) and returns
(``H`` the predictive entropy, ``MI`` the mutual information, :mod:`.scores`)::

    {
      "bayesian": bool, "num_draws": S, "n_examples": N,
      "clean": {"accuracy", "nll", "ece", "brier"},          # classification_metrics
      "mean_mi_clean": mean MI on the clean test inputs (0 when S = 1),
      "mean_entropy_clean": mean H on the clean test inputs,
      "aurc", "aurc_optimal", "eaurc":                         # selective, clean, max p
      "ood": {set: {"entropy_auroc", "mi_auroc" (bayesian only), "maxprob_auroc",
                    "aupr", "fpr95"}},                          # aupr, fpr95 of H
      "shift": {family: {"1".."5": {"accuracy", "nll", "ece"}}},
      "scores": {"clean": {"entropy", "mi", "maxprob"}, "ood": {set: {...}}}  # if asked
    }

OOD is the positive class of every detection metric (:mod:`.detection`: FPR at 95 % TPR,
no interpolation).  ``shift`` holds the metrics of the model average on the corrupted
test inputs (:func:`~.corruptions.corrupt`, clamped to the pixel range and normalised
again).  Predictions run ``chunk_size`` examples at a time and keep only per-example
numbers, so memory is bounded by one chunk's ``(S, chunk, C)`` draws (and one corrupted
copy of the test inputs).  The record is plain numbers, lists and dicts (JSON-ready).

:func:`evaluate_uncertainty` runs it for a BNN through the library's seeded draws
(:func:`~twodg_pyro.evaluation.seeded_predict` with ``keep_samples=True``: the same
weights for every chunk and every set), :func:`evaluate_uncertainty_net` for a plain
torch network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from ..data.transforms import MNIST_MEAN, MNIST_STD
from ..evaluation import draws_record, seeded_predict
from ..metrics import classification_metrics
from ..prediction import deterministic_predict
from ._pixels import Stat, check_inputs
from .corruptions import CORRUPTIONS, SEVERITIES, corrupt
from .detection import ood_metrics
from .ood_sets import builtin_ood_sets
from .scores import as_samples, uncertainty_scores
from .selective import selective_metrics

#: ``predict_fn(X) -> (S, N, C)`` per-draw class probabilities.
PredictFn = Callable[[torch.Tensor], torch.Tensor]

_SCORE_KEYS = ("entropy", "mi", "maxprob")


def _predict_chunked(
    predict_fn: PredictFn, x: torch.Tensor, chunk_size: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """``(mean (N, C), {score: (N,)}, S)`` of ``predict_fn`` run ``chunk_size`` at a time."""
    means, scores, draws = [], {k: [] for k in _SCORE_KEYS}, None
    for chunk in x.split(int(chunk_size)):
        samples = as_samples(predict_fn(chunk), "predict_fn(X)").detach().cpu()
        if samples.shape[1] != chunk.shape[0]:
            raise ValueError(
                f"predict_fn returned {samples.shape[1]} predictions for {chunk.shape[0]} inputs"
            )
        if draws is not None and samples.shape[0] != draws:
            raise ValueError(f"predict_fn returned {samples.shape[0]} draws, then {draws}")
        draws = samples.shape[0]
        means.append(samples.mean(0))
        for k, v in uncertainty_scores(samples).items():
            if k in scores:
                scores[k].append(v)
    return torch.cat(means), {k: torch.cat(v) for k, v in scores.items()}, int(draws)


def _check_sets(x: torch.Tensor, ood_sets: Mapping[str, torch.Tensor]) -> None:
    for name, xo in ood_sets.items():
        check_inputs(xo, f"OOD set {name!r}")
        if tuple(xo.shape[1:]) != tuple(x.shape[1:]):
            raise ValueError(
                f"OOD set {name!r} has inputs of shape {tuple(xo.shape[1:])}, the test inputs "
                f"{tuple(x.shape[1:])}"
            )


def uncertainty_report(
    predict_fn: PredictFn,
    test_data: tuple[torch.Tensor, torch.Tensor],
    ood_sets: Mapping[str, torch.Tensor] | None,
    corruptions: Sequence[str] | None,
    *,
    bayesian: bool,
    severities: Sequence[int] = SEVERITIES,
    pixel_mean: Stat = MNIST_MEAN,
    pixel_std: Stat = MNIST_STD,
    image_shape: Sequence[int] | None = None,
    seed: int = 0,
    chunk_size: int = 1024,
    return_scores: bool = False,
) -> dict:
    """The uncertainty record (module docstring) of ``predict_fn`` on labelled test data.

    Args:
        predict_fn: ``X -> (S, N, C)`` per-draw probabilities (or ``(N, C)``: one draw).
        test_data: ``(X, y)``, ``X`` normalised as the network expects.
        ood_sets: ``{name: inputs}`` normalised like ``X`` (:mod:`.ood_sets`); ``None`` or
            ``{}``: no OOD entries.
        corruptions: family names of :data:`~.corruptions.CORRUPTIONS`; ``None`` or
            ``()``: no shift entries.
        bayesian: add ``mi_auroc`` to every OOD entry.
        severities: the severities of every family (subset of 1..5).
        pixel_mean, pixel_std: the normalisation of ``X`` (for the corruptions).
        image_shape: ``(C, H, W)`` of a flat input (e.g. ``(1, 8, 8)``).
        seed: the corruptions' seed.
        chunk_size: examples per call of ``predict_fn``.
        return_scores: add the per-example scores (lists) under ``"scores"``.

    Raises:
        ValueError: bad inputs, an unknown corruption or severity, OOD sets of another
            input shape, or a ``predict_fn`` that returns the wrong shape.
    """
    x, y = test_data
    check_inputs(x, "test inputs")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"test labels must be (N,) = ({x.shape[0]},), got {tuple(y.shape)}")
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size!r}")
    ood_sets = dict(ood_sets or {})
    families = [corruptions] if isinstance(corruptions, str) else list(corruptions or ())
    unknown = [f for f in families if f not in CORRUPTIONS]
    if unknown:
        raise ValueError(f"unknown corruption(s) {unknown}; known: {', '.join(CORRUPTIONS)}")
    bad = [s for s in severities if isinstance(s, bool) or s not in SEVERITIES]
    if bad:
        raise ValueError(f"severities must be in {SEVERITIES}, got {bad}")
    _check_sets(x, ood_sets)

    mean, clean, draws = _predict_chunked(predict_fn, x, chunk_size)
    record: dict = {
        "bayesian": bool(bayesian),
        "num_draws": draws,
        "n_examples": int(x.shape[0]),
        "clean": classification_metrics(mean, y),
        "mean_mi_clean": float(clean["mi"].double().mean()),
        "mean_entropy_clean": float(clean["entropy"].double().mean()),
        **selective_metrics(mean, y),
        "ood": {},
        "shift": {},
    }
    raw: dict = {"clean": {k: v.tolist() for k, v in clean.items()}, "ood": {}}
    for name, xo in ood_sets.items():
        _, out, _ = _predict_chunked(predict_fn, xo, chunk_size)
        by = {k: ood_metrics(clean[k], out[k]) for k in _SCORE_KEYS if bayesian or k != "mi"}
        entry = {f"{k}_auroc": m["auroc"] for k, m in by.items()}
        entry.update(aupr=by["entropy"]["aupr"], fpr95=by["entropy"]["fpr95"])
        record["ood"][name] = entry
        raw["ood"][name] = {k: v.tolist() for k, v in out.items()}
    for family in families:
        shift = record["shift"][family] = {}
        for severity in severities:
            xc = corrupt(x, family, severity, pixel_mean, pixel_std, seed, image_shape=image_shape)
            metrics = classification_metrics(_predict_chunked(predict_fn, xc, chunk_size)[0], y)
            shift[str(int(severity))] = {k: metrics[k] for k in ("accuracy", "nll", "ece")}
    if return_scores:
        record["scores"] = raw
    return record


#: The arguments of :func:`evaluate_uncertainty` that :func:`uncertainty_report` takes.
_REPORT_OPTIONS = (
    "severities pixel_mean pixel_std image_shape seed chunk_size return_scores".split()
)


def _evaluate(predict_fn: PredictFn, bayesian: bool, o: dict) -> dict:
    """:func:`uncertainty_report` of ``predict_fn`` with the arguments ``o`` of
    :func:`evaluate_uncertainty` (or :func:`evaluate_uncertainty_net`): ``ood_sets=None``
    is every built-in set, ``corruptions=None`` every family."""
    x, sets = o["test_X"], o["ood_sets"]
    if sets is None:
        sets = builtin_ood_sets(
            x, o["pixel_mean"], o["pixel_std"], o["seed"], image_shape=o["image_shape"]
        )
    families = list(CORRUPTIONS) if o["corruptions"] is None else o["corruptions"]
    kw = {k: o[k] for k in _REPORT_OPTIONS}
    return uncertainty_report(predict_fn, (x, o["test_y"]), sets, families, bayesian=bayesian, **kw)


def evaluate_uncertainty(
    model,
    guide,
    test_X: torch.Tensor,
    test_y: torch.Tensor,
    *,
    num_samples: int = 30,
    seed: int = 0,
    ood_sets: Mapping[str, torch.Tensor] | None = None,
    corruptions: Sequence[str] | None = None,
    severities: Sequence[int] = SEVERITIES,
    pixel_mean: Stat = MNIST_MEAN,
    pixel_std: Stat = MNIST_STD,
    image_shape: Sequence[int] | None = None,
    batch_size: int = 512,
    chunk_size: int = 2048,
    device=None,
    return_scores: bool = False,
) -> dict:
    """:func:`uncertainty_report` of a BNN (``bayesian=True``) with the seeded draws of
    :func:`~twodg_pyro.evaluation.seeded_predict` (``num_samples``, ``seed``), plus
    ``"draws"`` (:func:`~twodg_pyro.evaluation.draws_record`).  A model with ``K``
    outputs per draw (a rank-1 BNN's components) gives ``num_draws`` = ``num_samples K``
    predictions per example, over which the MI is taken.

    ``ood_sets=None``: every built-in set (:func:`~.ood_sets.builtin_ood_sets` of
    ``test_X`` with ``pixel_mean``, ``pixel_std``, ``seed``, ``image_shape``; drop
    ``digits_upsampled`` for a model of the digits themselves); ``corruptions=None``:
    every family.  Pass ``{}`` / ``()`` for none.
    """

    kw = {"batch_size": batch_size, "device": device, "keep_samples": True}

    def predict_fn(xb: torch.Tensor) -> torch.Tensor:
        return seeded_predict(model, guide, xb, num_samples, seed, **kw).samples

    record = _evaluate(predict_fn, True, locals())
    record["draws"] = draws_record(num_samples, seed, test_X.shape[0])
    return record


def evaluate_uncertainty_net(
    net: torch.nn.Module,
    test_X: torch.Tensor,
    test_y: torch.Tensor,
    *,
    seed: int = 0,
    ood_sets: Mapping[str, torch.Tensor] | None = None,
    corruptions: Sequence[str] | None = None,
    severities: Sequence[int] = SEVERITIES,
    pixel_mean: Stat = MNIST_MEAN,
    pixel_std: Stat = MNIST_STD,
    image_shape: Sequence[int] | None = None,
    batch_size: int = 512,
    chunk_size: int = 2048,
    return_scores: bool = False,
) -> dict:
    """:func:`uncertainty_report` of a plain network returning logits (``bayesian=False``,
    one draw: its softmax, :func:`~twodg_pyro.prediction.deterministic_predict`; its MI is
    0).  Defaults of ``ood_sets`` and ``corruptions`` as :func:`evaluate_uncertainty`."""

    def predict_fn(xb: torch.Tensor) -> torch.Tensor:
        return deterministic_predict(net, xb, batch_size=batch_size).mean.unsqueeze(0)

    return _evaluate(predict_fn, False, locals())
