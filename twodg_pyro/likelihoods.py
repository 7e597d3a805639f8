r"""Likelihoods :math:`p(y \mid f_w(x))` with data-set-size subsampling.

Each likelihood observes a minibatch inside ``pyro.plate("data", N)`` so that the
log-likelihood of a batch of size ``B`` is scaled by ``N / B``: the ELBO then
estimates :math:`\mathbb E_q[\log p(\mathcal D \mid w)]` for the whole data set.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import nn

from .metrics import check_labels
from .priors.base import public_settings, register_class

__all__ = [
    "LIKELIHOODS",
    "Likelihood",
    "Categorical",
    "Gaussian",
    "HeteroscedasticGaussian",
    "RegressionLikelihood",
]

#: every likelihood class with a ``kind``: its name in model files -> class
LIKELIHOODS: dict[str, type[Likelihood]] = {}


class Likelihood(nn.Module, ABC):
    """Observation model for the network's output.

    A ``torch.nn.Module``: a likelihood with learnt parameters (a :class:`Gaussian`'s
    learnt noise) holds them as its own, so they move and cast with the model (its
    submodule ``likelihood``), train with the guide (the model's deterministic
    parameters) and are ``pyro.param`` statements of the model's program.

    **Files.**  As a :class:`~twodg_pyro.priors.Prior` does, a subclass with a ``kind``
    of its own registers itself in :data:`LIKELIHOODS`; :meth:`to_spec` and
    :meth:`from_spec` store its public attributes (JSON scalars, the constructor's
    keyword arguments) unless it overrides them.

    Args:
        dataset_size: ``N``, the number of training examples (the plate size).
    """

    site_name = "obs"
    #: its name in model files; ``None``: not registered (its file is refused on loading)
    kind: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = cls.__dict__.get("kind")
        if cls.kind is not None:
            register_class(LIKELIHOODS, cls.kind, cls, "likelihood kind")

    def __init__(self, dataset_size: int):
        super().__init__()
        if int(dataset_size) < 1:
            raise ValueError(f"dataset_size must be at least 1, got {dataset_size!r}")
        self.dataset_size = int(dataset_size)

    @abstractmethod
    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        """Distribution of the targets given the network ``output`` (batch first)."""

    def log_prob(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(y_b \mid f_w(x_b))` of each example: ``distribution(output)``'s
        ``log_prob(y)`` (a subclass may compute the same numbers without building the
        distribution, as :class:`Categorical` does)."""
        return self.distribution(output).log_prob(y)

    def batched_distribution(self, output: torch.Tensor, particle_dims: int) -> dist.Distribution:
        """The distribution for ``output`` with ``particle_dims`` leading particle
        dimensions (``(*particles, B, ...)``); the default suits any likelihood whose event
        is read from the rightmost dimensions (e.g. :class:`Categorical`)."""
        return self.distribution(output)

    def check_targets(self, output: torch.Tensor, y: torch.Tensor, particle_dims: int = 0) -> None:
        """Raise ``ValueError`` naming what is wrong with targets ``y`` for ``output`` (with
        ``particle_dims`` leading particle dimensions); the default accepts any."""

    def __call__(
        self,
        output: torch.Tensor,
        y: torch.Tensor | None = None,
        particle_dims: int = 0,
        outputs_site: str | None = None,
    ) -> torch.Tensor:
        """Observe ``y`` (or sample it when ``None``) for a minibatch of ``output``;
        ``output`` may have ``particle_dims`` leading particle dimensions.  With
        ``outputs_site``, ``output`` is also recorded as a deterministic site of that name
        in the data plate (one event per example).  ``y`` is checked first
        (:meth:`check_targets`)."""
        if y is not None:
            self.check_targets(output, y, particle_dims)
        batch = output.shape[particle_dims]
        # The DataLoader already drew the minibatch: the plate only needs the ratio N/B.
        subsample = torch.arange(batch, device=output.device)
        d = self.batched_distribution(output, particle_dims)
        with pyro.plate("data", size=self.dataset_size, subsample=subsample):
            if outputs_site is not None:
                pyro.deterministic(outputs_site, output, event_dim=output.dim() - particle_dims - 1)
            return pyro.sample(self.site_name, d, obs=y)

    def to_spec(self) -> dict:
        """The JSON spec ``{"kind": kind (else the class name), **public attributes}``.

        Raises:
            TypeError: an attribute that is not a JSON scalar.
        """
        settings = public_settings(self)
        if settings is None:
            raise TypeError(f"{self!r} has settings that are not JSON scalars: define to_spec")
        settings.pop("training", None)  # nn.Module's mode, not a setting
        return {"kind": self.kind or type(self).__name__, **settings}

    @classmethod
    def from_spec(cls, spec: dict) -> Likelihood:
        """The likelihood of :meth:`to_spec`'s ``spec``: ``cls(**settings)``.

        Raises:
            ValueError: ``spec`` is not what it writes (a setting missing).
        """
        lik = cls(**{k: v for k, v in spec.items() if k != "kind"})
        if lik.to_spec() != {**spec, "kind": cls.kind}:
            raise ValueError(f"{spec!r:.100} is not what a {cls.__name__} writes")
        return lik

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dataset_size={self.dataset_size})"


