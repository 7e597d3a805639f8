"""What a user deploys and runs: the bytes on disk and the forward passes of every method.

Counting floating-point numbers (``stored_params``) hides what matters on a small device:
every weight of a 2DG BNN also needs its component index, and a Bayesian prediction
runs many forward passes.  :func:`add_costs` adds to every record of a run's table:

``file`` and ``file_bytes``
    the smallest file the library writes for the method and loads back to its
    predictions, and its size in bytes (``os.path.getsize`` of that file): the compact
    ``model_2dg.2dgz`` for the 2DG BNN (:func:`~twodg_pyro.io.export_compact` at its
    default precision; ``file_prob_diff`` says how close its predictions are to the
    row's: the largest difference of a predicted probability on the test images, same
    seeded draws), ``model_<method>.pt`` for the other methods.  The ``deterministic``
    row has no file: its ``file_bytes`` is the float32 size of its parameters and
    floating-point buffers (4 bytes each, no container), and ``file_bytes_int8`` the
    INT8 size (1 byte per parameter and a float32 scale per parameter tensor, buffers at
    float32), both computed (:func:`~twodg_pyro.accounting.network_bytes`);
``bytes_per_weight``
    ``file_bytes`` over the network's parameters (the deterministic network's count; 4.0
    for the float32 deterministic network);
``float32_ratio``
    the float32 size of the deterministic network of the same architecture over
    ``file_bytes``: how many times smaller than the float32 network the method's file is
    (below 1: larger);
``forwards_per_prediction``
    network evaluations per test image: 1 for a plain network, the members of an
    ensemble, ``num_samples`` for a posterior's draws (times the ``K`` components of a
    rank-1 BNN, which evaluates them in one batched pass; a linearised Laplace draw is
    one Jacobian-vector product);
``predict_seconds`` and ``relative_predict_seconds``
    the wall-clock seconds of one prediction of the test images (the same call as the
    row's metrics: its draws, seed and batching; the fastest of up to 5 repetitions, at
    least one second of them in all) and their ratio to the deterministic network's one
    forward pass, timed the same way in the same run (an untrained copy of the
    architecture when the run trained no deterministic row).  Timings depend on the
    machine and its load; only their ratio is comparable across machines.

Records of methods whose trained object the run does not hold (a record restored from a
checkpoint) get the fields that do not need it.
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..accounting import network_bytes
from ..baselines.draws import DrawBaseline, prediction_draws
from ..evaluation import seeded_predict
from ..prediction import deterministic_predict

#: The ``file`` of the deterministic row: a computed size, no file.
DETERMINISTIC_FILE = "float32 parameters and buffers (computed: 4 bytes per value)"


def forwards_per_prediction(entry, num_samples: int) -> int:
    """Network evaluations per example of one prediction of a trained method's ``entry``
    (an ``art.trained`` item: ``(model, guide, ...)``, or a baseline's object as its
    model): see the module docstring."""
    model, guide = entry[0], entry[1]
    if guide is not None:
        return int(num_samples) * int(getattr(model, "output_components", 1) or 1)
    return prediction_draws(model, num_samples)


def predictor(entry, eval_data, num_samples: int, seed: int) -> Callable[[], object]:
    """The call that predicts ``eval_data`` as the run's table did, for timing."""
    model, guide = entry[0], entry[1]
    if guide is not None:
        return lambda: seeded_predict(model, guide, eval_data, num_samples, seed)
    if isinstance(model, DrawBaseline):
        return lambda: model.predict(eval_data, model.draws_per_prediction(num_samples), seed)
    return lambda: deterministic_predict(model, eval_data)


def time_call(fn: Callable[[], object], min_seconds: float = 1.0, max_repeats: int = 5) -> float:
    """The fastest of repeated calls of ``fn`` (seconds): at least one, then more until
    they took ``min_seconds`` in all or ``max_repeats`` were made."""
    if max_repeats < 1:
        raise ValueError(f"max_repeats must be at least 1, got {max_repeats!r}")
    times: list[float] = []
    while not times or (len(times) < max_repeats and sum(times) < min_seconds):
        t0 = time.perf_counter()
        with torch.no_grad():
            fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _entries(art) -> dict:
    """``{method: (model, guide)}`` of every trained method the run holds."""
    out = {}
    if art.mean_field is not None:
        out["mean_field"] = (art.mean_field.model, art.mean_field.guide)
    for method, e in art.trained.items():
        out[method] = (e.model, e.guide)
    return out


