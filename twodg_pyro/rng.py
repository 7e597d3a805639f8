"""Every random state a training run depends on, captured and restored (checkpoints).

:func:`capture_rng` takes the torch (CPU and CUDA), NumPy and Python ``random`` states
and those of the data loaders' shuffling generators as plain tensors and numbers (so a
checkpoint holding them loads with ``torch.load(weights_only=True)``);
:func:`restore_rng` puts them back.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch


def loader_generators(sources: Iterable) -> list[torch.Generator]:
    """Generators of data loaders (``loader.generator``) or generators given directly."""
    out = []
    for s in sources:
        g = s if isinstance(s, torch.Generator) else getattr(s, "generator", None)
        if g is None:
            raise ValueError(
                f"{type(s).__name__} has no seeded generator to checkpoint; build data loaders "
                "with twodg_pyro.data.make_loader (a seeded torch.Generator)"
            )
        out.append(g)
    return out


def capture_rng(generators: Sequence = ()) -> dict:
    """All random states: torch (CPU and CUDA), NumPy, Python ``random`` and ``generators``
    (data loaders or ``torch.Generator`` objects), as plain tensors and numbers."""
    np_state = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_meta": [str(np_state[0]), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": torch.tensor(py_state, dtype=torch.int64),
        "python_meta": [int(py_version), py_gauss],
        "generators": [g.get_state() for g in loader_generators(generators)],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping, generators: Sequence = ()) -> None:
    """Inverse of :func:`capture_rng` (``generators`` in the same order)."""
    torch.set_rng_state(state["torch"])
    name, pos, has_gauss, cached = state["numpy_meta"]
    np.random.set_state((name, state["numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    version, gauss = state["python_meta"]
    random.setstate((version, tuple(int(v) for v in state["python"].tolist()), gauss))
    gens = loader_generators(generators)
    saved = state.get("generators", [])
    if len(saved) != len(gens):
        raise ValueError(
            f"the checkpoint holds {len(saved)} data-loader generator state(s), "
            f"{len(gens)} generator(s) were given to restore"
        )
    for g, s in zip(gens, saved, strict=True):
        g.set_state(s)
    if "cuda" in state and torch.cuda.is_available():
        # saved on a machine with more (or fewer) GPUs: restore those present on both
        for i, s in enumerate(list(state["cuda"])[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)
