r"""The protocol of a trained method, stated once: every row of the results table -- a
guide posterior, a network, an ensemble, a Laplace approximation, MCMC chains -- is one
:class:`TrainedMethod`.

A trained method predicts by the average of its draws' predictive probabilities,

.. math:: p(y \mid x, \mathcal D) \approx \frac1S \sum_{s=1}^{S} p(y \mid x, w_s),
    \qquad S = \texttt{num\_draws}(N_s),

where :math:`N_s` is the number of draws a prediction is asked for and :math:`S` its
draws (``num_draws``): a posterior's :math:`N_s` seeded draws, an ensemble's :math:`M`
members, MCMC's kept draws, a network's one; its cost is ``forwards_per_prediction``
network evaluations per example (:math:`S`, or :math:`S K` for a rank-1 BNN whose draw
evaluates its :math:`K` components).  Its file goes
through one pair, :meth:`TrainedMethod.save` /
:func:`~twodg_pyro.methods.files.load_method`, and one registry: the class of a file's
``file_tag``, registered when the class is defined (a subclass naming ``file_tag`` is
one registration).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from ..files.payload import payload_section, write_payload
from ..io.model_format import BASELINE_FORMAT, header_json
from ..prediction import Prediction, _batches, _targets

#: file tag -> the class that reads it (:meth:`TrainedMethod.__init_subclass__`)
_FILES: dict[str, type[TrainedMethod]] = {}


class TrainedMethod(nn.Module):
    r"""A trained method: its draws of predictive probabilities, its forward passes per
    prediction, its file, its name and settings (see the module docstring).

    A subclass gives :meth:`_draws` (the ``(S, N, C)`` probabilities of batches, on the
    CPU) and :attr:`net`; for a model file, ``file_tag`` (its header's ``baseline``, the
    registry's key), :meth:`file_content` and :meth:`from_file`.

    Example::

        method = Ensemble(members)                          # any trained method
        pred = method.predict((X, y), num_samples=30, seed=0)   # a Prediction
        probs = method.sample_probs(X, num_samples=10)          # (S, N, C)
        method.save("model_ensemble.pt", network=spec)
        again = load_method("model_ensemble.pt")
    """

    #: the results row it is (``"deterministic"``, ``"ensemble"``, ...)
    name: str = "method"
    #: its draws differ (mutual information is defined)
    bayesian: ClassVar[bool] = True
    #: its draws depend on the seed it is given
    seeded: ClassVar[bool] = True
    #: a model and its guide: the diagnostics of variational inference apply (the ArviZ
    #: export of the guide's draws, k-hat; its ``model``, ``guide`` and ``state``)
    variational: ClassVar[bool] = False
    #: the ``baseline`` of its model file (``None``: no file of its own)
    file_tag: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        tag = cls.__dict__.get("file_tag")
        if tag is not None:
            owner = _FILES.setdefault(tag, cls)
            if owner.__qualname__ != cls.__qualname__ or owner.__module__ != cls.__module__:
                raise ValueError(f"file tag {tag!r} is {owner.__name__}'s, not {cls.__name__}'s")
            _FILES[tag] = cls  # a module imported again defines its class again

    #: the network every draw runs through (the architecture; an attribute or property)
    net: nn.Module

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of its network's parameters."""
        return next(self.net.parameters()).dtype

    @property
    def settings(self) -> dict:
        """How it was trained or drawn (JSON-able; ``{}``: nothing beyond its name)."""
        return {}

    @property
    def likelihood(self):
        """The likelihood of its labels (``None``: the network's softmax, categorical)."""
        return None

    def num_draws(self, num_samples: int) -> int:
        """Draws of one prediction asked for ``num_samples``: ``num_samples`` unless the
        method's draws are fixed (an ensemble's members, MCMC's kept draws, a network's
        one)."""
        return int(num_samples)

    def forwards_per_prediction(self, num_samples: int) -> int:
        """Network evaluations per example of one prediction asked for ``num_samples``
        draws: one per draw (:meth:`num_draws`) unless a draw evaluates several."""
        return self.num_draws(num_samples)

    def _draws(self, parts, num_samples: int, seed: int) -> torch.Tensor:
        """``(S, N, C)`` probabilities of the batches ``parts`` on the CPU."""
        raise NotImplementedError

    @torch.no_grad()
    def sample_probs(
        self, x, num_samples: int | None = 30, seed: int | None = 0, batch_size: int = 512
    ) -> torch.Tensor:
        """Per-draw class probabilities ``(S, N, C)`` on inputs ``x`` (a tensor, ``(X, y)``
        or batches), on the CPU: ``num_samples`` draws seeded with ``seed`` (the same for
        every batching), or the method's own (an ensemble's members, a network's one)."""
        self.eval()
        return self._draws(_batches(x, int(batch_size)), num_samples, seed)

    @torch.no_grad()
    def predict(
        self,
        data,
        num_samples: int = 30,
        seed: int = 0,
        *,
        batch_size: int = 512,
        keep_samples: bool = False,
        progress: bool = False,
    ) -> Prediction:
        """The prediction of ``data`` (inputs, ``(X, y)`` or batches) by :meth:`num_draws`
        draws seeded with ``seed``: a
        :class:`~twodg_pyro.prediction.Prediction` (``samples``: the per-draw
        probabilities when ``keep_samples``)."""
        self.eval()
        return self._predict(
            _batches(data, int(batch_size)), self.num_draws(num_samples), seed, keep_samples
        )

    def _predict(self, parts, n: int, seed: int, keep_samples: bool) -> Prediction:
        """:meth:`predict` of the batches ``parts`` by ``n`` draws: their mean probabilities."""
        probs = self._draws(parts, n, seed)
        samples = probs if keep_samples else None
        return Prediction(mean=probs.mean(0), targets=_targets(parts), samples=samples)

    def file_content(self) -> tuple[dict, dict]:
        """``(fields, tensors)`` of its model file: the header fields after ``method``,
        ``baseline``, ``network`` and ``dtype`` (JSON), and the tensors keyed
        ``"<section>/<name>"``."""
        raise TypeError(f"{type(self).__name__} has no model file (it names no file_tag)")

    @classmethod
    def from_file(cls, header: dict, payload: dict, network: Callable, where: str):
        """The method of a file's verified ``header`` and ``payload``; ``network(state)``
        rebuilds the network with a ``state_dict``."""
        raise NotImplementedError

    def save(
        self, path: str | Path, network: dict | None = None, evaluation: dict | None = None
    ) -> Path:
        """Write the method to ``path`` atomically (conventionally ``model_<name>.pt``).

        Args:
            network: ``{"name", "kwargs"}`` for :func:`twodg_pyro.models.build_network`,
                so that :func:`load_method` needs no ``net``.
            evaluation: how the run evaluated it (JSON-able; ``twodg-pyro evaluate``
                takes its defaults from it).
        """
        fields, tensors = self.file_content()
        header = {
            "method": self.name,
            "baseline": self.file_tag,
            "network": network,
            "dtype": str(next(self.net.parameters()).dtype).removeprefix("torch."),
            **fields,
        }
        return write_payload(
            {"header": header_json(BASELINE_FORMAT, header, evaluation), **tensors}, path
        )


def header_table(header: dict, key: str, where: str, what: str, **types) -> dict:
    """The header's table ``key``, whose fields have the ``types`` (name -> type), or
    ValueError (the table is not one of ``what``)."""
    table = header.get(key)
    if not (isinstance(table, dict) and all(isinstance(table.get(k), t) for k, t in types.items())):
        raise ValueError(f"{where!r}: the header's {key} = {table!r:.80} is not a table of {what}")
    return table


def net_section(payload: dict, network: Callable) -> nn.Module:
    """The network of a file's ``net/`` tensors."""
    return network(payload_section(payload, "net/"))
