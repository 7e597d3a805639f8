r"""A pruned copy of a trained shared-GMM guide, for deployment (see
:mod:`twodg_pyro.sharing.prune` for the rule and its two spreads)."""

from __future__ import annotations

from ..sharing.prune import PruneReport, Spread, prune_structure
from .shared_gmm import SharedGMMGuide


def prune_guide(
    model, guide: SharedGMMGuide, snr: float, spread: Spread = "zero"
) -> tuple[SharedGMMGuide, PruneReport]:
    r"""A new :class:`~twodg_pyro.guides.SharedGMMGuide` for ``model`` in which every
    inlier whose stage-1 point has :math:`|\mu_i| / \sigma_i <` ``snr`` is tied to a
    zero-mean component (:func:`~twodg_pyro.sharing.prune.prune_structure`); the trained
    centres, covariances and outliers are kept, the tying is ``guide``'s.  ``guide`` is
    not changed.

    The pruned guide predicts (and exports with :func:`~twodg_pyro.io.export_compact`);
    with ``spread="zero"`` its KL to the prior is unbounded, so it is not for training.

    Raises:
        TypeError: ``guide`` is not a shared-GMM guide.
        ValueError: as :func:`~twodg_pyro.sharing.prune.prune_structure`.
    """
    if not isinstance(guide, SharedGMMGuide):
        raise TypeError(
            f"prune_guide needs a SharedGMMGuide (a 2DG BNN's), got {type(guide).__name__}"
        )
    structure, report = prune_structure(guide.structure(), snr, spread)
    pruned = SharedGMMGuide(model, structure, tying=guide.tying)
    return pruned, report
