r"""Pareto :math:`\hat k` of the VI approximation on low-dimensional blocks of the weights.

With tens of thousands of weights the :math:`\hat k` of the joint ratio
:math:`p(w, \mathcal D)/q(w)` (:func:`~.vi.vi_diagnostics`) is all but always above 0.7
for any variational family (the log ratio's variance grows with the dimension), and says
neither *where* the approximation fails nor what to change.  :func:`block_khat` asks a
question per block :math:`B` of weights instead -- one layer, the 2DG outlier set, the
weights tied to one mixture component: *does* :math:`q_B` *approximate the conditional
posterior of the block?*

**The conditional ratio.**  With the other weights held at a reference point
:math:`\bar w_{-B}` (the mean of the ``S`` draws), each draw :math:`w^{(s)} \sim q`
gives the hybrid :math:`(w^{(s)}_B, \bar w_{-B})` and

.. math:: \log r_s = \log p(w^{(s)}_B, \bar w_{-B}, \mathcal D) - \log q_B(w^{(s)}_B),

the importance ratio of :math:`p(w_B \mid \bar w_{-B}, \mathcal D)` against
:math:`q_B` up to a constant (which :math:`\hat k` ignores).  Every guide of the library
but the ``tied`` tying makes its weights independent given the sharing structure, so
:math:`\log q` of the hybrid is :math:`\log q_B(w_B)` plus a constant and the guide's own
marginal density (:func:`~twodg_pyro.guides.marginal_density.guide_log_q`) serves.  The
``tied`` tying shares one value :math:`z_k` per component *across layers*: its layer
blocks have no conditional density and are skipped (``skipped`` says why), its
component block is :math:`z_{k,0}` itself (one dimension, :math:`q = \mathcal N(m_{k,0},
S_{k,00})`), its outlier block is exact.  :math:`\log p` is :mod:`._draws`' (prior plus
the float64 log-likelihood of the training data, scaled by :math:`N/n` on a subset).

Each block's :math:`\hat k` is read against :func:`~.arviz_stats.khat_threshold`
:math:`\min(1 - 1/\log_{10} S, 0.7)`: a block above it is where the approximation is
not to be trusted (a layer: posterior dependence or non-Gaussianity that the family
misses; a component: its shared Normal does not fit its weights' posterior -- split it,
or make its weights outliers; the outliers: their own Normals are off).  The cost is one
forward pass of the ``n`` examples per draw and block.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ..evaluation import seeded
from ..guide import SharingGuide
from ..guides.marginal_density import component_marginals, log_q_fn
from ._draws import chunks, likelihood_scale, log_joint, n_examples
from ._sites import gather_flat, site_offsets
from .arviz_stats import khat_threshold
from .vi import khat_inputs, khat_row

#: Component blocks of :func:`default_blocks`: the largest components, by plain inliers.
DEFAULT_MAX_COMPONENTS = 8


class Block(NamedTuple):
    """A block of weights: ``name`` (``"layer layers.0"``, ``"outliers"``, ``"component
    3"``), ``kind`` (``layer``, ``outliers``, ``component``), the global flat indices
    ``index`` (in the guide's site order), and for a component block its ``component``
    (else -1)."""

    name: str
    kind: str
    index: torch.Tensor
    component: int = -1


def default_blocks(guide, max_components: int = DEFAULT_MAX_COMPONENTS) -> list[Block]:
    """One block per layer (its weight and bias sites), then, for a shared-GMM guide, the
    outlier set and the plain inliers of each of the ``max_components`` largest
    components."""
    layers: dict[str, list[torch.Tensor]] = {}
    for site, off in zip(guide.sites, site_offsets(guide.sites), strict=True):
        layers.setdefault(site.module_name, []).append(torch.arange(off, off + site.numel))
    out = [Block(f"layer {name}", "layer", torch.cat(parts)) for name, parts in layers.items()]
    if not isinstance(guide, SharingGuide):
        return out
    st = guide.structure()
    if st.n_outliers:
        out.append(Block("outliers", "outliers", st.outlier_index.long().cpu()))
    comp, idx = st.plain_component.long().cpu(), st.plain_index.long().cpu()
    sizes = torch.bincount(comp, minlength=st.n_gaussians)
    order = torch.argsort(sizes, descending=True, stable=True)[: max(0, int(max_components))]
    for k in order.tolist():
        if sizes[k] > 0:
            out.append(Block(f"component {k}", "component", idx[comp == k], k))
    return out


def _skip_reason(guide, block: Block) -> str | None:
    if getattr(guide, "tying", None) == "tied" and block.kind == "layer":
        return (
            "tied tying: a layer's weights share their component's value with other "
            "layers, so q has no conditional density on one layer"
        )
    return None


def _hybrid(mean: dict, weights: dict, sites, index: torch.Tensor) -> dict:
    """The draws' values on the block's flat ``index``, the reference ``mean`` elsewhere."""
    s = next(iter(weights.values())).shape[0]
    out = {}
    for site, off in zip(sites, site_offsets(sites), strict=True):
        h = mean[site.name].expand(s, *site.shape).clone().reshape(s, -1)
        inside = index[(index >= off) & (index < off + site.numel)] - off
        if inside.numel():
            local = inside.to(h.device)
            h[:, local] = weights[site.name].reshape(s, -1)[:, local]
        out[site.name] = h.reshape(s, *site.shape)
    return out


@torch.no_grad()
def block_khat(
    model,
    guide,
    train_data,
    num_samples: int = 100,
    seed: int = 0,
    blocks: list[Block] | None = None,
    max_components: int = DEFAULT_MAX_COMPONENTS,
    max_examples: int | None = None,
    batch_size: int = 512,
    quadrature_nodes: int = 64,
    progress: bool = False,
) -> dict:
    r"""Pareto :math:`\hat k` of the conditional importance ratios of each block (module
    docstring).

    Args:
        model, guide: the trained BNN (one of the library's guides).
        train_data: the training data (``(X, y)``, a ``Dataset`` or batches).
        num_samples: draws ``S`` from :math:`q` per block, at least 30.
        seed: seeds the draws and an example subset (the caller's RNG is restored).
        blocks: the blocks (default :func:`default_blocks` with ``max_components``).
        max_examples: a seeded subset of the training data (log-likelihood scaled N / n).
        progress: a tqdm bar (``"block k-hat"``) over the draws.

    Returns:
        ``blocks``: one dict per block, ``name``, ``kind``, ``size`` (weights),
        ``khat``, ``khat_assessment`` (:func:`~.vi.khat_assessment`), ``ess`` (of the
        smoothed weights), ``log_ratio_sd``, ``component`` (-1 unless a component), or
        ``skipped`` (the reason, no :math:`\hat k`); ``khat_threshold``;
        ``n_above_threshold`` (blocks above it); ``num_samples``, ``n_examples``,
        ``loglik_scale``, ``reference``.

    Raises:
        ValueError: fewer than 30 draws, no training data.
    """
    S, device, data = khat_inputs(
        model, guide, "block_khat", num_samples, train_data, batch_size, max_examples, seed
    )
    scale = likelihood_scale(model, data)
    blocks = default_blocks(guide, max_components) if blocks is None else list(blocks)
    active = [b for b in blocks if _skip_reason(guide, b) is None]
    log_q, _ = log_q_fn(guide, quadrature_nodes)
    tied = getattr(guide, "tying", None) == "tied"
    if tied:
        _, z_mean, z_sd, _ = component_marginals(guide, quadrature_nodes)  # N(m_k0, S_k00)

    mean = {s.name: 0.0 for s in guide.sites}  # pass 1: the reference point
    with seeded(seed, device):
        for s in chunks(S):
            w = guide.draw(s).weights
            mean = {k: mean[k] + w[k].sum(0) / S for k in mean}
    ratios: dict[str, list[torch.Tensor]] = {b.name: [] for b in active}
    bar = tqdm(total=S, desc="block k-hat", unit="draw", disable=not progress, leave=False)
    with bar, seeded(seed, device):  # pass 2: the same draws, one hybrid per block
        for s in chunks(S):
            w = guide.draw(s).weights
            for b in active:
                h = _hybrid(mean, w, guide.sites, b.index)
                lp = log_joint(model, guide, h, data, device, scale)
                if tied and b.kind == "component":
                    z = gather_flat(h, guide.sites, b.index[:1])[:, 0]
                    k = b.component
                    z_q = torch.distributions.Normal(z_mean[k, 0].double(), z_sd[k, 0].double())
                    lq = z_q.log_prob(z.to(torch.float64))
                else:
                    lq = log_q(h).to(torch.float64)
                ratios[b.name].append((lp - lq.to(lp.device)).cpu())
            bar.update(s)

    threshold = khat_threshold(S)
    rows = []
    for b in blocks:
        row = {
            "name": b.name,
            "kind": b.kind,
            "size": int(b.index.numel()),
            "component": b.component,
        }
        reason = _skip_reason(guide, b)
        if reason is None:
            log_r = torch.cat(ratios[b.name]).numpy()
            bad = int((~np.isfinite(log_r)).sum())
            reason = f"{bad} log ratios not finite" if bad else None
        rows.append({**row, **({"skipped": reason} if reason else khat_row(log_r))})
    return {
        "blocks": rows,
        "khat_threshold": threshold,
        "n_above_threshold": sum(1 for r in rows if r.get("khat", -np.inf) > threshold),
        "num_samples": S,
        "n_examples": n_examples(data),
        "loglik_scale": float(scale),
        "reference": "the other weights at the mean of the draws",
    }
