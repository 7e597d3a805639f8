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

from ..baselines.deterministic import train_deterministic
from ..files.payload import payload_section
from ..io.model_format import state_tensors
from ..prediction import deterministic_predict
from .base import TrainedMethod


class Ensemble(TrainedMethod):
    """``M`` trained networks of one architecture, predicting by their average softmax.

    Args:
        members: the trained networks (at least one).

    Attributes:
        members: an :class:`~torch.nn.ModuleList` of the networks.

    Raises:
        ValueError: no members.

    Example::

        ensemble = train_ensemble(make_member, members=5, epochs=30)
        pred = ensemble.predict((X, y))            # the average of the 5 members
        ensemble.sample_probs(X).shape             # (5, N, C): the members' draws
        ensemble.save("model_ensemble.pt")
    """

    name = "ensemble"
    seeded = False
    file_tag = "ensemble"

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        members = list(members)
        if len(members) < 1:
            raise ValueError(f"an ensemble needs members >= 1, got {len(members)}")
        self.members = nn.ModuleList(members)

    @property
    def num_members(self) -> int:
        return len(self.members)

    def num_draws(self, num_samples: int) -> int:
        """Its ``M`` members, whatever ``num_samples``."""
        return self.num_members

    @property
    def net(self) -> nn.Module:
        """The first member (the architecture, for checks of inputs and outputs)."""
        return self.members[0]

    def num_params(self) -> int:
        """Floating-point numbers of all members (trained and stored: ``M`` networks)."""
        return sum(p.numel() for p in self.parameters())

    @property
    def settings(self) -> dict:
        return {"members": self.num_members}

    def _draws(self, parts, num_samples, seed) -> torch.Tensor:
        return torch.stack([deterministic_predict(m, parts).mean for m in self.members])

    def file_content(self) -> tuple[dict, dict]:
        tensors = [state_tensors(member, f"member/{m}/") for m, member in enumerate(self.members)]
        return {"members": self.num_members}, {k: v for t in tensors for k, v in t.items()}

    @classmethod
    def from_file(cls, header, payload, network, where):
        n = header.get("members")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{where!r}: the header's members = {n!r:.80} is not an integer >= 1")
        members = []
        for m in range(n):
            state = payload_section(payload, f"member/{m}/")
            if not state:
                raise ValueError(f"{where!r}: ensemble member {m} is missing")
            members.append(network(state))
        return cls(members)


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
