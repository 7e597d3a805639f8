r"""The sharing structure of a whole network: who is an outlier, who is tied to what.

Every Bayesian weight of the network, flattened in site order (global index
:math:`g \in [0, n_w)`), is exactly one of

* an **outlier**: its own Normal posterior :math:`\mathcal N(\mu_i, \sigma_i^2)`;
* a **plain inlier**: tied to one component :math:`c_i`;
* an **ellipse** weight: an inlier whose Mahalanobis distance to its component
  exceeds :math:`T_M`, tied to its :math:`k` nearest components with blending
  weights :math:`\alpha_{ij}` (:math:`\sum_j \alpha_{ij} = 1`).

The components are 2-D Gaussians :math:`\mathcal N(m_k, S_k)` over the
:math:`(\mu, \sigma)` plane (or :math:`(\mu, \log\sigma)`, ``coordinates``).
The structure also keeps each inlier's stage-1 point :math:`x_i` (for
re-running the Mahalanobis check during stage 3) and the outliers' stage-1
:math:`(\mu, \sigma)` (their initial posterior).

Saved as one file of plain tensors plus a JSON header, loadable with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

import torch

from ..files.atomic import atomic_torch_save, safe_torch_load
from ..files.integrity import CHECKSUM_KEY, FieldError, check_field, seal, verify_checksum
from ..nn.functional import MIN_SIGMA

FORMAT_VERSION = 1

#: the plane the mixture lives in: :math:`(\mu, \sigma)` as the paper, or :math:`(\mu, \log\sigma)`
Coordinates = Literal["sigma", "log_sigma"]
COORDINATES: tuple[str, ...] = get_args(Coordinates)
_KIND = "twodg_pyro.SharingStructure"


def plane_coordinate(sigma: torch.Tensor, coordinates: str) -> torch.Tensor:
    r"""The plane's second coordinate of scales ``sigma``: :math:`\sigma` (``sigma``) or
    :math:`\log\sigma` (``log_sigma``, of :math:`\sigma` floored at
    :data:`~twodg_pyro.nn.functional.MIN_SIGMA`); the inverse of :func:`plane_sigma`.

    Raises:
        ValueError: other coordinates (named).
    """
    if coordinates not in COORDINATES:
        raise ValueError(f"coordinates must be one of {list(COORDINATES)}, got {coordinates!r}")
    return sigma.clamp_min(MIN_SIGMA).log() if coordinates == "log_sigma" else sigma


def plane_sigma(m1: torch.Tensor, coordinates: str) -> torch.Tensor:
    r"""The scales :math:`\sigma` of the plane's second coordinates ``m1``: :math:`e^{m_1}`
    (``log_sigma``), else :math:`|m_1|` floored at
    :data:`~twodg_pyro.nn.functional.MIN_SIGMA` (a drawn coordinate may be negative)."""
    return m1.exp() if coordinates == "log_sigma" else m1.abs().clamp_min(MIN_SIGMA)


def inlier_fields(index, points, component, ellipses) -> dict:
    """The inlier fields of a :class:`SharingStructure` from the inliers' flat ``index``,
    ``points`` and ``component`` and ``ellipses = (mask, components, alphas)``: plain weights
    first, then ellipse weights."""
    mask, comps, alphas = ellipses
    return dict(
        plain_index=index[~mask],
        plain_component=component[~mask],
        ellipse_index=index[mask],
        ellipse_components=comps,
        ellipse_alphas=alphas,
        inlier_points=torch.cat([points[~mask], points[mask]]),
    )


@dataclass(frozen=True)
class SiteLayout:
    """Name, shape and flat offset of one Bayesian site."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def site_index(sites: list[SiteLayout], index: torch.Tensor) -> torch.Tensor:
    """The site (its position in ``sites``, which lie in offset order) of each flat weight
    ``index``."""
    ends = torch.tensor([site.offset + site.numel for site in sites], dtype=index.dtype)
    return torch.bucketize(index, ends, right=True)


