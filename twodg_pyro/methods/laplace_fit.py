"""Fitting a :class:`~twodg_pyro.methods.laplace.LaplacePosterior` with laplace-torch
(the optional dependency ``pip install laplace-torch``, imported when a fit runs): see
:mod:`twodg_pyro.methods.laplace` for the approximation and its predictive."""

from __future__ import annotations

import copy
import warnings
from dataclasses import replace

import torch
from torch import nn

from ..bnn import match_input
from .feature_residual import FeatureResidual, last_layer_module, layer_inputs
from .laplace import LaplacePosterior
from .laplace_settings import LaplaceConfig


class MissingLaplaceError(ImportError, ValueError):
    """laplace-torch is not installed (a user error: the message says how to install it)."""


def require_laplace():
    """The ``laplace`` module of laplace-torch, imported now.

    Raises:
        MissingLaplaceError: it is not installed (the message names ``pip install
            laplace-torch``).
    """
    try:
        with warnings.catch_warnings():  # its dependencies' deprecation notes at import
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            import laplace
    except ImportError as e:
        raise MissingLaplaceError(
            f"the Laplace baseline needs the laplace-torch package, which is not installed "
            f"({e}): pip install laplace-torch (or pip install -e '.[laplace]')"
        ) from e
    return laplace


class _CastLoader:
    """A loader whose floating inputs are cast to the network's dtype (laplace-torch
    moves them to its device only); ``dataset`` is kept (laplace-torch reads N)."""

    def __init__(self, loader, like: torch.Tensor):
        self.loader, self.like = loader, like
        self.dataset = loader.dataset

    def __iter__(self):
        for x, y in self.loader:
            yield match_input(x, self.like), y.to(self.like.device)

    def __len__(self):
        return len(self.loader)


def fit_laplace(
    net: nn.Module,
    train_loader,
    settings: LaplaceConfig | None = None,
    *,
    progress: bool = False,
    **fields,
) -> LaplacePosterior:
    """Fit a Laplace approximation around the trained ``net`` with laplace-torch.

    Args:
        net: the trained (MAP) network; it is not changed (laplace-torch works on a copy).
        train_loader: the training data (a ``DataLoader``: laplace-torch reads
            ``len(train_loader.dataset)``).  With ``subset="all", hessian="diag"``
            laplace-torch forms each batch's Jacobian (batch x classes x weights): keep
            its batches small (32 for LeNet-5: about 1 GB; 256 needs far more).
        settings: the :class:`~twodg_pyro.methods.laplace_settings.LaplaceConfig`
            (default: its defaults: the last layer, a Kronecker-factored GGN, a scalar
            prior precision by 100 marginal-likelihood steps, the ``glm`` predictive);
            ``fields`` replace some of them (``subset="all"``), checked by the same rules.
        progress: laplace-torch's progress bars.

    Raises:
        ConfigError: unknown settings (named).
        ValueError: an approximation laplace-torch cannot fit on this network.
        MissingLaplaceError: laplace-torch is not installed.
    """
    cfg = replace(settings or LaplaceConfig(), **fields)
    subset, hessian, pred_type = cfg.subset, cfg.hessian, cfg.pred_type
    laplace = require_laplace()
    work = copy.deepcopy(net).eval()
    like = next(work.parameters())
    if subset == "all" and hessian == "kron":
        _fix_unfactored(work)
    la = laplace.Laplace(
        work, "classification", subset_of_weights=subset, hessian_structure=hessian
    )
    with warnings.catch_warnings():
        # laplace-torch's notes that do not apply: its curvature backend's use of
        # torch.jit.script, and "By default `link_approx` is `probit`" (we sample)
        warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*link_approx.*")
        try:
            la.fit(_CastLoader(train_loader, like), progress_bar=progress)
        except NotImplementedError as e:  # e.g. KFAC over a BatchNorm layer
            raise ValueError(
                f"laplace-torch cannot fit subset = {subset!r}, hessian = {hessian!r} on "
                f"{type(net).__name__}: {e or type(e).__name__} (its Kronecker factors "
                "cover Linear and Conv2d layers only: use hessian = 'diag' or subset = "
                "'last_layer')"
            ) from e
        la.optimize_prior_precision(
            method="marglik",
            pred_type=pred_type,
            prior_structure=cfg.prior_structure,
            n_steps=cfg.marglik_steps,
            lr=float(cfg.marglik_lr),
            progress_bar=progress,
        )
    post = from_laplace(la, net, subset, hessian, pred_type)
    if cfg.residual == "gp":
        centres, q = cfg.residual_centres, cfg.residual_floor_quantile
        return with_feature_residual(post, train_loader, centres, floor_quantile=q)
    return post


def with_feature_residual(
    post: LaplacePosterior,
    train_loader,
    centres: int = 0,
    seed: int = 0,
    floor_quantile: float = 0.0,
) -> LaplacePosterior:
    """A copy of the last-layer ``post`` with the distance-aware residual
    (:class:`~twodg_pyro.methods.feature_residual.FeatureResidual`) of the last layer's
    inputs on the training data (``train_loader``) and of ``post``'s prior precision,
    conditioned on every training feature (``centres = 0``) or on that many k-means
    centres of them (seeded by ``seed``), its variance floored at the training features'
    ``floor_quantile`` (:meth:`FeatureResidual.fit
    <twodg_pyro.methods.feature_residual.FeatureResidual.fit>`).

    Raises:
        ValueError: ``post`` is not a last-layer approximation.
    """
    if post.subset != "last_layer":
        raise ValueError(f"a feature residual needs subset = 'last_layer', not {post.subset!r}")
    net, was = post.net, post.net.training
    phi = layer_inputs(net.eval(), last_layer_module(net, post.param_names), train_loader)
    net.train(was)
    prior = float(post.prior_precision[0])
    residual = FeatureResidual.fit(phi, prior, seed, centres, floor_quantile)
    return post.rebuilt(residual=residual)


def _fix_unfactored(net: nn.Module) -> None:
    """Keep at their trained values the parameters that Kronecker factors cannot cover:
    those of layers other than ``Linear`` and ``Conv2d`` (BatchNorm's affine ones), as
    laplace-torch leaves out parameters that do not require gradients."""
    for module in net.modules():
        if not isinstance(module, nn.Linear | nn.Conv2d):
            for p in module.parameters(recurse=False):
                p.requires_grad_(False)


def from_laplace(la, net: nn.Module, subset: str, hessian: str, pred_type: str = "glm"):
    """The :class:`LaplacePosterior` of a fitted laplace-torch object over ``net``.

    Raises:
        ValueError: its mean is not ``net``'s parameters (another network).
    """
    if subset == "last_layer":
        last = la.model._last_layer_name
        names = [f"{last}.{n}" for n, _ in la.model.last_layer.named_parameters()]
    else:
        names = [n for n, p in la.model.named_parameters() if p.requires_grad]
    factors = (
        [[f.detach() for f in block] for block in la.H_facs.kfacs]
        if hessian == "kron"
        else la.H.detach()
    )
    post = LaplacePosterior(
        net,
        subset=subset,
        hessian=hessian,
        param_names=names,
        factors=factors,
        prior_precision=la.prior_precision.detach(),
        h_factor=float(la._H_factor),
        pred_type=pred_type,
    )
    if not torch.equal(post.mean(), la.mean.detach().to(post.mean().dtype)):
        raise ValueError("the Laplace approximation's mean is not the network's parameters")
    return post
