"""twodg_pyro: stochastic weight-sharing Bayesian neural networks in Pyro.

``import twodg_pyro as tp`` gives the working surface, three swappable parts around any
``torch.nn.Module`` and a short fit / predict loop:

* the model :class:`BNNModel` ``p(w) p(y | f_w(x))``, its priors (:class:`NormalPrior`,
  :class:`LaplacePrior`, :class:`CauchyPrior`, :class:`RegularizedHorseshoePrior`,
  :class:`LayerwiseNormalPrior`) and likelihoods (:class:`Categorical`; for regression
  :class:`Gaussian`, fixed or learnt noise, and :class:`HeteroscedasticGaussian`);
* the guides :class:`MeanFieldGuide` and :class:`SharedGMMGuide` (the 2DG posterior:
  outliers with their own Normal, inliers drawn from a 2-D Gaussian mixture);
* :func:`fit` (SVI on the :class:`DecomposedELBO`), :func:`predict` (class probabilities,
  or a regression's predictive mean and epistemic / aleatoric standard deviations),
  :func:`evaluate` (accuracy, NLL, ECE, Brier; or RMSE, Gaussian NLL, interval coverage);
* the 2DG method's stage 2, :func:`build_sharing` with its :class:`SharingConfig`, and
  its refinement hooks :class:`MergeHook` / :class:`MahalanobisHook`;
* :func:`save_model` / :func:`load_model`, and the bundled data
  (:func:`load_digits_split`, :func:`make_loader`).

The names load on first use (PEP 562), so that ``import twodg_pyro.models`` or the
command line does not pay for the whole library; everything else lives in the
sub-packages (``twodg_pyro.guides``, ``twodg_pyro.sharing``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names
from ._version import __version__ as __version__

#: exported name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "BNNModel": "twodg_pyro.bnn",
    "NormalPrior": "twodg_pyro.priors.iid",
    "LaplacePrior": "twodg_pyro.priors.iid",
    "CauchyPrior": "twodg_pyro.priors.iid",
    "RegularizedHorseshoePrior": "twodg_pyro.priors.horseshoe",
    "LayerwiseNormalPrior": "twodg_pyro.priors.iid",
    "Categorical": "twodg_pyro.likelihoods",
    "Gaussian": "twodg_pyro.likelihoods",
    "HeteroscedasticGaussian": "twodg_pyro.likelihoods",
    "MeanFieldGuide": "twodg_pyro.guides.mean_field",
    "SharedGMMGuide": "twodg_pyro.guides.shared_gmm",
    "DecomposedELBO": "twodg_pyro.infer.elbo",
    "fit": "twodg_pyro.infer.trainer",
    "predict": "twodg_pyro.prediction",
    "evaluate": "twodg_pyro.evaluation",
    "build_sharing": "twodg_pyro.sharing.build",
    "SharingConfig": "twodg_pyro.sharing.config",
    "MergeHook": "twodg_pyro.sharing.hooks",
    "MahalanobisHook": "twodg_pyro.sharing.hooks",
    "save_model": "twodg_pyro.io.model_file",
    "load_model": "twodg_pyro.io.model_file",
    "load_digits_split": "twodg_pyro.data.digits",
    "make_loader": "twodg_pyro.data",
}

#: every public name, in alphabetical order
__all__ = sorted(_EXPORTS)

# for type checkers and IDEs (``import X as X``: a re-export); at run time the names load lazily
if TYPE_CHECKING:
    from .bnn import BNNModel as BNNModel
    from .data import make_loader as make_loader
    from .data.digits import load_digits_split as load_digits_split
    from .evaluation import evaluate as evaluate
    from .guides.mean_field import MeanFieldGuide as MeanFieldGuide
    from .guides.shared_gmm import SharedGMMGuide as SharedGMMGuide
    from .infer.elbo import DecomposedELBO as DecomposedELBO
    from .infer.trainer import fit as fit
    from .io.model_file import load_model as load_model
    from .io.model_file import save_model as save_model
    from .likelihoods import Categorical as Categorical
    from .likelihoods import Gaussian as Gaussian
    from .likelihoods import HeteroscedasticGaussian as HeteroscedasticGaussian
    from .prediction import predict as predict
    from .priors import CauchyPrior as CauchyPrior
    from .priors import LaplacePrior as LaplacePrior
    from .priors import LayerwiseNormalPrior as LayerwiseNormalPrior
    from .priors import NormalPrior as NormalPrior
    from .priors import RegularizedHorseshoePrior as RegularizedHorseshoePrior
    from .sharing.build import build_sharing as build_sharing
    from .sharing.config import SharingConfig as SharingConfig
    from .sharing.hooks import MahalanobisHook as MahalanobisHook
    from .sharing.hooks import MergeHook as MergeHook


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
