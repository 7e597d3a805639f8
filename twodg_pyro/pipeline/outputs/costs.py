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
    seeded draws), ``model_laplace.2dgz`` for Laplace around the 2DG BNN's means (the
    same, with ``file_prob_diff``), ``model_<method>.pt`` for the other methods.  The
    ``deterministic`` row has no file: its ``file_bytes`` is the float32 size of its
    parameters and floating-point buffers (4 bytes each, no container), and
    ``file_bytes_int8`` the INT8 size (1 byte per parameter and a float32 scale per
    parameter tensor, buffers at float32), both computed
    (:func:`~twodg_pyro.accounting.network_bytes`);
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
    rank-1 BNN, which evaluates them in one batched pass; a linearised Laplace draw over
    all layers is one Jacobian-vector product), 1 for a last-layer Laplace approximation
    (one pass gives the features its draws share);
``predict_seconds`` and ``relative_predict_seconds``
    the wall-clock seconds of one prediction of the test images (the same call as the
    row's metrics: its draws, seed and batching; the fastest of up to 5 repetitions, at
    least one second of them in all) and their ratio to the deterministic network's one
    forward pass, timed the same way in the same run (an untrained copy of the
    architecture when the run trained no deterministic row).  Timings depend on the
    machine and its load; only their ratio is comparable across machines.

Records of methods whose trained object the run does not hold (a record restored from a
checkpoint) get the fields that do not need it.  The model files are written before
(:func:`~twodg_pyro.pipeline.outputs.artifacts.write_model_files`); this module only measures
them and the predictions, through the trained methods' one protocol
(:class:`~twodg_pyro.methods.TrainedMethod`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ...accounting import network_bytes
from ...methods import Network

#: The ``file`` of the deterministic row: a computed size, no file.
DETERMINISTIC_FILE = "float32 parameters and buffers (computed: 4 bytes per value)"


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


def _file_prob_diff(path: Path, name: str, method, art, cfg) -> float:
    """The largest difference of a predicted probability between the compact file at
    ``path`` and the run's row ``name`` (the run's seeded draws on its evaluation data)."""
    from ...methods import load_method

    mine = load_method(path, device=cfg.device).predict(art.eval_data, cfg.num_samples, cfg.seed)
    run = art.predictions.get(name)
    ref = run if run is not None else method.predict(art.eval_data, cfg.num_samples, cfg.seed)
    return float((mine.mean.cpu().double() - ref.mean.cpu().double()).abs().max())


def add_costs(art, cfg, reference_net: nn.Module, files: dict[str, str]) -> None:
    """Add the fields of the module docstring to every record of ``art`` (a
    :class:`~twodg_pyro.pipeline.runtime.trained.RunArtifacts`; ``cfg``: the run's settings).

    ``files``: the model files written for the run, by step name (``model_<method>``,
    ``model_2dg_compact``).  ``reference_net``: the deterministic network (trained or
    not: its timing and size are the architecture's) when the run trained no
    ``deterministic`` row."""
    from .artifacts import COMPACT_STEPS

    det = art.trained.get("deterministic") or Network(reference_net)
    sizes = network_bytes(det.net)
    net_params = sizes["params"]
    S, seed = cfg.num_samples, cfg.seed

    def seconds_of(method) -> float:
        return time_call(lambda: method.predict(art.eval_data, S, seed))

    det_seconds = seconds_of(det)
    for record in art.records:
        name = record.get("method")
        method = det if name == "deterministic" else art.trained.get(name)
        if name == "deterministic":
            record.update(
                file=DETERMINISTIC_FILE, file_bytes=sizes["float32"], file_bytes_int8=sizes["int8"]
            )
        else:
            compact = files.get(COMPACT_STEPS.get(name, ""))
            path = compact or files.get(f"model_{name}")
            if path is not None and Path(path).is_file():
                record.update(file=Path(path).name, file_bytes=Path(path).stat().st_size)
                if compact and method is not None:
                    diff = _file_prob_diff(Path(path), name, method, art, cfg)
                    record["file_prob_diff"] = diff
        if "file_bytes" in record:
            record["bytes_per_weight"] = record["file_bytes"] / max(net_params, 1)
            record["float32_ratio"] = sizes["float32"] / max(record["file_bytes"], 1)
        if method is not None:
            record["forwards_per_prediction"] = method.forwards_per_prediction(S)
            # the deterministic row is the reference itself: one timing, ratio 1
            seconds = det_seconds if method is det else seconds_of(method)
            record["predict_seconds"] = seconds
            record["relative_predict_seconds"] = seconds / max(det_seconds, 1e-12)
