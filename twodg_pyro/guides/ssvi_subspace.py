r"""SSVI's subspace schedule (Li et al., 2024): which coordinates of
:class:`~twodg_pyro.guides.SSVIGuide` leave and join the active subspace, and when.

**Subspace updates** (:class:`SubspaceUpdate`, a training-loop callback) alternate with
the SVI steps: every ``update_every`` epochs, in each site, the ``n`` active coordinates
with the lowest *removal score* leave :math:`\Gamma` and ``n`` inactive coordinates join
it, chosen by the largest :math:`|\partial \mathcal L / \partial \theta_i|` at the
posterior mean (``addition="gradient"``, the NLL gradient summed over a few minibatches)
or uniformly at random (``addition="random"``).  Candidates for addition are the
coordinates that were inactive before the removal, so the subspace really moves.  New
coordinates start at :math:`\mu = 0` (the value they had) with the guide's initial
:math:`\sigma`.  ``n = floor(zeta_t |Gamma|)`` with a cosine-decaying fraction
:math:`\zeta_t = \zeta_0 \tfrac12 (1 + \cos(\pi t / T))` over the first
``stop_fraction`` of training (no updates after it).  After every update exactly
:math:`s` coordinates are active.

Removal scores (:func:`removal_scores`; higher means keep), for
:math:`\theta_i \sim \mathcal N(\mu_i, \sigma_i^2)`:

* ``"mu"``: :math:`|\mu_i|`;
* ``"snr"``: :math:`|\mu_i| / \sigma_i`;
* ``"snr_abs_theta"``: :math:`\mathrm{SNR}(|\theta_i|) = \mathbb E|\theta_i| /
  \sqrt{\operatorname{Var}|\theta_i|}` from the folded-normal moments
  :math:`\mathbb E|\theta| = \sigma\sqrt{2/\pi}\, e^{-\mu^2/2\sigma^2}
  + \mu\,(1 - 2\Phi(-\mu/\sigma))`,
  :math:`\operatorname{Var}|\theta| = \mu^2 + \sigma^2 - (\mathbb E|\theta|)^2`
  (the criterion the authors found best).  Note that with :math:`t = |\mu|/\sigma` it
  equals :math:`g(t)/\sqrt{1 + t^2 - g(t)^2}`, :math:`g(t) = \sqrt{2/\pi}e^{-t^2/2} +
  t\,\operatorname{erf}(t/\sqrt2)`, a strictly increasing function of ``snr`` (from
  :math:`\sqrt{2/(\pi - 2)} \approx 1.3236` at :math:`t = 0` to :math:`\approx t` for
  large :math:`t`): it ranks coordinates exactly as ``"snr"`` does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Literal, get_args

import torch

from ..infer.callbacks import Callback
from ..infer.optim import remap_optimizer_rows
from .base import site_key
from .ssvi import SSVIGuide

#: which active coordinates leave the subspace, and which inactive ones join it
RemovalCriterion = Literal["mu", "snr", "snr_abs_theta"]
REMOVAL_CRITERIA: tuple[str, ...] = get_args(RemovalCriterion)
AdditionCriterion = Literal["gradient", "random"]
ADDITION_CRITERIA: tuple[str, ...] = get_args(AdditionCriterion)


def check_criterion(criterion: str, kind: str = "removal") -> str:
    """``criterion`` if it is a known ``kind`` (``"removal"`` or ``"addition"``)
    criterion, else a clear ``ValueError``."""
    known = REMOVAL_CRITERIA if kind == "removal" else ADDITION_CRITERIA
    if criterion not in known:
        raise ValueError(f"unknown {kind} criterion {criterion!r}; known: {list(known)}")
    return criterion


def folded_normal_moments(
    loc: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r""":math:`(\mathbb E|\theta|, \operatorname{std}|\theta|)` for :math:`\theta \sim
    \mathcal N(\text{loc}, \text{scale}^2)`, computed stably in float64.

    With :math:`t = |\mu|/\sigma` and :math:`\delta = \sqrt{2/\pi} e^{-t^2/2} - t
    \operatorname{erfc}(t/\sqrt2) \ge 0`: :math:`\mathbb E|\theta| = \sigma (t + \delta)`
    and :math:`\operatorname{Var}|\theta| = \sigma^2 (1 - 2 t \delta - \delta^2)`, which
    avoids the cancellation of :math:`\mu^2 + \sigma^2 - (\mathbb E|\theta|)^2`.
    """
    mu = loc.detach().double().abs()
    sigma = scale.detach().double()
    t = mu / sigma
    delta = math.sqrt(2.0 / math.pi) * torch.exp(-0.5 * t * t) - t * torch.erfc(t / math.sqrt(2.0))
    mean = sigma * (t + delta)
    var_ratio = (1.0 - 2.0 * t * delta - delta * delta).clamp_min(0.0)
    return mean.to(loc.dtype), (sigma * var_ratio.sqrt()).to(loc.dtype)


def removal_scores(loc: torch.Tensor, scale: torch.Tensor, criterion: str) -> torch.Tensor:
    r"""Keep-scores (module docstring) of coordinates with posterior
    :math:`\mathcal N(\mu, \sigma^2)`; the lowest are removed first.

    Raises:
        ValueError: for an unknown criterion, naming it.
    """
    check_criterion(criterion)
    loc, scale = loc.detach(), scale.detach()
    if criterion == "mu":
        return loc.abs()
    if criterion == "snr":
        return loc.abs() / scale
    mean, std = folded_normal_moments(loc.double(), scale.double())
    return (mean / std).to(loc.dtype)


class SubspaceUpdate(Callback):
    r"""The SSVI subspace schedule: remove and add coordinates every ``update_every`` epochs.

    Args:
        data: minibatches ``(x, y)`` for the gradient of ``addition="gradient"``.
        removal: ``"mu"``, ``"snr"`` or ``"snr_abs_theta"`` (default, the paper's best).
        addition: ``"gradient"`` (largest :math:`|\partial \text{NLL} / \partial\theta_i|` at
            the posterior mean) or ``"random"``.
        update_every: epochs between updates (> 0).
        move_fraction: :math:`\zeta_0`, the fraction of each site's active coordinates
            moved at the first update, decaying by a cosine to 0 at ``stop_fraction``.
        stop_fraction: fraction of the training epochs after which the subspace is fixed.
        grad_batches: minibatches summed for the addition gradient.
        seed: seed of random additions.

    ``updates`` records each update: ``epoch``, ``fraction``, ``moved``, ``active``.

    Raises:
        ValueError: unknown criteria or out-of-range settings, naming the value.
    """

    def __init__(
        self,
        data: Iterable,
        removal: str = "snr_abs_theta",
        addition: str = "gradient",
        update_every: int = 5,
        move_fraction: float = 0.3,
        stop_fraction: float = 0.75,
        grad_batches: int = 1,
        seed: int = 0,
    ):
        self.removal = check_criterion(removal)
        self.addition = check_criterion(addition, "addition")
        if isinstance(update_every, bool) or not isinstance(update_every, int) or update_every < 1:
            raise ValueError(f"update_every must be an integer >= 1, got {update_every!r}")
        for name, value in (("move_fraction", move_fraction), ("stop_fraction", stop_fraction)):
            if not (0.0 <= float(value) <= 1.0):
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if int(grad_batches) < 1:
            raise ValueError(f"grad_batches must be at least 1, got {grad_batches!r}")
        self.data = data
        self.update_every = int(update_every)
        self.move_fraction = float(move_fraction)
        self.stop_fraction = float(stop_fraction)
        self.grad_batches = int(grad_batches)
        self._generator = torch.Generator().manual_seed(int(seed))
        self.updates: list[dict] = []

    def fraction(self, epoch: int, total_epochs: int) -> float:
        r""":math:`\zeta_t = \zeta_0 \frac12 (1 + \cos(\pi t / T))`, ``T = stop_fraction *
        total_epochs``; 0 from ``T`` on."""
        stop = self.stop_fraction * total_epochs
        if stop <= 0 or epoch >= stop:
            return 0.0
        return self.move_fraction * 0.5 * (1.0 + math.cos(math.pi * epoch / stop))

    def on_epoch_end(self, state) -> None:
        epoch = state.epoch  # epochs completed
        if epoch % self.update_every or epoch >= state.epochs:
            return
        frac = self.fraction(epoch, state.epochs)
        if frac > 0:
            self.update(state, frac)

    def _addition_scores(self, model, guide: SSVIGuide) -> dict[str, torch.Tensor]:
        """Dense ``|sum of dNLL/dtheta|`` at the posterior mean, per site."""
        if self.addition == "random":
            return {
                s.name: torch.rand(s.numel, generator=self._generator).reshape(s.shape)
                for s in guide.sites
            }
        weights = {k: v.clone().requires_grad_(True) for k, v in guide.mean_weights().items()}
        device = next(iter(weights.values())).device
        total = {k: torch.zeros_like(v) for k, v in weights.items()}
        with torch.enable_grad():
            for batch in itertools.islice(self.data, self.grad_batches):  # no batch more
                x, y = batch[0].to(device), batch[1].to(device)
                out = model.network_forward(weights, x)
                nll = -model.likelihood.log_prob(out, y).sum()
                grads = torch.autograd.grad(nll, list(weights.values()), allow_unused=True)
                for (k, _), g in zip(weights.items(), grads, strict=True):
                    if g is not None:
                        total[k] += g
        return {k: v.abs().cpu() for k, v in total.items()}

    @torch.no_grad()
    def update(self, state, fraction: float) -> int:
        """One removal-and-addition step on every site; returns the coordinates moved."""
        guide: SSVIGuide = state.guide
        if not isinstance(guide, SSVIGuide):
            raise TypeError(f"SubspaceUpdate needs an SSVIGuide, got {type(guide).__name__}")
        add_scores = self._addition_scores(state.model, guide)
        moved = 0
        for site in guide.sites:
            idx = guide.active_indices(site.name)
            n_move = min(int(math.floor(fraction * len(idx))), site.numel - len(idx))
            if n_move <= 0:
                continue
            keep_scores = removal_scores(guide.loc(site.name), guide.scale(site.name), self.removal)
            remove = torch.topk(keep_scores, n_move, largest=False).indices
            candidates = add_scores[site.name].reshape(-1).clone().to(torch.float64)
            candidates[idx.cpu()] = -math.inf  # inactive before the removal only
            add = torch.topk(candidates, n_move).indices.to(idx.device)
            key = site_key(site.name)
            old = [guide.locs[key], guide.rhos[key]]
            kept_pos = guide.move(site.name, remove, add)
            # the kept coordinates keep their optimiser state, the added ones start afresh
            rows = torch.full((len(idx),), -1, dtype=torch.long, device=kept_pos.device)
            rows[kept_pos] = torch.arange(len(kept_pos), device=kept_pos.device)
            new = [guide.locs[key], guide.rhos[key]]
            remap_optimizer_rows(state.optimizer, zip(old, new, strict=True), rows, len(idx))
            moved += n_move
        if moved:
            state.rebuild_optimizer()
        self.updates.append(
            {"epoch": state.epoch, "fraction": fraction, "moved": moved, "active": guide.num_active}
        )
        return moved

    def state_dict(self) -> dict:
        return {"updates": list(self.updates)}

    def load_state_dict(self, state: dict) -> None:
        self.updates = list(state.get("updates", []))
