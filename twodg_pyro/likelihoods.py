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

from .metrics import check_labels as check_class_labels
from .priors.base import public_settings, register_class

__all__ = ["LIKELIHOODS", "Likelihood", "Categorical", "Gaussian"]

#: every likelihood class with a ``kind``: its name in model files -> class
LIKELIHOODS: dict[str, type[Likelihood]] = {}


class Likelihood(ABC):
    """Observation model for the network's output.

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
        if int(dataset_size) < 1:
            raise ValueError(f"dataset_size must be at least 1, got {dataset_size!r}")
        self.dataset_size = int(dataset_size)

    @abstractmethod
    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        """Distribution of the targets given the network ``output`` (batch first)."""

    def batched_distribution(self, output: torch.Tensor, particle_dims: int) -> dist.Distribution:
        """The distribution for ``output`` with ``particle_dims`` leading particle
        dimensions (``(*particles, B, ...)``); the default suits any likelihood whose event
        is read from the rightmost dimensions (e.g. :class:`Categorical`)."""
        return self.distribution(output)

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
        in the data plate (one event per example)."""
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


def check_labels(output: torch.Tensor, y: torch.Tensor, particle_dims: int = 0) -> None:
    """Raise ``ValueError`` naming the first bad label: not an integer or a class outside
    ``[0, C)`` for ``C`` outputs (:func:`~twodg_pyro.metrics.check_labels`), or a shape
    that does not match the outputs (with ``particle_dims`` leading particle dimensions,
    the labels may leave them out)."""
    check_class_labels(y, output.shape[-1])
    expected = tuple(output.shape[:-1])
    if tuple(y.shape) != expected and tuple(y.shape) != expected[particle_dims:]:
        raise ValueError(
            f"labels of shape {tuple(y.shape)} do not match network outputs of shape "
            f"{tuple(output.shape)} (expected labels of shape {expected[particle_dims:]})"
        )


class Categorical(Likelihood):
    r"""Classification: :math:`y \sim \mathrm{Categorical}(\mathrm{softmax}(f_w(x)))`.

    Example::

        model = BNNModel(net, likelihood=Categorical(len(train_set)))  # N scales the batch
        model = BNNModel(net, likelihood=len(train_set))               # the same, for short
    """

    kind = "Categorical"

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        return dist.Categorical(logits=output, validate_args=False)

    def __call__(
        self,
        output: torch.Tensor,
        y: torch.Tensor | None = None,
        particle_dims: int = 0,
        outputs_site: str | None = None,
    ) -> torch.Tensor:
        if y is not None:
            check_labels(output, y, particle_dims)
        return super().__call__(output, y, particle_dims, outputs_site)


class Gaussian(Likelihood):
    r"""Regression: :math:`y \sim \mathcal N(f_w(x), \sigma^2)` with a fixed noise scale.

    Targets of shape ``(B,)`` pair with a network output of shape ``(B, 1)`` or
    ``(B,)``; multi-output targets ``(B, D)`` are one event of dimension ``D``.

    Example::

        model = BNNModel(MLP(8, (32,), 1), likelihood=Gaussian(len(train_set), scale=0.5))
        fit(model, MeanFieldGuide(model), loader, epochs=100)
        mean = predict(model, guide, x).mean   # the predictive mean of y
    """

    kind = "Gaussian"

    def __init__(self, dataset_size: int, scale: float = 1.0):
        super().__init__(dataset_size)
        scale = float(scale)
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"Gaussian likelihood scale must be positive, got {scale!r}")
        self.scale = scale

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        return self.batched_distribution(output, 0)

    def batched_distribution(self, output: torch.Tensor, particle_dims: int) -> dist.Distribution:
        core = output.dim() - particle_dims  # dimensions of one particle's (B, ...) output
        if core == 2 and output.shape[-1] == 1:
            output = output.squeeze(-1)
            core = 1
        d = dist.Normal(output, self.scale, validate_args=False)
        return d.to_event(core - 1) if core > 1 else d
