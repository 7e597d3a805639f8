r"""The ELBO of Eq. 10, decomposed into named terms.

.. math::
    \mathcal L(q) = \underbrace{\mathbb E_q[\log p(\mathcal D \mid w)]}_{-\text{nll}}
        - \mathrm{KL}_\text{in} - \mathrm{KL}\big(q(w_\text{out}) \,\|\, p(w_\text{out})\big)

The expected log-likelihood is a Monte Carlo estimate whose minibatch terms are
scaled by ``N / B`` through the model's subsampled data plate.  The KL part is
collected site by site:

* the library's guides (:class:`~twodg_pyro.guide.BNNGuide`) supply their own terms
  through :meth:`~twodg_pyro.guide.BNNGuide.site_kl` (``kl``; the shared-GMM guide's
  ``kl_inlier`` and ``kl_outlier``);
* for any other guide (Pyro's autoguides) the closed form
  :math:`\mathrm{KL}(q_s \| p_s)` is used when one is registered, and a one-sample Monte
  Carlo estimate :math:`\log q_s(w_s) - \log p_s(w_s)` when it is not, or when the
  guide's site is a point mass carrying a density (a ``Delta``, as Pyro's autoguides
  emit: their auxiliary sites' :math:`\log q` is added); all under the name ``kl``.

Every term is scaled and masked like its site (``poutine.scale``), e.g. the rank-1
factor sites count :math:`1/M`.  Deterministic sites (``pyro.deterministic``) are skipped.
A latent site whose model and guide weigh it differently (a handler around the model
alone, ``poutine.scale(model, 0.5)``, which tempers the joint density) takes
``Trace_ELBO``'s one-draw term :math:`s_q \log q(w) - s_p \log p(w)` under ``kl``: no KL
weighs the two alike.  A weight site the model observes (``poutine.condition``) while the
guide samples it is left out as ``TraceMeanField_ELBO`` leaves it out (its prior density at
the conditioned value joins ``nll``), with a warning, as Pyro warns.

**Speed.**  :meth:`DecomposedELBO.loss_terms` -- what :func:`~twodg_pyro.infer.fit` and
the distributed loop call -- runs the library's models and guides without their
``pyro.param`` statements and bookkeeping sites
(:func:`~twodg_pyro.pyro_params.local_params`); so does :meth:`~DecomposedELBO.
differentiable_loss` when no Pyro handler is active.  Under ``pyro.infer.SVI`` (whose
parameter capture is a handler) the statements are emitted, so ``SVI`` trains the
parameters.

The library's model with the library's guides goes further: :meth:`DecomposedELBO.
loss_terms` computes the same terms without tracing the programs at all (the fast step,
:mod:`~twodg_pyro.infer.fast_step`: same random numbers, same arithmetic, same loss and
gradients), and traces them for anything the fast step does not cover
(:attr:`DecomposedELBO.fallback_reason`); ``fast_step=False`` always traces.

``beta`` weights the KL terms (KL annealing); ``beta = 1`` is the true bound.
"""

from __future__ import annotations

import warnings
from collections import defaultdict

import pyro.poutine as poutine
import torch
from pyro.infer.elbo import ELBO
from pyro.infer.util import torch_item
from pyro.poutine.util import site_is_subsample

from ..guide import BNNGuide, kl_or_estimate
from ..pyro_params import handlers_active, local_params, params_are_local
from .fast_step import fast_particle_terms, site_priors, unsupported


def _same_weighting(a: dict, b: dict) -> bool:
    """Whether two trace sites carry the same scale and mask (a model site and its guide
    site: both unscaled, or inside the same ``poutine.scale``)."""
    sa, sb = a["scale"], b["scale"]
    if torch.is_tensor(sa) or torch.is_tensor(sb):
        if not (torch.is_tensor(sa) and torch.is_tensor(sb) and sa.shape == sb.shape):
            return False
        if not bool((sa == sb).all()):
            return False
    elif sa != sb:
        return False
    ma, mb = a["mask"], b["mask"]
    return ma is mb or (ma in (None, True) and mb in (None, True))


