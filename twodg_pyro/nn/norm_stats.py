r"""Normalisation statistics recomputed for the weights a network holds now.

A BatchNorm layer predicts with running averages :math:`(\hat\mu, \hat\sigma^2)` of the
batch statistics it saw in training.  A BNN trains under weight *draws*, so those
averages describe the draws' activations, not those of the network at the posterior
mean: a prediction from one pass of the mean network (a last-layer Laplace head over
the 2DG BNN's mean body) normalises with statistics of other weights.
:func:`recompute_norm_stats` replaces them by the exact averages over a data set of the
network as it is: :math:`\hat\mu = \frac{1}{B}\sum_b \mu_b` over its ``B`` batches (each
batch's mean; torch's cumulative average, ``momentum = None``), likewise the unbiased
variances.
"""

from __future__ import annotations

import torch
from torch import nn

from .functional import batch_input


@torch.no_grad()
def recompute_norm_stats(net: nn.Module, batches) -> nn.Module:
    """Reset the running statistics of every normalisation layer of ``net`` that tracks
    them (BatchNorm) and average them anew over the inputs of ``batches`` (tensors or
    ``(x, y)`` pairs, e.g. the training loader, unshuffled), the network in training mode
    and its weights as they are; then restore each layer's momentum and ``net``'s mode.

    Returns ``net`` (changed in place).  A network without such layers is returned
    unchanged.

    Raises:
        ValueError: ``batches`` holds no batch (the statistics would be reset to 0 and 1).

    Example::

        mean = GuidePosterior(model, guide).mean_network()
        recompute_norm_stats(mean, make_loader(split.train, 256))
    """
    layers = [
        m
        for m in net.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats
    ]
    if not layers:
        return net
    was, momenta = net.training, [m.momentum for m in layers]
    like = next(net.parameters())
    seen = 0
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average
        net.train()
        for b in batches:
            net(batch_input(b, like))
            seen += 1
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
        net.train(was)
    if not seen:
        raise ValueError("recompute_norm_stats: batches holds no batch")
    return net
