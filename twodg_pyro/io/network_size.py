"""Building the network a file declares, once its size is checked.

A file may declare a network much larger than itself (a JSON spec of a few bytes, a
compact file's weights described in a few bits each), so a header is never trusted to
size an allocation: :func:`build_file_network` builds the network first on PyTorch's meta
device (which allocates nothing) and refuses it when it has more values than the file
holds or describes, or more than :data:`MAX_NETWORK_VALUES`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

#: The most values (parameters and buffers) a network built from a file's spec may have:
#: 2**30 (4 GiB at float32), twelve times the largest network of the registry (ViT-B/16).
#: A compact file describes its weights in far fewer bytes, so its length cannot bound them.
MAX_NETWORK_VALUES = 1 << 30


def _list_entries(obj: Any) -> int:
    if isinstance(obj, Mapping):
        return sum(_list_entries(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return len(obj) + sum(_list_entries(v) for v in obj)
    return 0


def build_file_network(
    spec: Any, where: str | Path, tensors: Mapping[str, tuple[int, ...]], verb: str = "describes"
) -> torch.nn.Module:
    """Build the network of a file's ``{"name", "kwargs"}`` spec, once its size is checked
    without allocating it: built first on PyTorch's meta device, it may have at most as
    many values as the file's ``tensors`` (``{name: shape}``: what the file ``verb``) and
    at most :data:`MAX_NETWORK_VALUES`; and its kwargs' lists may hold at most as many
    entries as there are ``tensors`` (each layer width makes at least one tensor).

    Raises:
        ValueError: naming the file, the spec and the sizes; no spec; or a spec that cannot
            be built.
    """
    from ..models import build_network

    where = str(where)
    if not spec:
        raise ValueError(f"{where!r} does not say how to build its network: pass net=")
    about = f"{where!r}: the header's network {spec!r:.120}"
    held = sum(math.prod(shape) for shape in tensors.values())
    try:
        name, kwargs = spec["name"], spec.get("kwargs", {})
        n_list = _list_entries(kwargs)
        if n_list > len(tensors):
            raise ValueError(
                f"{about} has lists of {n_list} values, but the file {verb} only "
                f"{len(tensors)} tensors"
            )
        try:
            with torch.device("meta"):
                shell = build_network(name, **kwargs)
            n = sum(v.numel() for v in shell.state_dict().values())
        except (RuntimeError, NotImplementedError):  # a network that cannot be built on meta
            n = 0
        if n > MAX_NETWORK_VALUES:
            raise ValueError(
                f"{about} declares {n} parameters and buffers, more than the "
                f"{MAX_NETWORK_VALUES} a model file may declare"
            )
        if n > held:
            raise ValueError(
                f"the network does not match the one saved in {where!r}: the header's network "
                f"{spec!r:.120} declares {n} parameters and buffers, more than the {held} "
                f"the file {verb}"
            )
        return build_network(name, **kwargs)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        if where in str(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{where!r}: cannot build its network {spec!r:.120}: {first}") from e
