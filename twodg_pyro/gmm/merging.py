"""Merging of mixture components (2DGBNN Stage 2, Eqs. 4-6), repeated to a fixed point.

Two components ``a`` and ``b`` *qualify* for merging when

* ``W2(a, b) < tau_d`` (the 2-Wasserstein distance, not its square; see
  :mod:`.wasserstein`), **and**
* the gradient test passes (skipped when ``grads`` is None): with ``test="both"``
  (default) ``|g_a| < tau_g`` and ``|g_b| < tau_g``; with ``test="difference"``
  ``|g_a - g_b| < tau_g`` (``g`` are 2-vectors, ``|.|`` the Euclidean norm), **and**
* the variance test passes: ``v_a < tau_v`` and ``v_b < tau_v`` (``"both"``) or
  ``|v_a - v_b| < tau_v`` (``"difference"``); ``v_k`` defaults to ``tr S_k``.

:func:`merge_components` merges until no pair qualifies. Each round every
component picks its nearest qualifying partner by ``W2`` (ties: smallest index);
all *mutual* nearest pairs merge at once. The globally closest qualifying pair is
always mutual, so each round merges at least one pair and the loop ends at a
fixed point. Qualifying pairs are kept as an edge list that is updated only
around the merged components, so a round costs ``O(merged * K)``, not ``O(K^2)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .linalg2x2 import _check_int, _shape, check_spd, sqrtm2x2, trace2x2
from .wasserstein import pairwise_w2_squared

#: the merge formulas: Eqs. 5-6 as printed, or count-weighted moment matching
MergeRule = Literal["paper", "moment"]
MERGE_RULES: tuple[str, ...] = get_args(MergeRule)
#: the gradient/variance tests: each cluster below the thresholds, or their difference
MergeTest = Literal["both", "difference"]
MERGE_TESTS: tuple[str, ...] = get_args(MergeTest)


def _outer(d: Tensor) -> Tensor:
    return d[..., :, None] * d[..., None, :]


def _sym(s: Tensor) -> Tensor:
    return 0.5 * (s + s.transpose(-1, -2))


def merge_paper(m_a: Tensor, S_a: Tensor, m_b: Tensor, S_b: Tensor) -> tuple[Tensor, Tensor]:
    """The paper's merge (Eqs. 5-6), exactly as printed; broadcasting over leading dims.

    ``m = (m_a + m_b) / 2``,
    ``S = (S_a + S_b) / 2 + (1/8) (m_a - m_b)(m_a - m_b)^T
    + (1/2) (S_a^{1/2} S_b S_a^{1/2})^{1/2}``.

    ``S`` is SPD whenever ``S_a, S_b`` are (a sum of SPD and PSD terms). Note that it is
    not idempotent: merging ``N(m, S)`` with itself gives ``N(m, 1.5 S)``.
    """
    m = 0.5 * (m_a + m_b)
    ra = sqrtm2x2(S_a)
    cross = sqrtm2x2(_sym(ra @ S_b @ ra))
    s = 0.5 * (S_a + S_b) + 0.125 * _outer(m_a - m_b) + 0.5 * cross
    return m, _sym(s)


def merge_moment(
    m_a: Tensor, S_a: Tensor, n_a: Tensor, m_b: Tensor, S_b: Tensor, n_b: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Count-weighted moment matching of two Gaussians; broadcasting over leading dims.

    With ``n = n_a + n_b``, ``f_a = n_a / n``, ``f_b = n_b / n`` (``1/2`` each if ``n = 0``):
    ``m = f_a m_a + f_b m_b``, ``S = f_a S_a + f_b S_b + f_a f_b (m_a - m_b)(m_a - m_b)^T``.
    This preserves the pooled mean and second moment ``E[x x^T]`` of the two groups.
    Returns ``(m, S, n)``.
    """
    n_a = torch.as_tensor(n_a, dtype=m_a.dtype, device=m_a.device)
    n_b = torch.as_tensor(n_b, dtype=m_a.dtype, device=m_a.device)
    n = n_a + n_b
    safe = torch.where(n > 0, n, torch.ones_like(n))
    fa = torch.where(n > 0, n_a / safe, torch.full_like(n, 0.5))
    fb = 1.0 - fa
    m = fa[..., None] * m_a + fb[..., None] * m_b
    s = (
        fa[..., None, None] * S_a
        + fb[..., None, None] * S_b
        + (fa * fb)[..., None, None] * _outer(m_a - m_b)
    )
    return m, _sym(s), n


