r"""The chains of an :class:`~twodg_pyro.methods.mcmc.MCMCPosterior` in ArviZ: the tree
(posterior per site, ``sample_stats``, the predictive of given inputs, and on labelled
inputs the pointwise log-likelihood that PSIS-LOO and ``compare`` read) and the
convergence report.

Convergence is judged in function space (Izmailov et al. 2021): weight posteriors of a
network are multimodal and symmetric (hidden units permute), so R-hat of the weights
says little, and the target is R-hat of the **predictive probabilities**
:math:`p(y = k \mid x_n, w)` on the test inputs.  :func:`mcmc_report` gives, per site and
on the predictive, ArviZ's rank-normalised split :math:`\hat R` and the bulk / tail
effective sample sizes (of all chains together, Vehtari et al. 2021), summarised by
the maximum R-hat, the share of values with :math:`\hat R \le 1.01` and the minimum and
median ESS, plus the sampler's divergences (after warm-up), tree depths, step sizes
and E-BFMI per chain (Betancourt 2016: below 0.3 signals a poorly explored energy).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from ...diagnostics._arviz import build_tree, chain_stats, plot
from ...diagnostics._draws import batches, forward
from ...evaluation import SAMPLE_CHUNK
from .sampler import STAT_NAMES

__all__ = [
    "RHAT_TARGET",
    "ebfmi",
    "mcmc_report",
    "mcmc_tree",
    "plot_mcmc_chains",
    "report_lines",
    "summarise_chain_stats",
]

#: The R-hat below which chains count as mixed (Vehtari et al. 2021).
RHAT_TARGET = 1.01
#: ``sample_stats`` names in ArviZ's convention, where they differ from ours
_ARVIZ_NAMES = {"accept_prob": "acceptance_rate"}


def _np(t) -> np.ndarray:
    return t.detach().cpu().double().numpy() if torch.is_tensor(t) else np.asarray(t, float)


def mcmc_tree(posterior, x=None, max_examples: int | None = None, seed: int = 0):
    r"""The ArviZ tree of the chains (``DataTree`` on ArviZ 1.x, ``InferenceData`` on 0.x):

    * ``posterior``: each site's draws ``(chain, draw, *site.shape)``;
    * ``sample_stats``: ``diverging`` (0 / 1: netCDF files hold no booleans),
      ``tree_depth``, ``n_steps``, ``step_size``, ``energy``, ``lp`` (the log density),
      ``acceptance_rate``;
    * with inputs ``x``: ``predictions``, ``probs`` ``(chain, draw, example, class)``,
      the class probabilities of every draw on the first ``max_examples`` inputs (a
      regression model: ``loc`` ``(chain, draw, example)``, each draw's predictive mean);
    * with labelled data ``x = (X, y)``: also ``log_likelihood`` ``y`` ``(chain, draw,
      obs)`` (float64, :math:`\log p(y_n \mid x_n, w)`: the likelihood's own, a Normal's
      for regression) and ``observed_data`` ``y`` (the labels, or the float targets), on
      the examples a guide's export takes with the same ``max_examples`` and ``seed``
      (:func:`~twodg_pyro.diagnostics.to_inference_data`): PSIS-LOO and ``compare`` rank
      the chains beside the variational methods.

    The settings are the root's (and every group's) attributes."""
    dims = {
        s.name: [f"{s.name}_dim_{i}" for i in range(len(s.shape))] for s in posterior.model.sites
    }
    coords: dict = {}
    post = {name: _np(v) for name, v in posterior.site_draws().items()}
    stats = {_ARVIZ_NAMES.get(k, k): _np(posterior.sample_stats[k]) for k in STAT_NAMES}
    stats["diverging"] = stats["diverging"].astype(np.int8)  # netCDF has no bool
    groups = {"posterior": post, "sample_stats": stats}
    labelled = isinstance(x, (tuple, list)) and len(x) == 2
    regression = posterior.regression
    pred_name = "loc" if regression else "probs"
    if labelled:
        parts, index = batches(tuple(x), 512, max_examples, seed, with_index=True)
        ll, probs = _log_likelihood(posterior, parts)
        groups["log_likelihood"] = {"y": ll}
        observed = _np(torch.cat([yb for _, yb in parts]))
        groups["observed_data"] = {"y": observed if regression else observed.astype(np.int64)}
        dims["y"] = ["obs"]
        coords["obs"] = _np(index).astype(np.int64)
        groups["predictions"] = {pred_name: probs}
    elif x is not None:
        groups["predictions"] = {pred_name: _np(posterior.chain_probs(_head(x, max_examples)))}
    if "predictions" in groups:
        dims[pred_name] = ["example"] if regression else ["example", "class"]
    attrs = {  # netCDF attributes: numbers and strings (booleans as 0 / 1)
        k: int(v) if isinstance(v, bool) else v
        for k, v in posterior.settings.items()
        if isinstance(v, (int, float, str))
    }
    attrs["inference_library"] = "pyro"
    sampled = set(groups) - {"observed_data"}
    return build_tree(groups, sampled, coords, dims, attrs)


def _log_likelihood(posterior, parts) -> tuple[np.ndarray, np.ndarray]:
    """``(log p(y | x, w) (C, D, N) in float64, probabilities (C, D, N, K))`` of every kept
    draw on the labelled batches ``parts`` (a regression model: its Normal's log density
    and each draw's mean ``(C, D, N)``)."""
    lead = tuple(posterior.draws.shape[:2])
    draws = {k: v.flatten(0, 1) for k, v in posterior.site_draws().items()}
    device = posterior.draws.device
    lls, probs = [], []
    for a in range(0, lead[0] * lead[1], SAMPLE_CHUNK):
        w = {k: v[a : a + SAMPLE_CHUNK] for k, v in draws.items()}
        ll, out = forward(posterior.model, w, parts, device, outputs=True)
        lls.append(ll.cpu())
        probs.append(posterior.per_draw(out).cpu())
    ll, p = torch.cat(lls), torch.cat(probs)
    return _np(ll).reshape(*lead, -1), _np(p).reshape(*lead, *p.shape[1:])


def _head(x, n: int | None):
    if isinstance(x, (tuple, list)):
        x = x[0]
    return x if n is None else x[: int(n)]


def ebfmi(energy: np.ndarray) -> np.ndarray:
    r"""E-BFMI per chain of energies ``(chain, draw)``:
    :math:`\sum_t (E_t - E_{t-1})^2 / \sum_t (E_t - \bar E)^2`."""
    e = np.asarray(energy, dtype=float)
    num = np.square(np.diff(e, axis=1)).sum(1)
    den = np.square(e - e.mean(1, keepdims=True)).sum(1)
    return num / den


def summarise_chain_stats(stats: dict[str, np.ndarray]) -> dict:
    """``{max_rhat, share_rhat_ok, median_rhat, min_ess_bulk, median_ess_bulk,
    min_ess_tail, median_ess_tail, n_values}`` of :func:`~._arviz.chain_stats`'s arrays
    (NaN entries, constant values, are left out and counted in ``n_constant``)."""
    r = stats["rhat"].ravel()
    ok = ~np.isnan(r)
    eb, et = stats["ess_bulk"].ravel()[ok], stats["ess_tail"].ravel()[ok]

    def f(fn, v: np.ndarray) -> float | None:
        """``fn(v)``; ``None`` when ``v`` is empty or the value is not finite."""
        x = float(fn(v)) if v.size else math.nan
        return x if math.isfinite(x) else None

    return {
        "n_values": int(r.size),
        "n_constant": int((~ok).sum()),
        "max_rhat": f(np.max, r[ok]),
        "median_rhat": f(np.median, r[ok]),
        "share_rhat_ok": f(np.mean, r[ok] <= RHAT_TARGET),
        "min_ess_bulk": f(np.min, eb),
        "median_ess_bulk": f(np.median, eb),
        "min_ess_tail": f(np.min, et),
        "median_ess_tail": f(np.median, et),
    }


def mcmc_report(posterior, x=None, max_examples: int | None = None, probs=None) -> dict:
    """The convergence report of the chains (see the module), JSON-able:

    * ``sites``: per site, :func:`summarise_chain_stats` of its values;
    * ``predictive``: the same over the class probabilities of every draw on the inputs
      ``x`` (or the given ``probs``, ``(chain, draw, N, K)``; a regression model's: each
      draw's predictive mean, ``predictive_quantity = "means"``), and ``lp``'s;
    * ``sampler``: draws per chain, post-warm-up ``divergences`` (total and share of the
      iterations), mean / max tree depth, mean leapfrog steps, each chain's final step
      size, E-BFMI and seconds.
    """
    s = posterior.settings
    out: dict = {
        "kernel": s.get("kernel"),
        "num_chains": posterior.num_chains,
        "draws_per_chain": int(posterior.draws.shape[1]),
        "settings": {k: v for k, v in s.items() if k not in ("chain_seconds",)},
        "sites": {
            name: summarise_chain_stats(chain_stats(_np(v)))
            for name, v in posterior.site_draws().items()
        },
    }
    st = {k: _np(v) for k, v in posterior.sample_stats.items()}
    out["lp"] = summarise_chain_stats(chain_stats(st["lp"]))
    if probs is None and x is not None:
        probs = posterior.chain_probs(_head(x, max_examples))
    if probs is not None:
        out["predictive"] = summarise_chain_stats(chain_stats(_np(probs)))
        if posterior.regression:
            out["predictive_quantity"] = "means"
    iterations = int(s["num_samples"]) * posterior.num_chains
    divergences = int(sum(s.get("divergences", [])))
    out["sampler"] = {
        "divergences": divergences,
        "divergence_share": divergences / max(iterations, 1),
        "divergent_kept_draws": int(st["diverging"].sum()),
        "mean_tree_depth": float(st["tree_depth"].mean()),
        "max_tree_depth": float(st["tree_depth"].max()),
        "hit_max_tree_depth": float((st["tree_depth"] >= s.get("max_tree_depth", 1e9)).mean()),
        "mean_leapfrog_steps": float(st["n_steps"].mean()),
        "step_size": [float(v) for v in st["step_size"][:, -1]],
        "mean_acceptance": float(st["accept_prob"].mean()),
        "ebfmi": [float(v) for v in ebfmi(st["energy"])],
        "chain_seconds": [float(v) for v in s.get("chain_seconds", [])],
    }
    return out


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def report_lines(report: dict) -> list[str]:
    """The report of :func:`mcmc_report` as lines to print (``twodg-pyro diagnose``)."""
    sm = report["sampler"]
    lines = [
        f"MCMC ({report['kernel']}): {report['num_chains']} chains x "
        f"{report['draws_per_chain']} kept draws",
        f"  divergences after warm-up: {sm['divergences']} "
        f"({100 * sm['divergence_share']:.2f} % of the iterations)",
        f"  tree depth: mean {sm['mean_tree_depth']:.1f}, max {sm['max_tree_depth']:.0f} "
        f"(at the limit: {100 * sm['hit_max_tree_depth']:.1f} %); leapfrog steps "
        f"{sm['mean_leapfrog_steps']:.0f}; acceptance {sm['mean_acceptance']:.2f}",
        "  step size per chain: " + ", ".join(f"{v:.3g}" for v in sm["step_size"]),
        "  E-BFMI per chain: " + ", ".join(f"{v:.2f}" for v in sm["ebfmi"]),
    ]

    def row(name: str, r: dict) -> str:
        share = None if r["share_rhat_ok"] is None else 100 * r["share_rhat_ok"]
        return (
            f"  {name:<28} R-hat max {_fmt(r['max_rhat'], '.3f')} "
            f"(<= {RHAT_TARGET}: {_fmt(share, '.1f')} %)"
            f"  ESS bulk min {_fmt(r['min_ess_bulk'], '.0f')} median "
            f"{_fmt(r['median_ess_bulk'], '.0f')}  tail min {_fmt(r['min_ess_tail'], '.0f')}"
        )

    if "predictive" in report:
        quantity = report.get("predictive_quantity", "probabilities")
        lines.append(row(f"predictive {quantity}", report["predictive"]))
    rows = [("log density", report["lp"]), *report["sites"].items()]
    return lines + [row(name, r) for name, r in rows]


def plot_mcmc_chains(posterior, path: str | os.PathLike, probs=None, n_values: int = 3) -> Path:
    """ArviZ's trace and rank plots of the log density and of the ``n_values`` predictive
    probabilities with the largest R-hat (``probs``: ``(chain, draw, N, K)``; a regression
    model's per-draw means ``(chain, draw, N)``), saved as ``<path>`` (trace) and
    ``<stem>_rank<suffix>`` (rank); returns the first path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    variables = {"lp": _np(posterior.sample_stats["lp"])}
    if probs is not None:
        p = _np(probs)
        flat = p.reshape(*p.shape[:2], -1)
        r = chain_stats(flat)["rhat"]
        order = np.argsort(np.nan_to_num(r, nan=-1.0))[::-1][:n_values]
        k = p.shape[-1]
        for i in order:
            name = f"mu_x{i}" if p.ndim == 3 else f"p_x{i // k}_c{i % k}"
            variables[name] = flat[:, :, i]
    tree = build_tree({"posterior": variables}, {"posterior"}, {}, {}, {})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(variables)
    for kind, target in (
        ("trace", path),
        ("rank", path.with_name(f"{path.stem}_rank{path.suffix}")),
    ):
        fig = plot(kind, tree, names)
        fig.savefig(target, dpi=90, bbox_inches="tight")
        plt.close(fig)
    return path
