"""A deterministic network trained for a given number of epochs, keeping the weights of
the epoch with the best validation NLL (early stopping on the validation split).

:func:`train_early_stopped` runs :func:`~twodg_pyro.baselines.train_deterministic` (the
same recipe: optimiser, schedule, shuffling) and, after every epoch, the network's NLL
on the validation examples; the weights of the epoch with the lowest NLL so far are
kept, and restored at the end.  With ``patience`` training also stops once that many
epochs have passed without a lower NLL.  Without validation examples the network of the
last epoch is returned (and the report says so).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ..metrics import nll
from ..prediction import deterministic_predict
from .deterministic import train_deterministic


def validation_nll(net: nn.Module, val_data) -> float:
    """The mean NLL of ``net``'s softmax on labelled ``val_data`` (``(X, y)`` or batches)."""
    pred = deterministic_predict(net, val_data)
    if pred.targets is None:
        raise ValueError("the validation data have no labels")
    return nll(pred.mean, pred.targets)


def train_early_stopped(
    net: nn.Module,
    data,
    val_data,
    epochs: int,
    lr: float = 1e-2,
    *,
    patience: int | None = None,
    train: Callable = train_deterministic,
    **recipe,
) -> tuple[nn.Module, dict]:
    """Train ``net`` in place for up to ``epochs`` epochs and load the weights of its best
    validation epoch; returns ``(net, report)``.

    Args:
        net, data, epochs, lr, recipe: as :func:`~twodg_pyro.baselines.train_deterministic`
            (``train``: a trainer of its signature that passes ``on_epoch_end`` on).
        val_data: labelled validation examples (``(X, y)`` tensors or batches); ``None``
            (no validation split): the last epoch's weights are kept.
        patience: stop after this many epochs without a lower validation NLL; ``None``:
            train every epoch.

    The report: ``epochs`` (asked), ``epochs_trained``, ``best_epoch`` (1-based; the last
    epoch without validation data), ``best_val_nll`` (``None`` without), ``val_nll`` (the
    NLL after every epoch) and ``validation`` (``"val"`` or ``"none: the last epoch is
    kept"``).

    Raises:
        ValueError: ``patience`` below 1 (naming it).
    """
    if patience is not None and (
        isinstance(patience, bool) or not isinstance(patience, int) or patience < 1
    ):
        raise ValueError(f"patience = {patience!r}: must be an integer >= 1, or None")
    history: list[float] = []
    best = {"epoch": 0, "nll": None, "state": None}

    def on_epoch_end(epoch: int, model: nn.Module) -> bool:
        value = validation_nll(model, val_data)
        history.append(value)
        if best["nll"] is None or value < best["nll"]:
            best.update(
                epoch=epoch + 1,
                nll=value,
                state={k: v.detach().clone() for k, v in model.state_dict().items()},
            )
        return patience is not None and epoch + 1 - best["epoch"] >= patience

    hook = on_epoch_end if val_data is not None else None
    train(net, data, epochs, lr, on_epoch_end=hook, **recipe)
    if best["state"] is not None:
        net.load_state_dict(best["state"])
    report = {
        "epochs": int(epochs),
        "epochs_trained": len(history) if val_data is not None else int(epochs),
        "best_epoch": best["epoch"] if val_data is not None else int(epochs),
        "best_val_nll": best["nll"],
        "val_nll": history,
        "validation": "val" if val_data is not None else "none: the last epoch is kept",
    }
    return net, report
