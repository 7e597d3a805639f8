r"""Figures of uncertainty records (:mod:`.report`), written as PNG files.

Drawn on :class:`matplotlib.figure.Figure` objects with the Agg canvas attached
explicitly (never ``pyplot``: no global backend switched, no window), written atomically;
each function returns the path written.

* :func:`plot_score_histograms` -- per OOD set, the histogram of a score (entropy, MI or
  :math:`1 - \max p`) on the clean test inputs against the OOD inputs, both as densities
  over common bins, with the set's AUROC in the title; needs a record made with
  ``return_scores=True``;
* :func:`plot_shift` -- per corruption family, a metric (accuracy, NLL, ECE) against the
  severity, 0 being the clean test inputs, one line per record (method).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..files.atomic import atomic_write

_AUROC_KEY = {"entropy": "entropy_auroc", "mi": "mi_auroc", "maxprob": "maxprob_auroc"}


def _grid(n: int, width: float = 3.6, height: float = 2.8) -> tuple[Figure, list]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_axis_off()
    return fig, axes[:n]


def _save(fig: Figure, axes: list, title: str | None, path: str | os.PathLike) -> Path:
    """The legend in the first panel, the title, and the figure written as a PNG."""
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def plot_score_histograms(
    record: Mapping,
    path: str | os.PathLike,
    score: str = "entropy",
    bins: int = 30,
    title: str | None = None,
) -> Path:
    """Histograms of ``score`` in- vs out-of-distribution, one panel per OOD set.

    Raises:
        ValueError: a record without ``"scores"`` (made without ``return_scores=True``),
            without OOD sets, or an unknown score.
    """
    if score not in _AUROC_KEY:
        raise ValueError(f"score must be one of {sorted(_AUROC_KEY)}, got {score!r}")
    raw = record.get("scores")
    if not raw:
        raise ValueError("the record has no per-example scores: make it with return_scores=True")
    sets = list(raw["ood"])
    if not sets:
        raise ValueError("the record has no OOD sets to plot")
    clean = np.asarray(raw["clean"][score], dtype=float)
    fig, axes = _grid(len(sets))
    for ax, name in zip(axes, sets, strict=True):
        out = np.asarray(raw["ood"][name][score], dtype=float)
        lo, hi = min(clean.min(), out.min()), max(clean.max(), out.max())
        edges = np.linspace(lo, hi if hi > lo else lo + 1e-6, bins + 1)
        ax.hist(clean, edges, density=True, alpha=0.55, label="in-distribution")
        ax.hist(out, edges, density=True, alpha=0.55, label="OOD")
        auroc = record.get("ood", {}).get(name, {}).get(_AUROC_KEY[score])
        ax.set_title(name + ("" if auroc is None else f" (AUROC {auroc:.3f})"), fontsize=9)
        xlabel = {"entropy": "entropy (nats)", "mi": "MI (nats)"}.get(score, "1 - max p")
        ax.set(xlabel=xlabel, ylabel="density")
    return _save(fig, axes, title, path)


def plot_shift(
    records: Sequence[Mapping],
    path: str | os.PathLike,
    metric: str = "accuracy",
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """``metric`` against the corruption severity, one panel per family, one line per
    record; severity 0 is the record's clean metric (``record["clean"][metric]``).

    Args:
        records: uncertainty records (:func:`~.report.uncertainty_report`).
        path: the PNG file.
        metric: ``"accuracy"``, ``"nll"`` or ``"ece"``.
        labels: one name per record (default: ``record["method"]`` or ``method i``).
        title: the figure's title.

    Raises:
        ValueError: no records, labels of another length, an unknown metric, or records
            without shift entries.
    """
    if metric not in ("accuracy", "nll", "ece"):
        raise ValueError(f"metric must be 'accuracy', 'nll' or 'ece', got {metric!r}")
    records = list(records)
    if not records:
        raise ValueError("no records to plot")
    if labels is None:
        labels = [str(r.get("method", f"method {i}")) for i, r in enumerate(records)]
    if len(labels) != len(records):
        raise ValueError(f"{len(labels)} labels for {len(records)} records")
    families = list(dict.fromkeys(f for r in records for f in r.get("shift", {})))
    if not families:
        raise ValueError("the records have no shift entries")
    fig, axes = _grid(len(families))
    for ax, family in zip(axes, families, strict=True):
        for record, label in zip(records, labels, strict=True):
            by_severity = record.get("shift", {}).get(family, {})
            xs = sorted(int(s) for s in by_severity)
            ys = [by_severity[str(s)][metric] for s in xs]
            if "clean" in record and metric in record["clean"]:
                xs, ys = [0, *xs], [record["clean"][metric], *ys]
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(family.replace("_", " "), fontsize=9)
        ax.set(xlabel="severity (0: clean)", ylabel=metric, xticks=range(0, 6))
    return _save(fig, axes, title, path)