class Categorical(Likelihood):
    r"""Classification: :math:`y \sim \mathrm{Categorical}(\mathrm{softmax}(f_w(x)))`.

    Example::

        model = BNNModel(net, likelihood=Categorical(len(train_set)))  # N scales the batch
        model = BNNModel(net, likelihood=len(train_set))               # the same, for short
    """

    kind = "Categorical"

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        return dist.Categorical(logits=output, validate_args=False)

    def log_prob(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The log-softmax of ``output`` at the labels ``y``: the operations of torch's
        ``Categorical(logits=output).log_prob(y)`` (bit for bit), without building the
        distribution (0.04 ms of a LeNet-5 step, docs/uncertainty.md)."""
        logits = output - output.logsumexp(dim=-1, keepdim=True)
        labels, logits = torch.broadcast_tensors(y.long().unsqueeze(-1), logits)
        return logits.gather(-1, labels[..., :1]).squeeze(-1)

    def check_targets(self, output: torch.Tensor, y: torch.Tensor, particle_dims: int = 0) -> None:
        """Raise ``ValueError`` naming the first bad label: not an integer or a class outside
        ``[0, C)`` for ``C`` outputs (:func:`~twodg_pyro.metrics.check_labels`), or a shape
        that does not match the outputs (with ``particle_dims`` leading particle dimensions,
        the labels may leave them out)."""
        check_labels(y, output.shape[-1])
        expected = tuple(output.shape[:-1])
        if tuple(y.shape) not in (expected, expected[particle_dims:]):
            raise ValueError(
                f"labels of shape {tuple(y.shape)} do not match network outputs of shape "
                f"{tuple(output.shape)} (expected labels of shape {expected[particle_dims:]})"
            )


class RegressionLikelihood(Likelihood):
    r"""Regression: :math:`y \sim \mathcal N(\mu(f_w(x)), \sigma(f_w(x))^2)`, one Normal per
    target, whose location and scale a subclass reads from the network's output
    (:meth:`loc_scale`).

    Targets of shape ``(B,)`` pair with locations of shape ``(B,)`` (a network output of
    ``(B, 1)`` is squeezed); multi-output targets ``(B, D)`` are one event of dimension
    ``D``.  :func:`~twodg_pyro.prediction.predict` averages over the draws with the law of
    total variance, :math:`\mathrm{Var}[y] = \mathrm{Var}_w[\mu] + \mathbb E_w[\sigma^2]`
    (epistemic and aleatoric parts).
    """

    @abstractmethod
    def loc_scale(
        self, output: torch.Tensor, particle_dims: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc, scale)`` of the targets for ``output`` with ``particle_dims`` leading
        particle dimensions; ``scale`` broadcasts against ``loc``."""

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        return self.batched_distribution(output, 0)

    def batched_distribution(self, output: torch.Tensor, particle_dims: int) -> dist.Distribution:
        loc, scale = self.loc_scale(output, particle_dims)
        d = dist.Normal(loc, scale, validate_args=False)
        core = loc.dim() - particle_dims
        return d.to_event(core - 1) if core > 1 else d

    def check_targets(self, output: torch.Tensor, y: torch.Tensor, particle_dims: int = 0) -> None:
        """Targets must be floating point and of the locations' shape (the particle
        dimensions may be left out)."""
        if not y.is_floating_point():
            raise ValueError(f"regression targets must be floating point, got dtype {y.dtype}")
        expected = tuple(self.loc_scale(output, particle_dims)[0].shape)
        if tuple(y.shape) not in (expected, expected[particle_dims:]):
            raise ValueError(
                f"targets of shape {tuple(y.shape)} do not match the {type(self).__name__} "
                f"locations of shape {expected[particle_dims:]} (network outputs of shape "
                f"{tuple(output.shape)})"
            )


def _squeezed(t: torch.Tensor, particle_dims: int) -> torch.Tensor:
    """``t`` without its last dimension when one particle's value is ``(B, 1)``."""
    return t.squeeze(-1) if t.dim() - particle_dims == 2 and t.shape[-1] == 1 else t


class Gaussian(RegressionLikelihood):
    r"""Regression with a homoscedastic noise: :math:`y \sim \mathcal N(f_w(x), \sigma^2)`.

    **Fixed or learnt.**  By default :math:`\sigma` is the fixed ``scale``.  With
    ``learn_scale=True`` it is a point estimate, :math:`\sigma = e^{\rho}` with the
    parameter ``log_scale`` :math:`= \rho` (initialised at ``log(scale)``), trained with
    the guide on the same ELBO (type-II maximum likelihood: the ELBO's expected
    log-likelihood is its only term in :math:`\sigma`).  A point estimate, not a latent
    site with a prior: one scalar fitted to all :math:`N` targets has a posterior about
    :math:`\sigma / \sqrt{2N}` wide, far narrower than the predictive spread, and every
    guide (mean-field, 2DG, rank-1, SSVI, Pyro's autoguides) and :func:`~twodg_pyro.fit`,
    stock ``SVI`` (it is a ``pyro.param`` of the model, ``"BNNModel.likelihood.log_scale"``)
    and NUTS (which holds it fixed) take it unchanged.  A model file stores its value.

    Example::

        lik = Gaussian(len(train_set), scale=1.0, learn_scale=True)
        model = BNNModel(MLP(10, (50,), 1), prior=NormalPrior(1.0), likelihood=lik)
        fit(model, MeanFieldGuide(model), loader, epochs=300)
        print(lik.scale)  # the learnt sigma

    Args:
        dataset_size: ``N``.
        scale: :math:`\sigma` (fixed), or its initial value (learnt); positive.
        learn_scale: learn :math:`\sigma` with the guide.
    """

    kind = "Gaussian"

    def __init__(self, dataset_size: int, scale: float = 1.0, learn_scale: bool = False):
        super().__init__(dataset_size)
        scale = float(scale)
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"Gaussian likelihood scale must be positive, got {scale!r}")
        self.learn_scale = bool(learn_scale)
        if self.learn_scale:
            self.log_scale = nn.Parameter(torch.tensor(math.log(scale)))
        else:
            self._scale = scale

    @property
    def scale(self) -> float:
        r""":math:`\sigma` as a number (its current value when learnt)."""
        return float(self.log_scale.detach().exp()) if self.learn_scale else self._scale

    def noise_scale(self) -> torch.Tensor | float:
        r""":math:`\sigma` as the likelihood uses it: the fixed float, or :math:`e^{\rho}` (a
        0-d tensor, differentiable) when learnt."""
        return self.log_scale.exp() if self.learn_scale else self._scale

    def loc_scale(self, output: torch.Tensor, particle_dims: int = 0):
        return _squeezed(output, particle_dims), self.noise_scale()

    def to_spec(self) -> dict:
        r"""``{"kind", "dataset_size", "scale"}``; a learnt scale adds ``"learn_scale":
        true`` and ``"log_scale"`` (:math:`\rho` exactly: it reloads bit for bit)."""
        spec = {"kind": self.kind, "dataset_size": self.dataset_size}
        if not self.learn_scale:
            return {**spec, "scale": self.scale}
        rho = float(self.log_scale.detach())
        return {**spec, "scale": math.exp(rho), "learn_scale": True, "log_scale": rho}

    @classmethod
    def from_spec(cls, spec: dict) -> Gaussian:
        """The likelihood of :meth:`to_spec`'s ``spec``.

        Raises:
            ValueError: ``spec`` is not what it writes.
        """
        if not spec.get("learn_scale"):
            return super().from_spec(spec)
        rho = spec.get("log_scale")
        if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho):
            raise ValueError(f"{spec!r:.100}: a learnt Gaussian scale needs a finite log_scale")
        lik = cls(spec["dataset_size"], learn_scale=True)
        # float64 holds the stored value exactly; the model casts it to the network's dtype
        lik.log_scale = nn.Parameter(torch.tensor(float(rho), dtype=torch.float64))
        return lik

    def __repr__(self) -> str:
        learnt = ", learn_scale=True" if self.learn_scale else ""
        return f"Gaussian(dataset_size={self.dataset_size}, scale={self.scale:.4g}{learnt})"