@dataclass
class MergeResult:
    """Outcome of :func:`merge_components`.

    Attributes:
        means: ``(K_new, 2)``; covs: ``(K_new, 2, 2)``; counts: ``(K_new,)``.
        mapping: LongTensor ``(K_old,)``; old component ``i`` is new component ``mapping[i]``.
        n_rounds: merge rounds run; n_merged: pairwise merges (``K_old - K_new``).
        grads: merged centre gradients ``(K_new, 2)`` (sums) or None.
        variances: ``(K_new,)`` variances used by the test (merged ones are ``tr S``).
        converged: True when no remaining pair qualifies (False only if ``max_rounds`` hit).
    """

    means: Tensor
    covs: Tensor
    counts: Tensor
    mapping: Tensor
    n_rounds: int
    n_merged: int
    grads: Tensor | None = None
    variances: Tensor | None = None
    converged: bool = True


def check_merge_settings(
    tau_d: float, tau_g: float, tau_v: float, rule: str, test: str
) -> tuple[float, float, float]:
    """Raise ``ValueError`` unless the thresholds are numbers ``>= 0`` (``inf`` allowed) and
    ``rule``/``test`` are known; returns ``(tau_d, tau_g, tau_v)`` as floats."""
    out = []
    for name, v in (("tau_d", tau_d), ("tau_g", tau_g), ("tau_v", tau_v)):
        try:
            f = float(v)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}") from exc
        if math.isnan(f) or f < 0:
            raise ValueError(f"{name} must be a number >= 0 (inf allowed), got {v!r}")
        out.append(f)
    if rule not in MERGE_RULES:
        raise ValueError(f"rule must be one of {MERGE_RULES}, got {rule!r}")
    if test not in MERGE_TESTS:
        raise ValueError(f"test must be one of {MERGE_TESTS}, got {test!r}")
    return out[0], out[1], out[2]


def _check_vector(name: str, t: Tensor, shape: tuple[int, ...], nonneg: bool = False) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        i = int(torch.nonzero(bad.reshape(t.shape[0], -1).any(dim=1))[0, 0])
        raise ValueError(f"{name}[{i}] is not finite: {t[i].tolist()}")
    if nonneg and bool((t < 0).any()):
        i = int(torch.nonzero(t < 0)[0, 0])
        raise ValueError(f"{name}[{i}] is negative: {float(t[i])}")


class _State:
    """Mutable merge state in float64 over the original ``K0`` slots."""

    def __init__(self, means, covs, counts, grads, variances, tau_d, tau_g, tau_v, test, rule):
        f64 = torch.float64
        self.means = means.to(f64).clone()
        self.covs = covs.to(f64).clone()
        self.counts = counts.to(f64).clone()
        self.grads = None if grads is None else grads.to(f64).clone()
        self.var = trace2x2(self.covs) if variances is None else variances.to(f64).clone()
        self.active = torch.ones(means.shape[0], dtype=torch.bool, device=means.device)
        self.tau_d2 = tau_d * tau_d
        self.tau_g, self.tau_v, self.test, self.rule = tau_g, tau_v, test, rule

    def eligible(self) -> Tensor:
        """Nodes that can take part in any merge (node-level part of the tests)."""
        ok = self.active.clone()
        if self.test == "both":
            if self.grads is not None:
                ok &= self.grads.norm(dim=1) < self.tau_g
            ok &= self.var < self.tau_v
        return ok

    def qualify(self, rows: Tensor, chunk_size: int) -> tuple[Tensor, Tensor, Tensor]:
        """Qualifying edges from ``rows`` to all slots: ``(row_slot, col_slot, W2^2)``.

        Since ``W2^2 >= (x_a - x_b)^2`` for the first mean coordinate, only columns
        within ``tau_d`` of a row in that coordinate can qualify: rows are processed in
        order of ``x`` and each chunk is compared with the contiguous window of slots
        (sorted by ``x``) that its rows can reach. The result is exact.
        """
        elig = self.eligible()
        rows = rows[elig[rows]]
        empty = torch.empty(0, dtype=torch.long, device=rows.device)
        none = empty, empty, torch.empty(0, dtype=torch.float64, device=rows.device)
        if rows.numel() == 0 or not bool(elig.any()):
            return none
        cols = torch.nonzero(elig).flatten()
        cx = self.means[cols, 0]
        corder = torch.argsort(cx)
        cols, cx = cols[corder], cx[corder]
        rows = rows[torch.argsort(self.means[rows, 0])]
        tau = math.sqrt(self.tau_d2)
        srcs, dsts, ds = [], [], []
        for s in range(0, int(rows.shape[0]), chunk_size):
            r = rows[s : s + chunk_size]
            rx = self.means[r, 0]
            lo = int(torch.searchsorted(cx, rx[0:1] - tau)[0])
            hi = int(torch.searchsorted(cx, rx[-1:] + tau, right=True)[0])
            if hi <= lo:
                continue
            c = cols[lo:hi]
            d2 = pairwise_w2_squared(
                self.means[r], self.covs[r], self.means[c], self.covs[c], validate=False
            )
            ok = (d2 < self.tau_d2) & (r[:, None] != c[None, :])
            if self.test == "difference":
                if self.grads is not None:
                    gd = (self.grads[r][:, None, :] - self.grads[c][None, :, :]).norm(dim=-1)
                    ok &= gd < self.tau_g
                ok &= (self.var[r][:, None] - self.var[c][None, :]).abs() < self.tau_v
            i, j = torch.nonzero(ok, as_tuple=True)
            srcs.append(r[i])
            dsts.append(c[j])
            ds.append(d2[i, j])
        return (torch.cat(srcs), torch.cat(dsts), torch.cat(ds)) if srcs else none

    def merge(self, a: Tensor, b: Tensor) -> None:
        """Merge slots ``b`` into slots ``a`` (vectorised over pairs)."""
        ma, sa, mb, sb = self.means[a], self.covs[a], self.means[b], self.covs[b]
        na, nb = self.counts[a], self.counts[b]
        if self.rule == "paper":
            m, s = merge_paper(ma, sa, mb, sb)
        else:
            m, s, _ = merge_moment(ma, sa, na, mb, sb, nb)
        self.means[a] = m
        self.covs[a] = s
        self.counts[a] = na + nb
        if self.grads is not None:
            self.grads[a] = self.grads[a] + self.grads[b]
        self.var[a] = trace2x2(s)
        self.active[b] = False


