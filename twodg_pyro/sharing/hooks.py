r"""Guide-refinement hooks: merging and Mahalanobis reassignment during stage 3.

Both are :class:`~twodg_pyro.infer.callbacks.Callback` objects for
:func:`~twodg_pyro.infer.fit`, each with its own schedule: run every ``every``
epochs, and (``until_fixed_point=True``) stop running once a run changes nothing.

Both refine a guide with a sharing structure (a :class:`~twodg_pyro.guide.SharingGuide`:
its ``structure``, ``load_structure`` and ``component_parameters``, and the shared-GMM
guide's mixture and ``merge``) by the structure-level refinements of :mod:`.refine`.
After a merge the number of components changes: the guide rebuilds its component
parameters and the optimiser is rebuilt; the Adam moments of a merged component are the
mean of its parents' moments (:func:`~twodg_pyro.infer.remap_optimizer_rows`), every
other parameter keeps its state.
"""

from __future__ import annotations

import math
from typing import get_args

import torch

from ..gmm import merge_components
from ..gmm.merging import check_merge_settings
from ..guide import require_sharing
from ..infer.callbacks import Callback
from ..infer.optim import remap_optimizer_rows
from .config import Assignment, EllipseScope
from .prune import lowest_snr_first, prune_further
from .refine import reassign