@dataclass
class SharingStructure:
    """The result of stages 1-2 for the whole network (see module docstring).

    Index tensors are ``int64`` global flat indices, sorted ascending.
    """

    sites: list[SiteLayout]
    coordinates: str
    means: torch.Tensor  # (K, 2)
    covariances: torch.Tensor  # (K, 2, 2)
    outlier_index: torch.Tensor  # (n_out,)
    outlier_loc: torch.Tensor  # (n_out,)
    outlier_scale: torch.Tensor  # (n_out,)
    plain_index: torch.Tensor  # (n_plain,)
    plain_component: torch.Tensor  # (n_plain,)
    ellipse_index: torch.Tensor  # (n_e,)
    ellipse_components: torch.Tensor  # (n_e, k)
    ellipse_alphas: torch.Tensor  # (n_e, k)
    inlier_points: torch.Tensor  # (n_plain + n_e, 2): points of plain_index then ellipse_index
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    @property
    def num_weights(self) -> int:
        """:math:`n_w`."""
        return sum(s.numel for s in self.sites)

    @property
    def n_outliers(self) -> int:
        return int(self.outlier_index.numel())

    @property
    def n_ellipses(self) -> int:
        return int(self.ellipse_index.numel())

    @property
    def n_gaussians(self) -> int:
        return int(self.means.shape[0])

    @property
    def n_inliers(self) -> int:
        return int(self.plain_index.numel() + self.ellipse_index.numel())

    def counts(self) -> dict[str, int]:
        """``#outliers``, ``#ellipses``, ``#Gaussians`` and inlier/weight totals."""
        return {
            "n_weights": self.num_weights,
            "n_outliers": self.n_outliers,
            "n_inliers": self.n_inliers,
            "n_ellipses": self.n_ellipses,
            "n_gaussians": self.n_gaussians,
        }

    def component_counts(self) -> torch.Tensor:
        r""":math:`N_k = \sum_i r_{ik}`: 1 per plain inlier, :math:`\alpha_{ik}` per ellipse
        weight."""
        K = self.n_gaussians
        n = torch.bincount(self.plain_component, minlength=K).to(self.means.dtype)
        if self.n_ellipses:
            n = n.index_add(0, self.ellipse_components.reshape(-1), self.ellipse_alphas.reshape(-1))
        return n

    def validate(self) -> None:
        """Check that every weight is covered exactly once and indices are in range.

        Raises:
            FieldError: (a ``ValueError``) naming the inconsistency.
        """
        n_w = self.num_weights
        end, names = 0, set()
        for site in sorted(self.sites, key=lambda site: site.offset):
            if site.offset != end or site.name in names:
                raise FieldError(
                    f"site {site.name!r} at offset {site.offset}: the sites must cover the "
                    f"{n_w} weights one after another, each once (expected offset {end})"
                )
            end, names = end + site.numel, names | {site.name}
        K = int(self.means.shape[0]) if self.means.dim() == 2 else -1
        if self.means.dim() != 2 or self.means.shape[1] != 2:
            raise FieldError(f"means must be (K, 2), got {tuple(self.means.shape)}")
        if self.covariances.shape != (K, 2, 2):
            raise FieldError(
                f"covariances must be ({K}, 2, 2), got {tuple(self.covariances.shape)}"
            )
        if self.coordinates not in COORDINATES:
            raise FieldError(
                f"coordinates must be one of {list(COORDINATES)}, got {self.coordinates!r}"
            )
        all_idx = torch.cat([self.outlier_index, self.plain_index, self.ellipse_index])
        if all_idx.numel() != n_w or not torch.equal(all_idx.sort().values, torch.arange(n_w)):
            raise FieldError(
                f"the sharing structure covers {all_idx.numel()} indices "
                f"({all_idx.unique().numel()} distinct) but the network has {n_w} weights: "
                "every weight must be exactly one of outlier / plain inlier / ellipse"
            )
        for name in ("outlier", "plain", "ellipse"):
            idx = getattr(self, f"{name}_index")
            if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
                raise FieldError(f"{name}_index must be sorted ascending")
        if not self.outlier_loc.shape == self.outlier_scale.shape == self.outlier_index.shape:
            raise FieldError("outlier_loc/outlier_scale must match outlier_index")
        if self.plain_component.shape != self.plain_index.shape:
            raise FieldError("plain_component must match plain_index")
        for name in ("plain_component", "ellipse_components"):
            check_field(name, getattr(self, name), 0, K - 1)
        if self.n_ellipses:
            if self.ellipse_components.shape != self.ellipse_alphas.shape or (
                self.ellipse_components.shape[0] != self.n_ellipses
            ):
                raise FieldError("ellipse_components/alphas must be (n_ellipses, k)")
            sums = self.ellipse_alphas.sum(1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
                raise FieldError("ellipse alphas must sum to one per weight")
        if self.inlier_points.shape != (self.n_inliers, 2):
            raise FieldError(
                f"inlier_points must be ({self.n_inliers}, 2), "
                f"got {tuple(self.inlier_points.shape)}"
            )

    def check_values(self, prefix: str = "") -> None:
        r"""The ranges of the stored values, checked where a structure is read from a file
        (what :meth:`validate` checks, every structure has): every float finite, the
        blending weights in :math:`[0, 1]`, the outlier scales positive, the variances
        (covariance diagonals) and, in ``sigma`` coordinates, the centres' :math:`\sigma`
        non-negative.

        Raises:
            FieldError: (a ``ValueError``) naming the field (after ``prefix``) and value.
        """
        for name in ("means", "covariances", "outlier_loc", "inlier_points"):
            check_field(prefix + name, getattr(self, name))
        if self.coordinates == "sigma":
            check_field(f"{prefix}means (sigma)", self.means[:, 1], low=0)
        check_field(f"{prefix}covariances (variances)", self.covariances.diagonal(0, 1, 2), low=0)
        tiny = torch.finfo(self.outlier_scale.dtype).tiny  # positive: a Normal's scale
        check_field(f"{prefix}outlier_scale", self.outlier_scale, low=tiny)
        check_field(f"{prefix}ellipse_alphas", self.ellipse_alphas, 0, 1)

    def check_matches(self, site_names: list[str], site_shapes: list[tuple[int, ...]]) -> None:
        """Raise ``ValueError`` if the structure was built for another network."""
        mine = [(s.name, tuple(s.shape)) for s in self.sites]
        theirs = [(n, tuple(sh)) for n, sh in zip(site_names, site_shapes, strict=True)]
        if mine != theirs:
            diff = next(
                ((a, b) for a, b in zip(mine, theirs, strict=False) if a != b),
                (f"{len(mine)} sites", f"{len(theirs)} sites"),
            )
            raise ValueError(
                "the sharing structure does not match the network: "
                f"structure has {diff[0]}, network has {diff[1]}"
            )

    def to_payload(self) -> dict:
        """Plain tensors and a JSON header (no pickled objects)."""
        header = {
            "kind": _KIND,
            "format_version": FORMAT_VERSION,
            "coordinates": self.coordinates,
            "sites": [[s.name, list(s.shape), s.offset] for s in self.sites],
            "info": self.info,
        }
        payload = {k: getattr(self, k).detach().cpu().contiguous() for k in self._TENSORS}
        payload["header"] = json.dumps(header)
        return payload

    @classmethod
    def from_payload(cls, payload: dict) -> SharingStructure:
        """Inverse of :meth:`to_payload`, checking kind and format version."""
        if not isinstance(payload, dict) or "header" not in payload:
            raise ValueError("not a twodg_pyro sharing structure (no header)")
        header = json.loads(payload["header"]) if isinstance(payload["header"], str) else None
        if not isinstance(header, dict) or header.get("kind") != _KIND:
            kind = header.get("kind") if isinstance(header, dict) else None
            raise ValueError(f"not a sharing structure: kind {kind!r:.80}")
        if header.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"sharing structure format version {header.get('format_version')!r} is not "
                f"supported (this version reads {FORMAT_VERSION})"
            )
        missing = [k for k in cls._TENSORS if not torch.is_tensor(payload.get(k))]
        if missing:
            raise ValueError(f"sharing structure is missing tensors {missing}")
        sites, count = header.get("sites"), lambda n: type(n) is int and n >= 0
        if not isinstance(sites, list) or not all(
            isinstance(x, list)
            and len(x) == 3
            and isinstance(x[0], str)
            and isinstance(x[1], list)
            and all(map(count, x[1] + x[2:]))
            for x in sites
        ):
            raise FieldError(f"the structure's sites {sites!r:.80} are not [[name, shape, offset]]")
        if not isinstance(header.get("info", {}), dict):
            raise FieldError(f"the structure's info {header['info']!r:.80} is not a table")
        return cls(
            sites=[SiteLayout(n, tuple(sh), o) for n, sh, o in sites],
            coordinates=header.get("coordinates"),
            info=header.get("info", {}),
            **{k: payload[k] for k in cls._TENSORS},
        )

    def save(self, path: str | Path) -> None:
        """Write atomically (temporary file then rename), with a content checksum."""
        atomic_torch_save(seal(self.to_payload()), path)

    @classmethod
    def load(cls, path: str | Path) -> SharingStructure:
        """Read a file written by :meth:`save` without unpickling code; its checksum
        (when it has one: files written before it existed have none) is verified."""
        payload = safe_torch_load(path)
        if isinstance(payload, dict) and CHECKSUM_KEY in payload:
            verify_checksum(payload, path)
            payload = {k: v for k, v in payload.items() if k != CHECKSUM_KEY}
        return cls.from_payload(payload)


#: the tensor fields of a structure, in file order
SharingStructure._TENSORS = tuple(
    f.name for f in fields(SharingStructure) if f.name not in ("sites", "coordinates", "info")
)
