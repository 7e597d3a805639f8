r"""Figures of a 2DG BNN, written as PNG files.

Figures are drawn on :class:`matplotlib.figure.Figure` objects with the Agg canvas
attached explicitly, never through ``pyplot``: no global backend is switched, no
window opens, and nothing leaks between calls.  Every function writes its file
atomically (temporary file, then rename) and returns the path written.

* :func:`plot_sharing_plane` -- the :math:`(\mu, \sigma)` plane (or
  :math:`(\mu, \log\sigma)`): the stage-1 points of plain inliers coloured by their
  component, ellipse weights and outliers marked, and each component's 2-sigma
  ellipse from its covariance around its (trained) centre;
* :func:`plot_reliability` -- reliability diagram (15 equal-width confidence bins);
* :func:`plot_elbo_terms` -- ELBO terms per epoch from ``TrainState.history``;
* :func:`plot_merges` -- number of components across merges (stage 2 and the
  stage-3 merge hook), or a figure saying that no merge happened.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import EllipseCollection
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..files.atomic import atomic_write
from ..guide import SharingGuide

_ELBO_TERMS = ("loss", "nll", "kl", "kl_inlier", "kl_outlier")


def _figure(*size) -> Figure:
    fig = Figure(figsize=size or (6.4, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def _note(ax, text: str, y: float = 0.5, **kwargs) -> None:
    """``text`` centred across ``ax`` at height ``y`` (in the axes' coordinates)."""
    ax.text(0.5, y, text, ha="center", va="center", transform=ax.transAxes, **kwargs)


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t)


def _ellipse_axes(covs: np.ndarray, n_std: float):
    """Full widths, heights and angles (degrees) of the ``n_std`` ellipses of 2x2 ``covs``."""
    vals, vecs = np.linalg.eigh(covs)  # ascending eigenvalues
    half = n_std * np.sqrt(np.clip(vals, 0.0, None))  # the semi-axes
    return 2 * half[:, 1], 2 * half[:, 0], np.degrees(np.arctan2(vecs[:, 1, 1], vecs[:, 0, 1]))


def plot_sharing_plane(
    structure,
    path: str | os.PathLike,
    n_std: float = 2.0,
    max_points: int = 20000,
    seed: int = 0,
    title: str | None = None,
) -> Path:
    r"""Scatter the weights in the mixture's plane with the components' ellipses.

    Args:
        structure: a :class:`~twodg_pyro.sharing.SharingStructure`, or a guide with one
            (:class:`~twodg_pyro.guide.SharingGuide`: its trained centres and covariances).
        path: the PNG file.
        n_std: ellipse radius in standard deviations (2-sigma by default).
        max_points: plot a seeded random subset of at most this many points per kind.
        seed: seed of that subset.

    Inliers are their stage-1 points :math:`x_i` (as the structure stores them),
    coloured by component (plain inliers) or marked as ellipse weights (grey ``x``);
    outliers are their :math:`(\mu_i, \sigma_i)` as held by the structure (the trained
    outlier parameters when taken from a guide), marked with red triangles.
    """
    s = structure.structure() if isinstance(structure, SharingGuide) else structure
    rng = np.random.default_rng(seed)
    log_sigma = s.coordinates == "log_sigma"

    def sub(n: int) -> np.ndarray:
        return np.sort(rng.choice(n, max_points, replace=False)) if n > max_points else slice(None)

    pts = _np(s.inlier_points)
    n_plain = int(s.plain_index.numel())
    plain, ell = pts[:n_plain], pts[n_plain:]
    comp = _np(s.plain_component)
    means, covs = _np(s.means), _np(s.covariances)
    K = means.shape[0]
    colours = matplotlib.colormaps["tab20"](np.arange(K) % 20)

    fig = _figure(8.0, 6.0)
    ax = fig.add_subplot()
    o_sig = _np(s.outlier_scale)
    o_y = np.log(np.clip(o_sig, 1e-30, None)) if log_sigma else o_sig
    outliers = np.stack([_np(s.outlier_loc), o_y], -1)
    kinds = (  # points, colours, style, label; drawn in this order
        (plain, colours[comp], dict(s=4, alpha=0.6, lw=0), "inliers ({:,}), coloured by component"),
        (ell, "0.35", dict(s=14, marker="x", lw=0.8), "ellipse weights ({:,})"),
        (outliers, "tab:red", dict(s=18, marker="^", lw=0), "outliers ({:,})"),
    )
    for i, (xy, c, style, label) in enumerate(kinds):
        if i == 0 or len(xy):  # the plain inliers always, the others when there are some
            idx = sub(len(xy))
            c = c if isinstance(c, str) else c[idx]
            ax.scatter(xy[idx, 0], xy[idx, 1], c=c, label=label.format(len(xy)), **style)
    w, h, a = _ellipse_axes(covs, n_std)
    ellipses = EllipseCollection(w, h, a, units="xy", offsets=means, offset_transform=ax.transData)
    ellipses.set(facecolor="none", edgecolor=colours, linewidth=1.0)
    ax.add_collection(ellipses)
    label = f"component centres ({K:,}), {n_std:g}-sigma ellipses"
    ax.scatter(means[:, 0], means[:, 1], s=22, marker="+", c=colours, lw=1.2, label=label)
    ax.autoscale_view()
    ax.set(xlabel=r"$\mu$", ylabel=r"$\log\sigma$" if log_sigma else r"$\sigma$")
    ax.set_title(
        title or f"weight sharing in the ({'mu, log sigma' if log_sigma else 'mu, sigma'}) plane"
    )
    ax.legend(loc="best", fontsize="small", markerscale=1.5)
    return _save(fig, path)


