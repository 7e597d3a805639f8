r"""Deep ensembles (Lakshminarayanan et al. 2017): :math:`M` deterministic networks
trained from different seeded initialisations and shuffles, predicting by the average
of their softmax outputs,

.. math:: p(y \mid x) = \frac1M \sum_{m=1}^M \mathrm{softmax}(f_{w_m}(x)).

The members' probabilities are the ensemble's "draws" (:math:`S = M`, always all of
them, in member order): :meth:`Ensemble.sample_probs` returns them as ``(M, N, C)``, so
that the same uncertainty scores as for a BNN's posterior draws apply (entropy of the
average, expected entropy, mutual information). Nothing is random at prediction time:
``num_samples`` and ``seed`` are accepted for a uniform interface and ignored.

:func:`train_ensemble` trains the members one after the other with
:func:`~twodg_pyro.baselines.train_deterministic` (or another trainer of that
signature); the caller's ``make_member(m)`` seeds and builds member ``m`` and its data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from ..bnn import match_input
from ..prediction import Prediction, _batches
from .deterministic import train_deterministic

__all__ = ["Ensemble", "batches", "train_ensemble"]


def batches(data, batch_size: int = 512) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """``(x, y)`` batches of inputs ``X``, a pair ``(X, y)`` or an iterable of batches
    (``y`` is ``None`` for unlabelled inputs), as :func:`~twodg_pyro.prediction.predict`
    reads them.

    Raises:
        ValueError: no batches (an empty data set).
    """
    out = _batches(data, int(batch_size))
    if not out:
        raise ValueError("no data to predict on (empty data set)")
    return out


def targets_of(parts: list[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor | None:
    """The labels of :func:`batches`' output, ``None`` when any batch has none."""
    if all(y is not None for _, y in parts):
        return torch.cat([y.cpu() for _, y in parts])
    return None


class Ensemble(nn.Module):
    """``M`` trained networks of one architecture, predicting by their average softmax.

    Args:
        members: the trained networks (at least one).

    Attributes:
        members: an :class:`~torch.nn.ModuleList` of the networks.

    Raises:
        ValueError: no members.
    """

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        members = list(members)
        if len(members) < 1:
            raise ValueError(f"an ensemble needs members >= 1, got {len(members)}")
        self.members = nn.ModuleList(members)

    @property
    def num_members(self) -> int:
        return len(self.members)

    @property
    def net(self) -> nn.Module:
        """The first member (the architecture, for checks of inputs and outputs)."""
        return self.members[0]

    @property
    def dtype(self) -> torch.dtype:
        return next(self.members[0].parameters()).dtype

    def num_params(self) -> int:
        """Floating-point numbers of all members (trained and stored: ``M`` networks)."""
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def sample_probs(
        self, x, num_samples: int | None = None, seed: int | None = None, batch_size: int = 512
    ) -> torch.Tensor:
        """Every member's class probabilities ``(M, N, C)`` on inputs ``x`` (a tensor, a
        pair ``(X, y)`` or batches), on the CPU.  ``num_samples`` and ``seed`` are ignored
        (the draws are the ``M`` members, nothing is random)."""
        return self._member_probs(batches(x, batch_size))

    def _member_probs(self, parts) -> torch.Tensor:
        self.eval()
        out = []
        for member in self.members:
            like = next(member.parameters())
            out.append(
                torch.cat([member(match_input(xb, like)).softmax(-1).cpu() for xb, _ in parts])
            )
        return torch.stack(out)

    @torch.no_grad()
    def predict(
        self,
        data,
        num_samples: int | None = None,
        seed: int | None = None,
        batch_size: int = 512,
        keep_samples: bool = False,
    ) -> Prediction:
        """The average of the members' softmax on ``data`` (inputs, ``(X, y)`` or
        batches): a :class:`~twodg_pyro.prediction.Prediction` (``samples``: the members'
        probabilities when ``keep_samples``)."""
        parts = batches(data, batch_size)
        probs = self._member_probs(parts)
        return Prediction(
            mean=probs.mean(0), targets=targets_of(parts), samples=probs if keep_samples else None
        )


def train_ensemble(
    make_member: Callable[[int], tuple[nn.Module, Iterable]],
    members: int,
    epochs: int,
    lr: float = 1e-2,
    *,
    train: Callable = train_deterministic,
    **recipe,
) -> Ensemble:
    """Train ``members`` networks and return their :class:`Ensemble`.

    Args:
        make_member: ``m -> (net, data)``: member ``m``'s freshly initialised network and
            its training batches (seed both with ``m`` for different initialisations and
            shuffles).
        members: ``M >= 1``.
        epochs, lr, recipe: as :func:`~twodg_pyro.baselines.train_deterministic`
            (``train``: a trainer of its signature, called ``train(net, data, epochs, lr,
            **recipe)``).

    Raises:
        ValueError: ``members < 1`` (naming the value).
    """
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"members must be an integer >= 1, got {members!r}")
    nets = []
    for m in range(members):
        net, data = make_member(m)
        train(net, data, epochs, lr, **recipe)
        nets.append(net)
    return Ensemble(nets)
