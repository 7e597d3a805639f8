"""The deterministic network trained by maximum likelihood (cross-entropy)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

__all__ = ["train_deterministic"]


def train_deterministic(
    net: nn.Module,
    data: Iterable,
    epochs: int,
    lr: float = 1e-2,
    weight_decay: float = 0.0,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> nn.Module:
    """Train ``net`` in place with Adam on the mean cross-entropy; returns ``net``.

    Floating inputs are cast to the network's dtype (a float64 network on float32 data).

    Raises:
        ValueError: for a non-positive learning rate or negative epochs.
    """
    if not (lr > 0):
        raise ValueError(f"learning rate must be positive, got {lr!r}")
    if int(epochs) < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs!r}")
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    like = next(net.parameters())  # inputs follow the network's dtype (and device)
    net.train()
    for _ in tqdm(range(int(epochs)), desc="deterministic", disable=not progress, leave=False):
        for x, y in data:
            if device is not None:
                x, y = x.to(device), y.to(device)
            if x.is_floating_point() and x.dtype != like.dtype:
                x = x.to(like.dtype)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            opt.step()
    net.eval()
    return net