def plot_reliability(
    probs, labels, path: str | os.PathLike, n_bins: int = 15, title: str | None = None
) -> Path:
    """Reliability diagram of predictive class probabilities ``(N, C)`` against labels.

    Top: per-bin accuracy against the bin's mean confidence (bars on the
    ``n_bins`` equal-width confidence bins of :func:`~twodg_pyro.metrics.reliability_bins`,
    with the gap to the diagonal); bottom: how many examples fall in each bin.  The
    title gives the ECE.
    """
    from ..metrics import ece, reliability_bins

    probs, labels = torch.as_tensor(probs).float().cpu(), torch.as_tensor(labels).long().cpu()
    bins = {k: v.numpy() for k, v in reliability_bins(probs, labels, n_bins).items()}
    value = ece(probs, labels, n_bins)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    centres, width = (edges[:-1] + edges[1:]) / 2, 1.0 / n_bins
    filled = bins["count"] > 0

    fig = _figure(5.5, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    top.plot([0, 1], [0, 1], ls="--", c="0.5", lw=1, label="perfect calibration")
    x, acc, conf = centres[filled], bins["accuracy"][filled], bins["confidence"][filled]
    bars = dict(width=width, lw=0.5)
    top.bar(x, acc, edgecolor="k", color="tab:blue", label="accuracy", **bars)
    gap = dict(color="none", edgecolor="tab:red", hatch="//", label="gap to mean confidence")
    top.bar(x, np.abs(conf - acc), bottom=np.minimum(acc, conf), **gap, **bars)
    top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
    top.legend(loc="upper left", fontsize="small")
    top.set_title(title or f"reliability ({n_bins} bins), ECE = {value:.4f}")
    bottom.bar(centres, bins["count"], color="0.5", edgecolor="k", **bars)
    bottom.set(xlabel="confidence", ylabel="examples")
    return _save(fig, path)


def plot_elbo_terms(
    history: Sequence[Mapping] | Mapping[str, Sequence[Mapping]],
    path: str | os.PathLike,
    title: str | None = None,
) -> Path:
    """ELBO terms per epoch, one line per term (``loss``, ``nll``, ``kl``, ``kl_inlier``,
    ``kl_outlier``, and any other numeric term), one panel per history.

    Args:
        history: ``TrainState.history`` (a list of per-epoch dicts), or a mapping
            ``{panel title: history}`` (e.g. stage 1 and stage 3).

    The y axis is logarithmic when every plotted value is positive, symmetric-log
    otherwise.  ``beta`` (KL weight) goes on a secondary axis when it varies.
    """
    panels = dict(history) if isinstance(history, Mapping) else {"": history}
    fig = _figure(6.4 * max(len(panels), 1), 4.8)
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    for ax, (name, hist) in zip(axes, panels.items(), strict=False):
        hist = list(hist or [])
        ax.set_title(name)
        if not hist:
            _note(ax, "no training history")
            continue
        epochs = np.array([r.get("epoch", i) for i, r in enumerate(hist)], dtype=float) + 1
        keys = [k for k in _ELBO_TERMS if any(k in r for r in hist)]
        keys += sorted(
            {k for r in hist for k, v in r.items() if isinstance(v, (int, float))}
            - set(keys)
            - {"epoch", "beta"}
        )
        values = []
        for k in keys:
            v = np.array([float(r.get(k, np.nan)) for r in hist])
            values.append(v)
            ax.plot(epochs, v, label=k, lw=1.5 if k == "loss" else 1.0)
        flat = np.concatenate(values) if values else np.array([1.0])
        flat = flat[np.isfinite(flat)]
        if flat.size and (flat > 0).all():
            ax.set_yscale("log")
        elif flat.size:
            ax.set_yscale("symlog", linthresh=max(float(np.abs(flat).min()), 1e-3))
        betas = np.array([float(r.get("beta", 1.0)) for r in hist])
        if np.ptp(betas) > 0:
            twin = ax.twinx()
            twin.plot(epochs, betas, c="0.4", ls=":", label="beta (KL weight)")
            twin.set_ylabel("beta")
            twin.legend(loc="upper center", fontsize="small")
        ax.set(xlabel="epoch", ylabel="epoch mean of the term")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="upper right", fontsize="small")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_merges(
    log: Sequence[Mapping] | None,
    path: str | os.PathLike,
    stage2: Mapping | None = None,
    title: str | None = None,
) -> Path:
    """Number of mixture components across merges.

    Args:
        log: ``MergeHook.log`` of stage 3: ``[{"epoch", "before", "after"}, ...]``.
        stage2: the stage-2 report of :func:`~twodg_pyro.sharing.build_sharing`: its
            ``gmm_components``, ``components_after_size_reduction`` and
            ``components_after_merging`` are drawn first.

    When no merge happened (no entry changes the count) the figure says so.
    """
    steps: list[tuple[str, int]] = []
    stage2 = dict(stage2 or {})
    for key, label in (
        ("gmm_components", "GMM fit"),
        ("components_after_size_reduction", "size reduction"),
        ("components_after_merging", "stage-2 merging"),
    ):
        if key in stage2:
            steps.append((label, int(stage2[key])))
    merged = len(steps) == 3 and steps[2][1] < steps[1][1]
    for entry in log or []:
        if not steps:
            steps.append(("stage 3 start", int(entry["before"])))
        steps.append((f"epoch {int(entry['epoch'])}", int(entry["after"])))
        merged = merged or int(entry["after"]) < int(entry["before"])

    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    if steps:
        x = np.arange(len(steps))
        ax.step(x, [c for _, c in steps], where="post", c="tab:blue")
        ax.plot(x, [c for _, c in steps], "o", c="tab:blue")
        ax.set_xticks(x, [label for label, _ in steps], rotation=30, ha="right", fontsize="small")
        lo, hi = min(c for _, c in steps), max(c for _, c in steps)
        pad = max(1, math.ceil(0.1 * (hi - lo)))
        ax.set_ylim(max(lo - pad, 0), hi + pad)
    ax.set_ylabel("number of components K")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if not merged:
        _note(ax, "no merge happened", 0.85, fontsize=16, color="tab:red")
    ax.set_title(title or "components across merges")
    return _save(fig, path)