def _file_prob_diff(path: Path, entry, art, cfg) -> float:
    """The largest difference of a predicted probability between the compact file at
    ``path`` and the run's 2DG BNN (the run's seeded draws on its evaluation data)."""
    from ..io import load_compact

    model, guide = load_compact(path, device=cfg.device)
    mine = seeded_predict(model, guide, art.eval_data, cfg.num_samples, cfg.seed).mean
    run = art.predictions.get("2dg")
    ref = run.mean if run is not None else None
    if ref is None:
        ref = seeded_predict(entry[0], entry[1], art.eval_data, cfg.num_samples, cfg.seed).mean
    return float((mine.cpu().double() - ref.cpu().double()).abs().max())


def add_costs(art, cfg, reference_net: nn.Module, out_dir: str | Path | None = None) -> None:
    """Add the fields of the module docstring to every record of ``art`` (a
    :class:`~twodg_pyro.pipeline.trained.RunArtifacts`; ``cfg``: the run's settings).

    The model files are written by
    :func:`~twodg_pyro.pipeline.artifacts.write_model_files` into ``out_dir`` (then kept
    in ``art.model_files``: the run does not write them again) or, without one, into a
    temporary folder removed afterwards.  ``reference_net``: the deterministic network
    (trained or not: its timing and size are the architecture's) when the run trained
    no ``deterministic`` row."""
    from .artifacts import COMPACT_2DG, write_model_files

    entries = _entries(art)
    det = entries.get("deterministic", (reference_net, None))[0]
    sizes = network_bytes(det)
    net_params = sizes["params"]
    S, seed = cfg.num_samples, cfg.seed
    det_seconds = time_call(predictor((det, None), art.eval_data, S, seed))

    def fill(record: dict, files: dict) -> None:
        method = record.get("method")
        entry = entries.get(method)
        if method == "deterministic":
            record.update(
                file=DETERMINISTIC_FILE,
                file_bytes=sizes["float32"],
                file_bytes_int8=sizes["int8"],
            )
        else:
            name = COMPACT_2DG if method == "2dg" else f"model_{method}"
            path = files.get(name)
            if path is not None and Path(path).is_file():
                record.update(file=Path(path).name, file_bytes=Path(path).stat().st_size)
                if method == "2dg" and entry is not None:
                    record["file_prob_diff"] = _file_prob_diff(Path(path), entry, art, cfg)
        if "file_bytes" in record:
            record["bytes_per_weight"] = record["file_bytes"] / max(net_params, 1)
            record["float32_ratio"] = sizes["float32"] / max(record["file_bytes"], 1)
        if method == "deterministic":
            entry = (det, None)
        if entry is not None:
            record["forwards_per_prediction"] = forwards_per_prediction(entry, S)
            # the deterministic row is the reference itself: one timing, ratio 1
            seconds = (
                det_seconds
                if method == "deterministic"
                else time_call(predictor(entry, art.eval_data, S, seed))
            )
            record["predict_seconds"] = seconds
            record["relative_predict_seconds"] = seconds / max(det_seconds, 1e-12)

    def fill_all(folder: Path) -> dict:
        written = write_model_files(art, cfg, folder)
        for record in art.records:
            fill(record, written["files"])
        return written

    if out_dir is not None:
        art.model_files = dict(fill_all(Path(out_dir))["files"])
        return
    with tempfile.TemporaryDirectory(prefix="twodg-costs-") as tmp:
        fill_all(Path(tmp))


def reference_network(ctx) -> nn.Module:
    """The deterministic network of a run for :func:`add_costs`: its trained
    ``deterministic`` row, else a copy of the seeded initial network (same architecture:
    the same bytes and forward time)."""
    if ctx.deterministic is not None:
        return ctx.deterministic[0]
    return copy.deepcopy(ctx.net)
