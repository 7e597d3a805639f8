"""A plain network as a trained method: the deterministic rows (``deterministic``,
``deterministic_matched``), one forward pass per prediction."""

from __future__ import annotations

from torch import nn

from ..io.model_format import state_tensors
from ..prediction import deterministic_predict
from .base import TrainedMethod, net_section


class Network(TrainedMethod):
    """A trained network predicting by its softmax: one draw (``S = 1``), nothing random.

    Example::

        method = Network(train_deterministic(net, loader, epochs=30))
        pred = method.predict((X, y))          # num_samples and seed are ignored
        method.sample_probs(X).shape           # (1, N, C)
        method.save("model_deterministic.pt")
    """

    bayesian = seeded = False
    file_tag = "network"

    def __init__(self, net: nn.Module, name: str = "deterministic"):
        super().__init__()
        self.net, self.name = net, name

    def num_draws(self, num_samples: int) -> int:
        """One forward pass, whatever ``num_samples``."""
        return 1

    def _draws(self, parts, num_samples, seed):
        return deterministic_predict(self.net, parts).mean.unsqueeze(0)

    def file_content(self) -> tuple[dict, dict]:
        return {}, state_tensors(self.net, "net/")

    @classmethod
    def from_file(cls, header, payload, network, where):
        return cls(net_section(payload, network).eval())
