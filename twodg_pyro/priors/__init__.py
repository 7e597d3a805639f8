r"""Priors over the Bayesian parameter tensors.

A prior maps each :class:`~twodg_pyro.nn.BayesianSite` to a Pyro distribution whose
``batch_shape`` is the site's shape (one independent scalar prior per weight); the
model program wraps it with ``to_event`` to make it one sample site per tensor.
Swapping the prior is one argument::

    BNNModel(net, prior=LaplacePrior(scale=0.1))
    BNNModel(net, prior=RegularizedHorseshoePrior(global_scale=0.1, slab_scale=2.0))
    BNNModel(net, prior=LayerwiseNormalPrior(gain=1.0))
    BNNModel(net, prior=lambda site: dist.StudentT(3.0, 0.0, 0.1))
    BNNModel(net, prior=PretrainedPrior.from_network(net, scale=0.03))

Any ``pyro.distributions`` distribution with scalar events can be used: a prior
with a registered KL against the guide (Normal) gives an analytic KL in the ELBO,
any other a Monte Carlo estimate.

**Device and dtype.**  A prior follows the network: the model calls
``prior(site, like=parameter)`` with the site's network parameter, and
:meth:`Prior.__call__` returns the distribution with every tensor parameter on
``like``'s device and, if floating, in ``like``'s dtype (:func:`distribution_to`), so a
network moved to CUDA or cast to float64 gets its prior there without further code.
A prior's numbers made with :meth:`Prior.constant` (the library's priors) are created
there directly, once per device and dtype; tensors made elsewhere (a user's
distribution, stored tensors) are copied once per source tensor, device and dtype
(weakly cached).  So no prior costs a host-to-device copy per step.  Without ``like``
the prior is on the CPU in torch's default dtype.

**Files and settings.**  A prior describes itself (:class:`Prior`): its ``kind`` names
it in model files, :meth:`Prior.to_spec` / :meth:`Prior.from_spec` write and read it,
and defining a subclass with a ``kind`` registers it (:data:`PRIORS`), so a new prior is
one class, in any file, that a model file stores and loads like the library's::

    class StudentTPrior(Prior):
        kind = "student_t"
        settled = True  # its distribution depends on df and scale only

        def __init__(self, df: float = 3.0, scale: float = 0.1):
            self.df, self.scale = float(df), float(scale)

        def site_distribution(self, site):
            return dist.StudentT(*map(self.constant, (self.df, 0.0, self.scale)))

A run's ``prior.kind`` names a registered prior too (:func:`prior_class`): the
library's ``normal``, ``laplace``, ``layerwise``, ``horseshoe`` (the regularised
horseshoe), ``pretrained``, ``empirical_bayes`` (learnt by stage 1 from the curvature of
the pretrained network), or a user's class, built by its :meth:`Prior.from_settings`.
"""

from .base import PRIORS, Prior, distribution_to, prior_class
from .horseshoe import RegularizedHorseshoe, RegularizedHorseshoePrior
from .iid import CauchyPrior, LaplacePrior, LayerwiseNormalPrior, NormalPrior
from .per_site import PerSiteNormalPrior
from .pretrained import PretrainedPrior
from .site import SitePrior, as_prior

__all__ = [
    "Prior",
    "NormalPrior",
    "LaplacePrior",
    "CauchyPrior",
    "RegularizedHorseshoePrior",
    "RegularizedHorseshoe",
    "LayerwiseNormalPrior",
    "PretrainedPrior",
    "PerSiteNormalPrior",
    "SitePrior",
    "as_prior",
    "distribution_to",
    "prior_class",
    "PRIORS",
]