def merge_components(
    means: Tensor,
    covs: Tensor,
    counts: Tensor,
    *,
    tau_d: float,
    rule: str = "paper",
    grads: Tensor | None = None,
    tau_g: float = math.inf,
    variances: Tensor | None = None,
    tau_v: float = math.inf,
    test: str = "both",
    max_rounds: int | None = None,
    chunk_size: int = 512,
    progress: bool = False,
) -> MergeResult:
    """Merge qualifying pairs of components until none qualifies (see module docstring).

    Args:
        means: ``(K, 2)`` component means; covs: ``(K, 2, 2)`` SPD covariances;
            counts: ``(K,)`` non-negative sizes (weights for ``rule="moment"``).
        tau_d: threshold on the 2-Wasserstein distance ``W2`` (``>= 0``; ``inf`` disables).
        rule: ``"paper"`` (:func:`merge_paper`) or ``"moment"`` (:func:`merge_moment`).
        grads: ``(K, 2)`` centre-gradient vectors, or None to skip the gradient test.
            A merged component's gradient is ``g_a + g_b``.
        tau_g: gradient threshold (``>= 0``).
        variances: ``(K,)`` within-cluster variances; default ``tr S_k``. A merged
            component's variance is always recomputed as ``tr S`` of its merged covariance.
        tau_v: variance threshold (``>= 0``).
        test: ``"both"`` (each of the two below the threshold) or ``"difference"``.
        max_rounds: stop after this many rounds (None = until the fixed point).
        chunk_size: rows of the pairwise ``W2`` matrix evaluated at once.
        progress: show a tqdm bar (``"merge"``, on stderr) over the merge rounds, with
            the number of components and of qualifying pairs left.

    Returns:
        :class:`MergeResult`; merged counts are ``n_a + n_b`` and outputs keep the
        dtype of the inputs (computation is float64).
    """
    if not isinstance(means, Tensor) or means.dim() != 2 or means.shape[1] != 2:
        raise ValueError(f"means must be a (K, 2) tensor, got {_shape(means)}")
    k0 = int(means.shape[0])
    _check_vector("means", means, (k0, 2))
    if not isinstance(covs, Tensor) or tuple(covs.shape) != (k0, 2, 2):
        raise ValueError(f"covs must have shape ({k0}, 2, 2), got {_shape(covs)}")
    check_spd(covs, "covs")
    counts = torch.as_tensor(counts, device=means.device)
    _check_vector("counts", counts, (k0,), nonneg=True)
    tau_d, tau_g, tau_v = check_merge_settings(tau_d, tau_g, tau_v, rule, test)
    if grads is not None:
        _check_vector("grads", grads, (k0, 2))
    if variances is not None:
        _check_vector("variances", variances, (k0,), nonneg=True)
    _check_int("max_rounds", max_rounds, 0, none_ok=True)
    _check_int("chunk_size", chunk_size, 1)

    dev = means.device
    st = _State(means, covs, counts, grads, variances, tau_d, tau_g, tau_v, test, rule)
    slot_of = torch.arange(k0, device=dev)
    src, dst, d2 = st.qualify(torch.arange(k0, device=dev), chunk_size)
    keep = src < dst
    src, dst, d2 = src[keep], dst[keep], d2[keep]
    n_rounds = n_merged = 0
    big = k0
    with tqdm(
        total=max_rounds, desc="merge", unit="round", disable=not progress, leave=False
    ) as bar:
        bar.set_postfix_str(f"K {k0}, pairs {int(src.numel())}")
        while src.numel() > 0 and (max_rounds is None or n_rounds < max_rounds):
            u = torch.cat((src, dst))
            v = torch.cat((dst, src))
            d = torch.cat((d2, d2))
            best_d = torch.full((k0,), math.inf, dtype=d.dtype, device=dev)
            best_d = best_d.scatter_reduce(0, u, d, reduce="amin")
            cand = torch.where(d == best_d[u], v, big)
            best_v = torch.full((k0,), big, dtype=torch.long, device=dev)
            best_v = best_v.scatter_reduce(0, u, cand, reduce="amin")
            mutual = (best_v[src] == dst) & (best_v[dst] == src)
            a, b = src[mutual], dst[mutual]
            if a.numel() == 0:  # cannot happen for exact symmetric W2; guards the loop
                break
            st.merge(a, b)
            redirect = torch.arange(k0, device=dev)
            redirect[b] = a
            slot_of = redirect[slot_of]
            touched = torch.zeros(k0, dtype=torch.bool, device=dev)
            touched[torch.cat((a, b))] = True
            keep = ~(touched[src] | touched[dst])
            src, dst, d2 = src[keep], dst[keep], d2[keep]
            ns, nd, ndist = st.qualify(a, chunk_size)
            # an edge between two new components is found from both ends: keep one
            keep = ~touched[nd] | (nd > ns)
            ns, nd, ndist = ns[keep], nd[keep], ndist[keep]
            lo, hi = torch.minimum(ns, nd), torch.maximum(ns, nd)
            src, dst, d2 = torch.cat((src, lo)), torch.cat((dst, hi)), torch.cat((d2, ndist))
            n_rounds += 1
            n_merged += int(a.numel())
            bar.set_postfix_str(f"K {k0 - n_merged}, pairs {int(src.numel())}", False)
            bar.update(1)

    compact = torch.cumsum(st.active.long(), 0) - 1
    act = st.active
    merged_counts = st.counts[act] if counts.is_floating_point() else st.counts[act].round()
    return MergeResult(
        means=st.means[act].to(means.dtype),
        covs=st.covs[act].to(covs.dtype),
        counts=merged_counts.to(counts.dtype),
        mapping=compact[slot_of],
        n_rounds=n_rounds,
        n_merged=n_merged,
        grads=None if st.grads is None else st.grads[act].to(grads.dtype),
        variances=st.var[act].to(means.dtype),
        converged=src.numel() == 0,
    )


def remap_assignments(assign: Tensor, mapping: Tensor) -> Tensor:
    """Translate component indices after a merge: ``new[i] = mapping[assign[i]]``.

    Negative entries (e.g. ``-1`` for outliers) are kept unchanged. Raises
    ``ValueError`` naming the first index that is out of range for ``mapping``.
    """
    if not isinstance(assign, Tensor) or assign.is_floating_point() or assign.is_complex():
        raise ValueError("assign must be an integer tensor")
    if not isinstance(mapping, Tensor) or mapping.dim() != 1:
        raise ValueError("mapping must be a 1-D integer tensor")
    k_old = int(mapping.shape[0])
    too_big = assign >= k_old
    if bool(too_big.any()):
        pos = int(torch.nonzero(too_big.flatten())[0, 0])
        raise ValueError(
            f"assign[{pos}] = {int(assign.flatten()[pos])} is out of range for a mapping "
            f"of {k_old} components"
        )
    out = assign.clone()
    ok = assign >= 0
    out[ok] = mapping.to(assign.device)[assign[ok]].to(assign.dtype)
    return out
