"""The settings of post-hoc Laplace, stated once: the run's ``[laplace]`` table and the
one argument of :func:`~twodg_pyro.methods.laplace_fit.fit_laplace`, checked by the
library's settings rules when built (:mod:`twodg_pyro.settings`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from ..settings import Section, at_least, in_range, positive, require

#: which weights the approximation covers
LaplaceSubset = Literal["last_layer", "all"]
#: the structure of the Hessian (GGN) approximation
LaplaceHessian = Literal["kron", "diag"]
#: the Monte Carlo predictive: linearised (``glm``) or the network with drawn weights
LaplacePredictive = Literal["glm", "nn"]
#: the prior precision fitted by marginal likelihood: one number, or one per tensor
PriorStructure = Literal["scalar", "layerwise"]
#: a distance-aware residual on the last layer's features (``gp``) or none
LaplaceResidual = Literal["none", "gp"]
#: the network the approximation is built around: the deterministic row's, stage 1's
#: posterior means, or the 2DG BNN's
LaplaceNetwork = Literal["deterministic", "mean_field", "2dg"]


@dataclass
class LaplaceConfig(Section):
    r"""Post-hoc Laplace (method ``laplace``; needs ``pip install laplace-torch``) around the
    run's deterministic network (``network = "deterministic"``) or stage 1's posterior
    means (``"mean_field"``: the network at the mean-field guide's :math:`\mu`, e.g. the
    natural-gradient recipe's, whose mean predicts better than the deterministic
    network) or the 2DG BNN's (``"2dg"``: its component centres and outlier means, the
    guide's ``mean_weights()``; the run's ``2dg`` row trains it): over the
    ``last_layer`` or ``all`` weights with a ``kron`` or ``diag`` GGN, the prior
    precision (``scalar`` or, with ``subset = "all"``, ``layerwise``) fitted by
    ``marglik_steps`` steps on the marginal likelihood;
    predicted by ``num_samples`` seeded draws of the linearised (``glm``) or the plain
    (``nn``) network (:mod:`twodg_pyro.methods.laplace`); the curvature is summed over
    the training set in batches of ``batch_size``. ``residual = "gp"`` adds to the last
    layer the distance-aware residual of
    :mod:`~twodg_pyro.methods.feature_residual` (a Gaussian process on the last layer's
    input features, conditioned on the training set's), whose variance grows to the
    prior's away from the training features; ``residual_centres = M > 0`` conditions it on
    the :math:`M` k-means centres of those features instead (a file stores :math:`M`
    features, not the training set's) and ``residual_floor_quantile = q`` floors its
    variance at its training features' :math:`q`-quantile.

    Example::

        settings = LaplaceConfig(subset="all", hessian="diag", prior_structure="layerwise")
        post = fit_laplace(net, loader, settings)
        LaplaceConfig(subset="middle")  # ConfigError: laplace.subset = 'middle': ...
    """

    section: ClassVar[str] = "laplace"
    network: LaplaceNetwork = "deterministic"
    subset: LaplaceSubset = "last_layer"
    hessian: LaplaceHessian = "kron"
    pred_type: LaplacePredictive = "glm"
    prior_structure: PriorStructure = "scalar"
    marglik_steps: Annotated[int, at_least(0)] = 100
    marglik_lr: Annotated[float, positive()] = 0.1
    #: examples per batch of the curvature pass (with ``subset = "all"``, ``hessian =
    #: "diag"`` laplace-torch forms each batch's Jacobian, batch x classes x weights)
    batch_size: Annotated[int, at_least(1)] = 32
    residual: LaplaceResidual = "none"
    #: ``residual = "gp"``: condition on every training feature (0) or on this many
    #: k-means centres of them
    residual_centres: Annotated[int, at_least(0)] = 0
    #: the residual's variance floored at this quantile of its value over the training
    #: features (0: no floor)
    residual_floor_quantile: Annotated[float, in_range(0, 1, (True, False))] = 0.0

    def _check(self) -> None:
        require(
            not (self.subset == "last_layer" and self.prior_structure == "layerwise"),
            "laplace.prior_structure",
            self.prior_structure,
            "laplace-torch fits a scalar prior precision for subset = 'last_layer'; use "
            "'scalar' (or subset = 'all')",
        )
        require(
            not (self.residual == "gp" and self.subset != "last_layer"),
            "laplace.residual",
            self.residual,
            "the feature residual lives on the last layer's inputs: use subset = 'last_layer'",
        )
