r"""Post-training quantisation of a mean-field BNN: the baseline of Table 4.

Means are stored as int8 with one float32 scale per tensor (symmetric:
:math:`q = \mathrm{round}(\mu / s)`, :math:`s = \max|\mu| / 127`); standard deviations
at :math:`b \in \{1, 2, 4, 8\}` bits with :math:`2^b` levels spaced uniformly in
:math:`\log\sigma` between the tensor's min and max (two float32 numbers per tensor);
the 1-bit code keeps the smallest and the largest :math:`\log\sigma` of the tensor.

Size in MB (:math:`10^6` bytes):

.. math:: n_w \left(1 + \tfrac{b}{8}\right) + 4 \cdot 3\, n_\text{tensors}
    + 4\, n_\text{deterministic}

For the 784-400-400-10 MLP (478,410 weights) this gives 0.718 / 0.598 / 0.538 MB at
4 / 2 / 1 bits plus 72 bytes of per-tensor scales.
"""

from __future__ import annotations

import copy
import math

import torch


def _quantize_mu(mu: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric ``bits``-bit codes of ``mu`` (``int8`` at 8 bits, else ``int16``) and
    their scale ``max|mu| / (2^(bits-1) - 1)``."""
    top = 2 ** (bits - 1) - 1
    scale = mu.abs().max().clamp_min(1e-12) / top
    q = torch.round(mu / scale).clamp(-top, top).to(torch.int8 if bits == 8 else torch.int16)
    return q, scale


def _quantize_sigma(sigma: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    log_s = sigma.clamp_min(1e-30).log()
    lo, hi = log_s.min(), log_s.max()
    levels = 2**bits - 1
    step = (hi - lo) / levels if levels > 0 else hi.new_tensor(0.0)
    code = torch.round((log_s - lo) / step.clamp_min(1e-12)).clamp(0, levels).to(torch.int32)
    return code, torch.stack([lo, step])


def dequantize(q: torch.Tensor, scale: torch.Tensor, code: torch.Tensor, lo_step: torch.Tensor):
    r"""Back to float, in ``scale``'s dtype: :math:`\mu = q s`,
    :math:`\sigma = \exp(lo + code \cdot step)`."""
    return q.to(scale.dtype) * scale, torch.exp(lo_step[0] + code.to(lo_step.dtype) * lo_step[1])


def quantize_mean_field(guide, sigma_bits: int = 4):
    """A copy of the mean-field ``guide`` whose means are int8 and scales ``sigma_bits``-bit,
    dequantised back into the guide (so it predicts like the stored model)."""
    if sigma_bits not in (1, 2, 4, 8):
        raise ValueError(f"sigma_bits must be 1, 2, 4 or 8, got {sigma_bits!r}")
    from ..nn.functional import inverse_softplus

    q_guide = copy.deepcopy(guide)
    with torch.no_grad():
        for site in q_guide.sites:
            mu, sigma = q_guide.loc(site.name), q_guide.scale(site.name)
            mu_hat, sigma_hat = dequantize(*_quantize_mu(mu), *_quantize_sigma(sigma, sigma_bits))
            q_guide.loc(site.name).copy_(mu_hat)
            q_guide.rhos[site.name.replace(".", "__")].copy_(inverse_softplus(sigma_hat))
    return q_guide


def quantized_size_mb(n_weights: int, n_tensors: int, sigma_bits: int, n_deterministic: int = 0):
    """Stored size of the quantised BNN in MB (formula in the module docstring)."""
    if n_weights < 0 or n_tensors < 0 or n_deterministic < 0:
        raise ValueError("counts must be non-negative")
    bytes_ = n_weights + math.ceil(n_weights * sigma_bits / 8) + 12 * n_tensors
    return (bytes_ + 4 * n_deterministic) / 1e6
