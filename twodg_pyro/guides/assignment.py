r"""The shared-GMM guide's index tables, built once from a
:class:`~twodg_pyro.sharing.SharingStructure`.

Every weight of the network is an outlier (its own Normal), a plain inlier (tied to one
component) or an ellipse weight (tied to its ``k`` nearest components with blending
weights :math:`\alpha`).  The guide draws the flat vector of all :math:`n_w` weights
with gathers over these tables, and its KL terms need, per site, which entries of the
(sorted) index lists fall in the site and how many weights each component holds there:

.. math:: N_{k,s} = \sum_{i \in s} r_{ik}, \qquad r_{ik} = \begin{cases}
    1 & \text{plain inlier of } k \\ \alpha_{ik} & \text{ellipse weight} \end{cases}
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from ..sharing.structure import SharingStructure, SiteLayout


class WeightKinds(NamedTuple):
    """How many weights of each kind the network has."""

    outliers: int
    plain: int
    ellipses: int


class SiteIndex(NamedTuple):
    """One site's place in the flat weight vector and in the sorted index lists.

    ``outliers``, ``plain`` and ``ellipses`` are the slices of
    ``outlier_index``/``outlier_loc``, ``plain_index``/``plain_component`` and
    ``ellipse_index``/``ellipse_components``/``ellipse_alphas`` that hold the site's
    weights; ``position`` is its row of ``site_counts``.
    """

    layout: SiteLayout
    position: int
    outliers: slice
    plain: slice
    ellipses: slice

    @property
    def offset(self) -> int:
        """The site's first flat index."""
        return self.layout.offset


def assignment_tables(
    s: SharingStructure, device: torch.device, dtype: torch.dtype
) -> tuple[list[tuple[str, torch.Tensor, bool]], dict[str, SiteIndex], WeightKinds]:
    """The index tables of ``s`` on ``device`` (floating tables in ``dtype``).

    Returns:
        ``(buffers, sites, kinds)``: the tensors a guide registers as buffers, in this
        order, as ``[(name, tensor, persistent), ...]`` (the index lists, the two
        weight-sized ones in 32 bits when the network allows; the inlier points;
        ``nat_index``, the natural-order table index: plain weight -> its component
        :math:`k`, the :math:`j`-th outlier -> :math:`K + j`, ellipse weight -> 0,
        overwritten per draw; and ``site_counts``, :math:`N_{k,s}`, ``(n_sites, K)``);
        ``{site name: SiteIndex}`` in the structure's site order; the number of outliers,
        plain inliers and ellipse weights.
    """
    n_w = s.num_weights
    K = s.n_gaussians
    buffers: list[tuple[str, torch.Tensor, bool]] = []

    def reg(name: str, t: torch.Tensor) -> None:  # floating buffers in the guide's dtype
        t = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        buffers.append((name, t, True))

    # the two weight-sized index lists in 32 bits when the network allows (half the
    # memory; index_select takes them); the small ones stay 64-bit for index_copy
    big = torch.int32 if n_w < 2**31 else torch.long
    reg("outlier_index", s.outlier_index.long())
    reg("plain_index", s.plain_index.to(big))
    reg("plain_component", s.plain_component.to(big))
    reg("ellipse_index", s.ellipse_index.long())
    reg("ellipse_components", s.ellipse_components.long())
    reg("ellipse_alphas", s.ellipse_alphas)
    reg("inlier_points", s.inlier_points)
    # drawing gathers with nat_index (index_select / gather: deterministic backward on
    # CPU, unlike advanced indexing)
    nat = torch.zeros(n_w, dtype=big)
    nat[s.plain_index] = s.plain_component.to(big)
    nat[s.outlier_index] = K + torch.arange(s.outlier_index.numel(), dtype=big)
    buffers.append(("nat_index", nat.to(device), False))
    # per-site ranges of the (sorted) index lists, and N_{k,s}
    ends = torch.tensor([lay.offset + lay.numel for lay in s.sites])
    site_of = lambda idx: torch.searchsorted(ends, idx, right=True)  # noqa: E731
    counts = torch.zeros(len(s.sites), K, dtype=dtype)
    if s.plain_index.numel():
        counts.view(-1).index_add_(
            0,
            site_of(s.plain_index) * K + s.plain_component,
            torch.ones(s.plain_index.numel(), dtype=dtype),
        )
    if s.ellipse_index.numel():
        k = s.ellipse_components.shape[1]
        rows = site_of(s.ellipse_index)[:, None].expand(-1, k)
        counts.view(-1).index_add_(
            0,
            (rows * K + s.ellipse_components).reshape(-1),
            s.ellipse_alphas.reshape(-1).to(dtype),
        )
    reg("site_counts", counts)
    lists = (s.outlier_index, s.plain_index, s.ellipse_index)
    bounds = torch.tensor([[lay.offset, lay.offset + lay.numel] for lay in s.sites])
    at = [torch.searchsorted(i, bounds).tolist() for i in lists]  # per list: [lo, hi] per site
    sites = {
        lay.name: SiteIndex(lay, p, *(slice(*a[p]) for a in at)) for p, lay in enumerate(s.sites)
    }
    kinds = WeightKinds(s.outlier_index.numel(), s.plain_index.numel(), s.ellipse_index.numel())
    return buffers, sites, kinds


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[:, index]`` for a ``(S, K')`` table (e.g. per draw, a value per component
    and outlier, gathered by ``nat_index`` into every weight), row by row: a 1-D
    ``index_select`` per draw (fast, 32-bit index, deterministic backward)."""
    if table.shape[0] == 1:
        return table[0].index_select(0, index).unsqueeze(0)
    if not torch.is_grad_enabled():
        out = table.new_empty(table.shape[0], index.numel())
        for row, dst in zip(table, out, strict=True):
            torch.index_select(row, 0, index, out=dst)
        return out
    return torch.stack([row.index_select(0, index) for row in table])


class TyingGuide(Protocol):
    """The public members of :class:`~twodg_pyro.guides.SharedGMMGuide` that the tyings
    (:mod:`~twodg_pyro.guides.tyings`) use, stated here so that they name the guide's shape
    without importing the guide that imports them: the components (centres ``(K, 2)`` in
    ``coordinates``, the parameters of their Cholesky factors, the factors and covariances
    ``(K, 2, 2)``, member counts), the outliers' parameters and the assignment tables."""

    coordinates: str
    kinds: WeightKinds
    centre_mu: torch.Tensor
    chol_log_diag: torch.Tensor
    chol_off: torch.Tensor
    outlier_loc: torch.Tensor
    outlier_rho: torch.Tensor
    plain_index: torch.Tensor
    plain_component: torch.Tensor
    ellipse_index: torch.Tensor
    ellipse_components: torch.Tensor
    ellipse_alphas: torch.Tensor
    nat_index: torch.Tensor
    site_counts: torch.Tensor

    @property
    def n_components(self) -> int: ...

    def centre_sigma(self) -> torch.Tensor: ...

    def centres(self) -> torch.Tensor: ...

    def cholesky(self) -> torch.Tensor: ...

    def covariances(self) -> torch.Tensor: ...

    def component_counts(self) -> torch.Tensor: ...
