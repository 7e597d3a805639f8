r"""The fast training step: the terms of :class:`~twodg_pyro.infer.DecomposedELBO` for the
library's model and guides without tracing their Pyro programs.

The traced step (:meth:`~twodg_pyro.infer.DecomposedELBO._terms`) runs the guide under
``poutine.trace``, replays the model on its draw under a second trace, and walks the
two traces: per site and step a prior distribution (``Normal`` expanded to the site,
wrapped in ``Independent``), the guide's site distribution, a ``kl_divergence``
dispatch, trace nodes and messenger calls.  The structure never changes between steps,
so the fast step does the same arithmetic directly:

1. the sites' priors, made once per model, prior settings, device and dtype (for the
   priors whose distributions depend on their settings only,
   :attr:`~twodg_pyro.priors.Prior.settled`; any other prior is asked at every step, as
   the program asks it);
2. one draw of every site by the guide's :meth:`~twodg_pyro.guide.FastStepGuide.fast_draw`:
   the values its program would sample, from the same random numbers by the same
   arithmetic (the mean-field guide: :math:`\mu + \epsilon\sigma` of every site, on the
   sites concatenated, with its KL; the shared-GMM guide in every tying: its one flat draw
   of all weights, split into the sites);
3. the network run on them (:meth:`~twodg_pyro.bnn.BNNModel.run_network`) and the
   likelihood's log-density of the minibatch, scaled by :math:`N/B` as the data plate
   scales it;
4. the KL terms by the guide's :meth:`~twodg_pyro.guide.FastStepGuide.fast_kl` (the
   mean-field guide: the Normal-Normal closed form, with the draw's own
   :math:`\sigma`, summed site by site; the shared-GMM guide: its per-site terms of
   Eq. 10).

Same random numbers in the same order, same operations: the fast step's loss and
gradients are those of the traced step (bit for bit on the CPU; the tests compare them).
With ``fused_kl`` the shared-GMM guide sums its KL over all sites in one closed form
(:mod:`~twodg_pyro.guides.fast_shared`), and the mean-field guide draws all sites as one
flat vector with their KL in one autograd node (:mod:`~twodg_pyro.guides.fast_normal`):
the same loss and gradients up to float rounding, not bit for bit, and several times less
KL work (and, for the mean-field guide, fewer operations per site) per step.

**When it applies** (:func:`unsupported`): a :class:`~twodg_pyro.bnn.BNNModel` whose
program and network call are the library's (not the rank-1 model), a ``Categorical``,
``Gaussian`` or ``HeteroscedasticGaussian`` likelihood, targets given, no Pyro handler
active (it would see no sites), and a guide whose
:meth:`~twodg_pyro.guide.FastStepGuide.fast_draw` accepts the priors (the mean-field
guide needs Normal priors; the shared-GMM guide takes any).
Anything else -- Pyro's autoguides, the rank-1, SSVI guides, a Laplace prior under
the mean-field guide, a user's likelihood -- is traced, and
:attr:`~twodg_pyro.infer.DecomposedELBO.fallback_reason` says why.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import pyro.distributions as dist
import torch

from ..bnn import BNNModel
from ..guide import BNNGuide, FastStepGuide
from ..likelihoods import Categorical, Gaussian, HeteroscedasticGaussian
from ..pyro_params import handlers_active

#: likelihoods whose program is ``Likelihood.__call__`` (plus their targets' check)
_LIKELIHOODS = (Categorical, Gaussian, HeteroscedasticGaussian)
#: model -> (key, {site: prior}) of a settled prior
_PRIORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unsupported(model, guide, args: tuple, kwargs: Mapping) -> str | None:
    """Why the fast step cannot stand in for the traced one here (``None``: it can; the
    guide's :meth:`~twodg_pyro.guide.FastStepGuide.fast_draw` may still decline its priors)."""
    if handlers_active():
        return "a Pyro effect handler is active (it must see the programs' sites)"
    if not isinstance(guide, BNNGuide):
        return f"the guide {type(guide).__name__} is not one of the library's guides"
    if not isinstance(guide, FastStepGuide):
        return f"the guide {type(guide).__name__} has no fast step (not a FastStepGuide)"
    if not isinstance(model, BNNModel):
        return f"the model {type(model).__name__} is not a BNNModel"
    cls = type(model)
    for name in ("forward", "network_forward", "run_network"):
        if getattr(cls, name) is not getattr(BNNModel, name):
            return f"the model {cls.__name__} has its own {name}"
    if type(model.likelihood) not in _LIKELIHOODS:
        return f"the likelihood {type(model.likelihood).__name__} is not one of the library's"
    if kwargs or len(args) != 2 or args[1] is None:
        return "the step is not called as (x, y) with targets"
    if [s.name for s in guide.sites] != model.site_names:
        return "the guide's sites are not the model's, in the model's order"
    return None


def _leaf(value):
    """A hashable stand-in for one setting of a prior: tensors by identity and version."""
    if torch.is_tensor(value):
        return ("tensor", id(value), value._version)
    if isinstance(value, Mapping):
        return tuple((k, _leaf(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_leaf(v) for v in value)
    return value if isinstance(value, (int, float, str, bool, type(None))) else ("id", id(value))


def site_priors(model: BNNModel) -> dict[str, dist.Distribution]:
    """Each site's prior as the program asks it (``model.prior(site, parameter)``): made
    once per model, prior object, prior settings, and the sites' devices and dtypes for a
    :attr:`~twodg_pyro.priors.Prior.settled` prior; at every call for any other prior (it
    may change between steps)."""
    prior = model.prior
    params = [model.site_parameter(i) for i in range(len(model.sites))]
    key = None
    if getattr(prior, "settled", False):
        settings = tuple((k, _leaf(v)) for k, v in vars(prior).items() if not k.startswith("_"))
        key = (id(prior), settings, tuple((p.device, p.dtype) for p in params))
        hit = _PRIORS.get(model)
        if hit is not None and hit[0] == key:
            return hit[1]
    priors = {s.name: prior(s, p) for s, p in zip(model.sites, params, strict=True)}
    if key is not None:
        _PRIORS[model] = (key, priors)
    return priors


def fast_particle_terms(
    model: BNNModel,
    guide: BNNGuide,
    x: torch.Tensor,
    y: torch.Tensor,
    priors: Mapping,
    fused_kl: bool = False,
) -> dict[str, torch.Tensor] | None:
    r"""One particle's terms, as :meth:`DecomposedELBO._particle_terms
    <twodg_pyro.infer.DecomposedELBO>` computes them from the traces: the guide's KL
    terms (in site order), then :math:`\text{nll} = -\frac{N}{B}\sum_b \log p(y_b \mid
    f_w(x_b))`.  ``fused_kl``: the guide may sum its KL over the sites at once
    (:meth:`~twodg_pyro.guide.FastStepGuide.fast_kl`).  ``None``: the guide declined (before
    drawing anything)."""
    # asked only when fused: a guide written before the argument still takes plain steps
    values = guide.fast_draw(priors, fused=True) if fused_kl else guide.fast_draw(priors)
    if values is None:
        return None
    output = model.run_network(values, x)
    likelihood = model.likelihood
    likelihood.check_targets(output, y)
    log_p = likelihood.log_prob(output, y)
    # the data plate's scale, as Pyro's subsample messenger forms it
    scale = 1.0 * likelihood.dataset_size / output.shape[0]
    if scale != 1.0:
        log_p = log_p * scale
    terms = dict(guide.fast_kl(priors, values, fused=fused_kl))
    terms["nll"] = torch.zeros(()) - log_p.sum()
    return terms