class HeteroscedasticGaussian(RegressionLikelihood):
    r"""Regression with an input-dependent noise: the network predicts both,
    :math:`y \sim \mathcal N(\mu_w(x), \sigma_w(x)^2)` with
    :math:`(\mu_w(x), r_w(x)) = f_w(x)` and :math:`\sigma_w(x) = \operatorname{softplus}(r_w(x))
    + \sigma_{\min}`.

    The network's last dimension holds ``2 D`` values: the ``D`` locations, then the ``D``
    raw scales (``D = 1``: an output of shape ``(B, 2)`` for targets ``(B,)``).

    Example::

        model = BNNModel(MLP(1, (50,), 2), likelihood=HeteroscedasticGaussian(len(x)))

    Args:
        dataset_size: ``N``.
        min_scale: :math:`\sigma_{\min} \ge 0`, a floor that keeps the density finite.

    Raises:
        ValueError: (when called) an output whose last dimension is odd.
    """

    kind = "HeteroscedasticGaussian"

    def __init__(self, dataset_size: int, min_scale: float = 1e-6):
        super().__init__(dataset_size)
        min_scale = float(min_scale)
        if not math.isfinite(min_scale) or min_scale < 0:
            raise ValueError(f"min_scale must be a finite number >= 0, got {min_scale!r}")
        self.min_scale = min_scale

    def loc_scale(self, output: torch.Tensor, particle_dims: int = 0):
        if output.dim() - particle_dims < 2 or output.shape[-1] % 2:
            raise ValueError(
                f"HeteroscedasticGaussian needs an even number of outputs per example (the "
                f"locations, then the raw scales), got network outputs of shape "
                f"{tuple(output.shape)}"
            )
        loc, raw = output.chunk(2, dim=-1)
        scale = F.softplus(raw) + self.min_scale
        return _squeezed(loc, particle_dims), _squeezed(scale, particle_dims)