class _Scheduled(Callback):
    def __init__(self, every: int, until_fixed_point: bool):
        if int(every) < 1:
            raise ValueError(f"hook schedule 'every' must be at least 1 epoch, got {every!r}")
        self.every = int(every)
        self.until_fixed_point = bool(until_fixed_point)
        self.done = False
        self.log: list[dict] = []

    def on_epoch_end(self, state) -> None:
        """Run :meth:`apply` every ``every`` epochs; with ``until_fixed_point``, stop once it
        changes nothing."""
        if self.done or state.epoch % self.every:
            return
        if self.apply(state) == 0 and self.until_fixed_point:
            self.done = True

    def apply(self, state) -> int:
        """Refine ``state.guide`` now; returns how many things changed."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"done": self.done, "log": self.log}

    def load_state_dict(self, state: dict) -> None:
        self.done, self.log = bool(state["done"]), list(state["log"])


class MergeHook(_Scheduled):
    r"""Merge components whose :math:`W_2 < \tau_d` (and gradient/variance tests pass).

    Args:
        tau_d: W2 threshold :math:`T_W` (on :math:`W_2`, not its square).
        rule: ``"paper"`` (Eqs. 5-6 as printed) or ``"moment"`` (count-weighted).
        test: ``"both"`` (each cluster below the thresholds) or ``"difference"``.
        tau_g: centre-gradient threshold; ``inf`` skips the gradient test (and its cost).
        tau_v: within-cluster variance threshold (trace of :math:`S_k`).
        data: minibatches for the centre gradients (needed when ``tau_g`` is finite).
        grad_batches: minibatches averaged for the gradients.
        every: run every ``every`` epochs.
        until_fixed_point: stop running once a run merges nothing.

    Example::

        merge = MergeHook(tau_d=0.01, every=2)   # merge components within W2 < 0.01
        fit(model, shared_guide, loader, epochs=100, callbacks=[merge])
        merge.log   # what each run merged
    """

    def __init__(
        self,
        tau_d: float = 1e-2,
        rule: str = "paper",
        test: str = "both",
        tau_g: float = math.inf,
        tau_v: float = math.inf,
        data=None,
        grad_batches: int = 1,
        every: int = 1,
        until_fixed_point: bool = True,
    ):
        super().__init__(every, until_fixed_point)
        self.tau_d, self.tau_g, self.tau_v = check_merge_settings(tau_d, tau_g, tau_v, rule, test)
        if math.isfinite(self.tau_g) and data is None:
            raise ValueError("a finite tau_g needs data to compute centre gradients")
        self.rule, self.test = rule, test
        self.data, self.grad_batches = data, int(grad_batches)

    def apply(self, state) -> int:
        """Run the merge on ``state.guide`` now; returns the number of merges."""
        guide = state.guide
        require_sharing(guide, type(self).__name__)
        grads = None
        if math.isfinite(self.tau_g):
            grads = guide.centre_gradients(state.model, self.data, self.grad_batches)
        # pruned components (the last n_pinned) neither merge nor absorb others
        k_before = guide.n_components
        free = k_before - getattr(guide, "n_pinned", 0)
        with torch.no_grad():
            means, covs = guide.centres().detach().cpu(), guide.covariances().detach().cpu()
            result = merge_components(
                means[:free],
                covs[:free],
                guide.component_counts().detach().cpu()[:free],
                tau_d=self.tau_d,
                rule=self.rule,
                grads=None if grads is None else grads.cpu()[:free],
                tau_g=self.tau_g,
                tau_v=self.tau_v,
                test=self.test,
            )
        n_merged = free - int(result.means.shape[0])
        self.log.append({"epoch": state.epoch, "before": k_before, "after": k_before - n_merged})
        if n_merged == 0:
            return 0
        pinned = torch.arange(k_before - free) + result.means.shape[0]
        mapping = torch.cat([result.mapping.long(), pinned])
        old = guide.component_parameters()
        guide.merge(
            mapping, torch.cat([result.means, means[free:]]), torch.cat([result.covs, covs[free:]])
        )
        pairs = zip(old, guide.component_parameters(), strict=True)
        remap_optimizer_rows(state.optimizer, pairs, mapping, guide.n_components)
        state.rebuild_optimizer()
        return n_merged


class MahalanobisHook(_Scheduled):
    r"""Re-run the :math:`D^2 > T_M` ellipse check of all inliers against the current
    mixture (component parameters are kept).

    The inlier points are the guide's :meth:`~twodg_pyro.guides.SharedGMMGuide.current_points`:
    they move with their components during stage 3, so the check reacts to changes of the
    mixture (a merge), not to the centres' drift; it measures them against the spread of
    their components' points (:meth:`~twodg_pyro.guides.SharedGMMGuide.point_covariances`),
    not against the covariances that the ``stochastic`` and ``tied`` tyings train as
    variational parameters (against those, half of the inliers became ellipse weights on
    digits).  By default
    every weight keeps the component it is tied to (``reassign=False``): a weight that now
    lies beyond :math:`T_M` of it becomes an ellipse weight over its ``k`` nearest
    components, an ellipse weight back within :math:`T_M` of its nearest component becomes
    a plain weight of it.  ``reassign=True`` first re-runs the assignment
    (:math:`\arg\max_k \pi_k \mathcal N(x_i \mid m_k, S_k)`, or with ``assignment =
    "nearest"`` the nearest component in :math:`W_2`, as ``sharing.assignment``), which
    moves weights between components whose centres training has already fitted to other
    members.  ``scope = "layer"`` blends an ellipse weight from its own layer's components
    only (``sharing.ellipse_scope``).

    Example::

        hook = MahalanobisHook(threshold=5.991, k=5, every=2)
        fit(model, shared_guide, loader, epochs=100, callbacks=[hook])
        hook.log   # the ellipse weights each run moved back
    """

    def __init__(
        self,
        threshold: float = 5.991,
        k: int = 5,
        every: int = 1,
        until_fixed_point: bool = True,
        reassign: bool = False,
        assignment: str = "responsibility",
        scope: str = "all",
    ):
        super().__init__(every, until_fixed_point)
        for name, value, allowed in (
            ("assignment", assignment, Assignment),
            ("scope", scope, EllipseScope),
        ):
            if value not in get_args(allowed):
                raise ValueError(f"{name} must be one of {get_args(allowed)}, got {value!r}")
        self.threshold, self.k = float(threshold), int(k)
        self.reassign, self.assignment, self.scope = bool(reassign), assignment, scope

    def apply(self, state) -> int:
        """Reassign now; returns how many weights changed component or kind."""
        guide = state.guide
        require_sharing(guide, type(self).__name__)
        before = guide.structure(current_points=True)
        after = reassign(
            before,
            before.means,
            guide.point_covariances(),
            threshold=self.threshold,
            k=self.k,
            keep_components=not self.reassign,
            pinned=getattr(guide, "n_pinned", 0),
            assignment=self.assignment,
            scope=self.scope,
        )
        changed = _n_changed(before, after)
        self.log.append({"epoch": state.epoch, "changed": changed, "ellipses": after.n_ellipses})
        if changed:
            guide.load_structure(after, components=False)
        return changed


class PinPruned(Callback):
    r"""Hold a pruned guide's zero-mean components
    (:attr:`~twodg_pyro.guides.SharedGMMGuide.n_pinned`, the last ones) at zero mean
    while the other centres and the outliers train: pruning inside stage 3, as Bayesian
    Compression fine-tunes the network it has pruned.

    With the ``"matched"`` spread the pruned weights keep mean :math:`m_{k,\mu} = 0`
    and their shared scale :math:`\sigma_k` is learnt with the rest (it starts at the
    pruned weights' second moment); with ``"zero"`` the whole component is fixed (the
    weights are removed: a trained :math:`\sigma_{\min}` would only grow).  The pinned
    rows' gradients are multiplied by zero, so Adam (whose moments of those rows stay
    zero) never moves them; the mask is registered again on the new parameters a merge
    creates (checked before each epoch).  The refinement hooks leave the pinned
    components alone too.

    Example::

        structure, report = prune_structure(structure, snr=1.0, spread="matched")
        guide = SharedGMMGuide(model, structure)
        fit(model, guide, loader, epochs=50, callbacks=[PinPruned()])
    """

    def __init__(self):
        self.log: list[dict] = []  # when (epoch) which parameters were pinned, how many rows

    def _pin(self, state) -> None:
        guide = state.guide
        n = getattr(guide, "n_pinned", 0)
        if not n:
            return
        zero = guide.pruning.get("spread") == "zero"
        pinned = []
        for name, p in zip(
            ("centre_mu", "centre_raw", "chol_log_diag", "chol_off"),
            guide.component_parameters() if zero else [guide.centre_mu],
            strict=False,
        ):
            if getattr(p, "_pinned_rows", 0) == n:
                continue
            mask = torch.ones(p.shape[0], *([1] * (p.dim() - 1)), dtype=p.dtype, device=p.device)
            mask[p.shape[0] - n :] = 0
            p.register_hook(lambda g, mask=mask: g * mask)
            p._pinned_rows = n
            pinned.append(name)
        if pinned:
            self.log.append({"epoch": state.epoch, "components": n, "parameters": pinned})

    def on_train_begin(self, state) -> None:
        self._pin(state)

    def on_epoch_begin(self, state) -> None:
        self._pin(state)


class PruneRamp(Callback):
    r"""Pruning inside stage 3 spread over its first :math:`R` epochs (gradual pruning,
    Zhu and Gupta 2018): before epoch :math:`e` (0-based) the share

    .. math:: s_e = 1 - \big(1 - \min(e + 1, R) / R\big)^3

    of the :math:`n_t` inliers whose stage-1 :math:`\mathrm{SNR} < t` (those that
    :func:`~twodg_pyro.sharing.prune_structure` would tie at once), lowest SNR first, is
    tied to the zero component (:func:`~twodg_pyro.sharing.prune.prune_further`), so that
    the rest of the network adapts while the weights go, fast at first and slowly at the
    end; epochs :math:`\ge R` train the network pruned in full.  The guide must start
    pruned with the ``"zero"`` spread and its first share (:meth:`count`); assignments
    change, the components and the optimiser do not.  The epoch says the share; a
    checkpoint keeps the order (:meth:`state_dict`).

    Example::

        ramp = PruneRamp(stage2, snr=5.0, epochs=10)
        structure, _ = prune_structure(stage2, 5.0, "zero", limit=ramp.count(0))
        guide = SharedGMMGuide(model, structure)
        fit(model, guide, loader, epochs=20, callbacks=[ramp, PinPruned()])
    """

    def __init__(self, structure, snr: float, epochs: int):
        if int(epochs) < 1:
            raise ValueError(f"PruneRamp: epochs must be >= 1, got {epochs!r}")
        index = torch.cat([structure.plain_index, structure.ellipse_index])
        self.order = index[lowest_snr_first(structure, snr)]  # flat weight indices
        self.snr, self.epochs = float(snr), int(epochs)
        self.log: list[dict] = []

    def count(self, epoch: int) -> int:
        r"""How many weights are pruned before (0-based) ``epoch``: :math:`\lceil s_e n_t
        \rceil`."""
        share = 1.0 - (1.0 - min(epoch + 1, self.epochs) / self.epochs) ** 3
        return min(len(self.order), math.ceil(share * len(self.order) - 1e-9))

    def state_dict(self) -> dict:
        """The order of the weights (a resumed run's structure no longer holds the stage-1
        points it was read from) and the log."""
        return {"order": self.order.tolist(), "log": list(self.log)}

    def load_state_dict(self, state: dict) -> None:
        self.order = torch.tensor(state["order"], dtype=torch.long)
        self.log = list(state["log"])

    def on_epoch_begin(self, state) -> None:
        guide = state.guide
        require_sharing(guide, type(self).__name__)
        target = self.order[: self.count(state.epoch)]
        now = guide.structure(current_points=True)
        tied = now.plain_index[now.plain_component == now.n_gaussians - 1]
        todo = target[~torch.isin(target, tied)]
        if todo.numel():
            guide.load_structure(prune_further(now, todo), components=False)
            self.log.append({"epoch": state.epoch, "pruned": len(target), "added": len(todo)})


def _n_changed(a, b) -> int:
    def table(s):
        t = torch.full((s.num_weights,), -1, dtype=torch.long)
        t[s.plain_index] = s.plain_component
        t[s.ellipse_index] = -2 - s.ellipse_components[:, 0] if s.n_ellipses else t[s.ellipse_index]
        return t

    return int((table(a) != table(b)).sum())
