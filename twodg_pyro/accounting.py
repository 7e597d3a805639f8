r"""Compression accounting of a shared-weight BNN (Tables 1-5 of the paper).

* trainable parameters: what the guide trains (component centres :math:`2K`,
  outliers :math:`2 n_\text{out}`, Cholesky factors :math:`3K` for the stochastic and
  tied tyings) plus the network's deterministic parameters (e.g. BatchNorm);
* compression ratio against the mean-field BNN: :math:`2 n_w / \text{trainable}`
  (both sides without the deterministic parameters, which are the same);
* stored floating-point numbers (``stored_params``): the trainable ones, nothing per
  weight (the per-weight index is counted in bytes, below), to compare with the other
  methods' stored numbers (mean-field: two per weight);
* size in MB (:math:`10^6` bytes) of the trainable parameters at float32;
* size with the per-inlier component index: as the paper counts it (uint8 when
  :math:`K \le 256`, uint16 when :math:`K \le 65536`, else int32) and bit-packed at
  :math:`\lceil \log_2 K \rceil` bits per inlier; outlier positions as int32 and the
  ellipse weights' :math:`k` components and alphas (float32) are stored too.

These count floating-point numbers; what a file takes on disk is in bytes
(:func:`network_bytes` for a plain network, the ``file_bytes`` of a run's records,
:mod:`twodg_pyro.pipeline.outputs.costs`).
"""

from __future__ import annotations

import math

from torch import nn

from .guide import require_sharing


def index_bits(n_components: int) -> tuple[int, int]:
    """``(container_bits, packed_bits)`` for one component index among ``n_components``."""
    if n_components < 1:
        raise ValueError(f"n_components must be at least 1, got {n_components!r}")
    packed = max(1, math.ceil(math.log2(n_components))) if n_components > 1 else 1
    container = 8 if n_components <= 256 else 16 if n_components <= 65536 else 32
    return container, packed


def compression_report(guide, model) -> dict:
    """Counts, trainable parameters, compression ratio and sizes of a shared-GMM guide."""
    require_sharing(guide, "compression_report")
    s = guide.structure()
    n_w = s.num_weights
    guide_trainable = guide.num_trainable()
    deterministic = sum(p.numel() for p in model.deterministic_parameters())
    container, packed = index_bits(s.n_gaussians)
    k = int(s.ellipse_components.shape[1]) if s.n_ellipses else 0
    # index storage: one component index per plain inlier, k indices + k float32 alphas per
    # ellipse weight, and an int32 position per outlier (which weights are outliers)
    n_index_entries = s.plain_index.numel() + k * s.n_ellipses
    extra_bytes = 4 * s.n_outliers + 4 * k * s.n_ellipses
    params_bytes = 4 * (guide_trainable + deterministic)
    return {
        "n_weights": n_w,
        "n_outliers": s.n_outliers,
        "n_ellipses": s.n_ellipses,
        "n_gaussians": s.n_gaussians,
        "trainable_params": guide_trainable + deterministic,
        "stored_params": guide_trainable + deterministic,
        "guide_trainable_params": guide_trainable,
        "mean_field_params": 2 * n_w,
        "compression_ratio": (2 * n_w) / max(guide_trainable, 1),
        "size_mb": params_bytes / 1e6,
        "size_mb_with_index": (params_bytes + n_index_entries * container / 8 + extra_bytes) / 1e6,
        "size_mb_with_packed_index": (
            params_bytes + math.ceil(n_index_entries * packed / 8) + extra_bytes
        )
        / 1e6,
        "index_bits": {"container": container, "packed": packed},
    }


def network_bytes(net: nn.Module) -> dict[str, int]:
    """The bytes a plain network takes at float32 and at INT8 (no container).

    Returns ``{"params", "float32", "int8"}``: the parameters' count; 4 bytes per
    parameter and floating-point buffer value (BatchNorm statistics); 1 byte per
    parameter plus a float32 scale per parameter tensor (per-tensor symmetric INT8), the
    floating-point buffers at float32.  Integer buffers (``num_batches_tracked``) are not
    needed for prediction and not counted."""
    params = list(net.parameters())
    n = sum(p.numel() for p in params)
    buffers = sum(b.numel() for b in net.buffers() if b.is_floating_point())
    return {"params": n, "float32": 4 * (n + buffers), "int8": n + 4 * len(params) + 4 * buffers}
