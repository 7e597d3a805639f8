r"""A Bayesian model and its trained guide as a trained method: mean-field, 2DG with
each tying, rank-1, SSVI (or any guide :func:`~twodg_pyro.prediction.predict` draws
from), predicting by the seeded draws every evaluation of the library uses
(:mod:`twodg_pyro.evaluation`)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from ..evaluation import seeded_predict
from ..nn import recompute_norm_stats
from ..prediction import Prediction
from .base import TrainedMethod


class GuidePosterior(TrainedMethod):
    r"""A model :math:`p(w)\,p(y \mid f_w(x))` and its guide :math:`q(w)`, predicting by
    :math:`N_s` draws :math:`w_s \sim q` seeded with ``seed``
    (:func:`~twodg_pyro.evaluation.seeded_predict`).

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel` (or a rank-1 model).
        guide: its trained guide.
        name: the results row (default: the guide's ``method``).
        state: the final :class:`~twodg_pyro.infer.TrainState` of its training.
        structure: a 2DG BNN's sharing structure as stage 2 built it (before stage 3
            refined it; the guide's ``structure()`` is the refined one).

    Example::

        method = GuidePosterior(model, MeanFieldGuide(model))   # after fit(model, guide, ...)
        pred = method.predict((X, y), num_samples=30, seed=0)
        method.forwards_per_prediction(30)   # 30 (a rank-1 BNN: 30 K)
        method.save("model_mean_field.pt")   # save_model's file
    """

    variational = True

    def __init__(self, model, guide, name: str | None = None, state=None, structure=None):
        super().__init__()
        self.model, self.guide = model, guide
        self.name = name or getattr(guide, "method", None) or type(guide).__name__
        self.state, self.structure = state, structure

    @property
    def net(self):
        return self.model.net

    @property
    def likelihood(self):
        return self.model.likelihood

    def forwards_per_prediction(self, num_samples: int) -> int:
        """``num_samples`` draws, times the ``K`` outputs of a rank-1 model's draw."""
        return int(num_samples) * int(getattr(self.model, "output_components", 1) or 1)

    def mean_network(self) -> nn.Module:
        r"""A copy of the network with every Bayesian site at its posterior mean (the
        guide's ``mean_weights()``: mean-field's :math:`\mu`, a 2DG BNN's component
        centres and outlier means), trainable (e.g. for
        :func:`~twodg_pyro.methods.fit_laplace`); its other parameters and buffers (e.g.
        BatchNorm's statistics) are the model's.

        Raises:
            TypeError: a guide without per-weight means (rank-1's refuses; a guide
                outside the library's protocol without ``mean_weights``).
        """
        means = getattr(self.guide, "mean_weights", None)
        if not callable(means):
            raise TypeError(
                f"{self.name}: its guide ({type(self.guide).__name__}) has no per-weight "
                "posterior means (mean_weights)"
            )
        net = copy.deepcopy(self.net)
        params = dict(net.named_parameters())
        with torch.no_grad():
            for name, mean in means().items():
                params[name].copy_(mean)
        return net.requires_grad_(True)

    def with_mean_norm_stats(self, batches) -> GuidePosterior:
        """This posterior with its network's normalisation statistics (BatchNorm's running
        averages) recomputed for :meth:`mean_network` over ``batches``
        (:func:`~twodg_pyro.nn.recompute_norm_stats`): what a prediction from one pass of
        the mean network needs (a Laplace head over it: fit it on the result's
        ``mean_network()`` and store it with ``export_compact(..., laplace=)``); the draws
        then normalise with them too.  The model is copied, the guide shared.

        Raises:
            TypeError: as :meth:`mean_network`.
            ValueError: ``batches`` holds no batch.
        """
        mean = recompute_norm_stats(self.mean_network(), batches)
        model = copy.deepcopy(self.model)
        buffers = dict(mean.named_buffers())
        with torch.no_grad():
            for name, b in model.net.named_buffers():
                b.copy_(buffers[name])
        return type(self)(model, self.guide, self.name, self.state, self.structure)

    def predict(self, data, num_samples: int = 30, seed: int = 0, **kw) -> Prediction:  # type: ignore[override]
        """:func:`~twodg_pyro.evaluation.seeded_predict` (``kw``: ``batch_size``,
        ``keep_samples``, ``progress``)."""
        return seeded_predict(self.model, self.guide, data, num_samples, seed, **kw)

    def sample_probs(self, x, num_samples: int = 30, seed: int = 0, batch_size: int = 512):
        return self.predict(x, num_samples, seed, batch_size=batch_size, keep_samples=True).samples

    def save(self, path, network: dict | None = None, evaluation: dict | None = None) -> Path:
        """:func:`~twodg_pyro.io.save_model` of the model and guide."""
        from ..io.model_file import save_model

        return save_model(path, self.model, self.guide, network=network, evaluation=evaluation)