def _conditioned_warning(names: list[str]) -> str:
    """The warning for weight sites the model observes while the guide samples them."""
    return (
        f"the model observes site(s) {names} that the guide samples (poutine.condition on "
        "a weight?): the model uses the conditioned value and the guide's draw there is "
        "left out of the loss, as in TraceMeanField_ELBO (Trace_ELBO adds its log q; Pyro "
        "warns 'Found non-auxiliary vars in guide but not model'); hide the site from the "
        f"guide (poutine.block(guide, hide={names!r})) to silence this"
    )


def _scale_mask(value: torch.Tensor, site: dict) -> torch.Tensor:
    if site["mask"] is not None and site["mask"] is not True:
        value = value * site["mask"]
    scale = site["scale"]
    if not (isinstance(scale, (int, float)) and scale == 1.0):
        value = value * scale
    return value


class DecomposedELBO(ELBO):
    """Evidence lower bound with its terms reported separately (Eq. 10).

    Usable as a Pyro loss (``SVI(model, guide, optim, DecomposedELBO())``), as a
    module (``DecomposedELBO()(model, guide)``, for torch optimisers and DDP), or
    through :meth:`loss_terms` for the individual terms.

    Args:
        num_particles: Monte Carlo particles per step (averaged).
        beta: weight of the KL terms; 1 gives the true ELBO.
        fast_step: let :meth:`loss_terms` compute the terms without tracing the
            programs where it can (:mod:`~twodg_pyro.infer.fast_step`); ``False``:
            always trace.
        fused_kl: in the fast step, let the guide sum its KL terms over all sites at
            once (the shared-GMM guide with one Normal prior per site): the same terms
            up to float rounding, not bit for bit; ``False`` (default): summed site by
            site as the traced step sums them.

    Attributes:
        step_path: how the latest :meth:`loss_terms` ran: ``"fast"`` or ``"traced"``.
        fallback_reason: why it was traced (``None`` when fast, or ``fast_step=False``).

    Example::

        elbo = DecomposedELBO(beta=0.1)   # nll + 0.1 KL, the KL in closed form where it can
        state = fit(model, guide, loader, epochs=50, elbo=elbo)
        state.history[-1]["kl"], elbo.step_path   # the last epoch's KL; "fast" or "traced"
    """

    def __init__(
        self,
        num_particles: int = 1,
        beta: float = 1.0,
        fast_step: bool = True,
        fused_kl: bool = False,
    ):
        if int(num_particles) < 1:
            raise ValueError(f"num_particles must be at least 1, got {num_particles!r}")
        super().__init__(num_particles=int(num_particles))
        self.beta = float(beta)
        self.fast_step = bool(fast_step)
        self.fused_kl = bool(fused_kl)
        self.step_path: str | None = None
        self.fallback_reason: str | None = None

    def _get_trace(self, model, guide, args, kwargs):
        """One ``(model_trace, guide_trace)`` pair, the model replayed on the guide's draw."""
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
            *args, **kwargs
        )
        return model_trace, guide_trace

    def _particle_terms(self, model, guide, args, kwargs) -> dict[str, torch.Tensor]:
        model_trace, guide_trace = self._get_trace(model, guide, args, kwargs)
        ours = isinstance(guide, BNNGuide)
        terms: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros(()))
        conditioned = []
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            if site["infer"].get("_deterministic"):
                continue
            if site["is_observed"]:
                log_p = site["fn"].log_prob(site["value"])
                terms["nll"] = terms["nll"] - _scale_mask(log_p, site).sum()
                drawn = guide_trace.nodes.get(name)
                if drawn is not None and drawn["type"] == "sample" and not drawn["is_observed"]:
                    conditioned.append(name)
                continue
            guide_site = guide_trace.nodes.get(name)
            if guide_site is None:
                raise ValueError(f"model site {name!r} has no matching site in the guide")
            if not _same_weighting(site, guide_site):
                # a handler around the model alone (poutine.scale(model, s)): Trace_ELBO's
                # s_q log q(w) - s_p log p(w) at the draw (no KL weighs the two alike)
                log_q = guide_site["fn"].log_prob(guide_site["value"])
                log_p = site["fn"].log_prob(site["value"])
                value = _scale_mask(log_q, guide_site).sum() - _scale_mask(log_p, site).sum()
                terms["kl"] = terms["kl"] + value
                continue
            if ours:
                parts = guide.site_kl(name, site["fn"], guide_site["value"], guide_site["fn"])
            else:
                parts = {"kl": kl_or_estimate(guide_site["fn"], site["fn"], guide_site["value"])}
            for key, value in parts.items():
                terms[key] = terms[key] + _scale_mask(value, guide_site)
        if not ours:  # auxiliary guide sites (autoguides): their log q joins the KL
            for name, site in guide_trace.nodes.items():
                if site["type"] == "sample" and name not in model_trace.nodes:
                    if site_is_subsample(site) or site["is_observed"]:
                        continue
                    log_q = site["fn"].log_prob(site["value"])
                    terms["kl"] = terms["kl"] + _scale_mask(log_q, site).sum()
        if conditioned:
            warnings.warn(_conditioned_warning(conditioned), UserWarning, stacklevel=2)
        return dict(terms)

    def loss_terms(self, model, guide, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Differentiable terms averaged over particles: ``nll`` and the KL terms.

        The fast path: the library's programs run without their ``pyro.param``
        statements and bookkeeping sites (:func:`~twodg_pyro.pyro_params.local_params`),
        so the parameters are trained by whatever optimiser holds them (``fit``'s)."""
        with local_params():
            if self.fast_step:
                terms = self._fast_terms(model, guide, args, kwargs)
                if terms is not None:
                    self.step_path, self.fallback_reason = "fast", None
                    return terms
            self.step_path = "traced"
            return self._terms(model, guide, args, kwargs)

    def _fast_terms(self, model, guide, args, kwargs) -> dict[str, torch.Tensor] | None:
        """:meth:`_terms` by the fast step, or ``None`` (with :attr:`fallback_reason`)."""
        cls = type(self)
        if cls._particle_terms is not DecomposedELBO._particle_terms or (
            cls._get_trace is not DecomposedELBO._get_trace
        ):
            self.fallback_reason = f"{cls.__name__} computes its own particle terms"
            return None
        reason = unsupported(model, guide, args, kwargs)
        if reason is not None:
            self.fallback_reason = reason
            return None
        priors = site_priors(model)
        total: dict[str, torch.Tensor] = {}
        for _ in range(self.num_particles):
            terms = fast_particle_terms(model, guide, *args, priors, self.fused_kl)
            if terms is None:
                self.fallback_reason = (
                    f"{type(guide).__name__} has no fast draw for these priors "
                    f"({type(model.prior).__name__})"
                )
                return None
            for key, value in terms.items():
                total[key] = total.get(key, 0.0) + value / self.num_particles
        return total

    def _terms(self, model, guide, args, kwargs) -> dict[str, torch.Tensor]:
        total: dict[str, torch.Tensor] = {}
        for _ in range(self.num_particles):
            for key, value in self._particle_terms(model, guide, args, kwargs).items():
                total[key] = total.get(key, 0.0) + value / self.num_particles
        return total

    def combine(self, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        r"""Negative ELBO: :math:`\text{nll} + \beta \sum \mathrm{KL}`."""
        kl = sum(v for k, v in terms.items() if k != "nll")
        return terms.get("nll", 0.0) + self.beta * kl

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """The negative ELBO (Pyro's ``ELBO`` interface, used by ``SVI``).  The programs'
        ``pyro.param`` statements are emitted when a Pyro handler is active (``SVI``'s
        parameter capture), skipped otherwise (a module loss with a torch optimiser)."""
        with local_params(params_are_local() or not handlers_active()):
            return self.combine(self._terms(model, guide, args, kwargs))

    def loss(self, model, guide, *args, **kwargs) -> float:
        with torch.no_grad():
            return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return torch_item(loss)
