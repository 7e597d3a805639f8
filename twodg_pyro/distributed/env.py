"""The process group: joining it (torchrun's environment), who is who, and small collectives.

Every function here also works without a process group (a plain single-process run):
the rank is 0, the world size 1, and collectives are no-ops, so code written against
this module runs unchanged with ``python`` and with ``torchrun``.

All collectives go through the default process group, whose ``timeout`` (set by
:func:`setup`) bounds every wait: a rank that stops answering makes the others fail
with an error after ``timeout_s`` instead of hanging.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

#: Default time any collective may wait for the slowest rank (also the join timeout).
DEFAULT_TIMEOUT_S = 1800.0

_KNOWN_BACKENDS = ("gloo", "nccl", "mpi", "ucc")


class DistributedSetupError(ValueError):
    """The process group cannot be formed as asked: a backend this host or PyTorch build
    lacks, a bad launch environment, or a rendezvous that failed.  Raised on every rank."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands.

    Attributes:
        rank: global rank (0 without a process group).
        world_size: number of processes (1 without a process group).
        local_rank: rank on this node (``LOCAL_RANK``), which picks the GPU.
        backend: ``"gloo"``, ``"nccl"``, ... or ``None`` without a process group.
        device: the device this rank computes on (``cuda:<local_rank>`` for NCCL).
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str | None
    device: torch.device


def _env_int(name: str, default: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None


def env_world_size() -> int:
    """``WORLD_SIZE`` as set by ``torchrun`` (1 when unset): > 1 means a multi-process launch."""
    ws = _env_int("WORLD_SIZE", 1)
    if ws < 1:
        raise ValueError(f"environment variable WORLD_SIZE={ws} must be at least 1")
    return ws


def env_rank() -> int:
    """``RANK`` as set by ``torchrun`` (0 when unset); usable before and after the group."""
    return _env_int("RANK", 0)


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main() -> bool:
    """True on rank 0, and in a single-process run: the process that writes files."""
    return get_rank() == 0


def _comm_device() -> torch.device:
    """Where tensors must live for the default group's collectives (GPU for NCCL)."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def get_info() -> DistInfo:
    """The current process's :class:`DistInfo` (single-process values without a group)."""
    local = _env_int("LOCAL_RANK", 0) if dist.is_available() and dist.is_initialized() else 0
    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    return DistInfo(get_rank(), get_world_size(), local, backend, device)


def _check_backend(backend: str, local_rank: int, rank: int) -> str:
    name = str(backend).lower()
    where = f"rank {rank}"
    if name not in _KNOWN_BACKENDS:
        raise DistributedSetupError(
            f"{where}: unknown torch.distributed backend {backend!r}; use one of "
            f"{list(_KNOWN_BACKENDS)} ('nccl' on GPUs, 'gloo' on CPUs)"
        )
    if not dist.is_available():
        raise DistributedSetupError(f"{where}: this PyTorch build has no torch.distributed support")
    if not dist.is_backend_available(name):
        have = [b for b in _KNOWN_BACKENDS if dist.is_backend_available(b)]
        raise DistributedSetupError(
            f"{where}: torch.distributed backend {name!r} is not available in this PyTorch "
            f"build (available: {have}); use backend='gloo' on CPUs"
        )
    if name == "nccl":
        if not torch.cuda.is_available():
            raise DistributedSetupError(
                f"{where}: backend 'nccl' needs CUDA GPUs, but torch.cuda.is_available() is "
                "False on this host; use backend='gloo' (or backend=None to pick it) on CPUs"
            )
        if local_rank >= torch.cuda.device_count():
            raise DistributedSetupError(
                f"{where}: LOCAL_RANK={local_rank} but this host has only "
                f"{torch.cuda.device_count()} GPU(s); start at most that many processes per "
                "node (torchrun --nproc_per_node)"
            )
    return name


def setup(
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    init_method: str | None = None,
) -> DistInfo:
    """Join the process group described by ``torchrun``'s environment, or do nothing.

    Reads ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` (and ``MASTER_ADDR``/``MASTER_PORT`` for
    the default ``env://`` rendezvous).  With ``WORLD_SIZE`` unset or 1 no group is made
    and the single-process :class:`DistInfo` is returned.  Calling it again inside an
    initialised group returns the current info.

    Args:
        backend: ``"nccl"`` (GPUs), ``"gloo"`` (CPUs), ...; ``None`` picks ``nccl`` when
            CUDA is available, else ``gloo``.  A backend this host or build lacks is an
            error on every rank, raised before any network traffic.
        timeout_s: how long the rendezvous and every later collective may wait (seconds).
        init_method: a rendezvous URL (default ``env://``); e.g. ``file:///tmp/pg``.

    Raises:
        ValueError: a bad timeout.
        DistributedSetupError: (a ``ValueError``) a bad backend name, a backend this host
            or build lacks, a bad launch environment, or a failed rendezvous.
    """
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    world = env_world_size()
    rank = _env_int("RANK", 0 if world == 1 else None)
    local_rank = _env_int("LOCAL_RANK", rank if world > 1 and rank is not None else 0)
    if backend is not None:
        backend = _check_backend(backend, local_rank or 0, rank or 0)
    if dist.is_available() and dist.is_initialized():
        return get_info()
    if world == 1 and init_method is None:
        return DistInfo(0, 1, 0, None, torch.device("cpu"))
    if rank is None:
        raise DistributedSetupError(f"WORLD_SIZE={world} but RANK is not set; launch with torchrun")
    if not 0 <= rank < world:
        raise DistributedSetupError(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    if init_method in (None, "env://"):
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            raise DistributedSetupError(
                f"rank {rank}: {', '.join(missing)} not set; launch with torchrun or set them "
                "(e.g. MASTER_ADDR=127.0.0.1 MASTER_PORT=29500)"
            )
    if backend is None:
        backend = _check_backend("nccl" if torch.cuda.is_available() else "gloo", local_rank, rank)
    device = torch.device("cpu")
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    try:
        dist.init_process_group(
            backend,
            init_method=init_method or "env://",
            timeout=timedelta(seconds=float(timeout_s)),
            rank=rank,
            world_size=world,
            **kwargs,
        )
    except Exception as e:  # add who and where to the rendezvous error
        where = init_method or f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise DistributedSetupError(
            f"rank {rank}/{world}: could not form the {backend!r} process group at {where} "
            f"(timeout {timeout_s:g} s): {e}"
        ) from e
    return DistInfo(rank, world, local_rank, backend, device)


def cleanup() -> None:
    """Leave the process group (if any)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (bounded by the group's timeout); no-op single-process."""
    if is_distributed():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over ranks (a new tensor on ``t``'s device and dtype)."""
    if not is_distributed():
        return t
    buf = t.detach().to(_comm_device(), copy=True)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return buf.to(t.device)


def broadcast_tensor(t: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s ``t`` on every rank (same shape and dtype everywhere)."""
    if not is_distributed():
        return t
    buf = t.detach().to(_comm_device(), copy=True).contiguous()
    dist.broadcast(buf, src=src)
    return buf.to(t.device)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_comm_device())
    return box[0]


def all_gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``t`` along dim 0, in rank order (row counts may differ)."""
    if not is_distributed():
        return t
    dev = _comm_device()
    n = torch.tensor([t.shape[0]], dtype=torch.long, device=dev)
    sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, n)
    sizes = [int(s) for s in sizes]
    top = max(sizes)
    buf = t.detach().to(dev)
    if buf.shape[0] < top:
        buf = torch.cat([buf, buf.new_zeros((top - buf.shape[0], *buf.shape[1:]))])
    parts = [torch.empty_like(buf) for _ in sizes]
    dist.all_gather(parts, buf.contiguous())
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)]).to(t.device)


def _disagreeing_ranks(values: torch.Tensor, rtol: float) -> tuple[list[int], torch.Tensor]:
    rows = all_gather_rows(values.detach().to(torch.float64).reshape(1, -1))
    close = [torch.allclose(row, rows[0], rtol=rtol, atol=0.0, equal_nan=True) for row in rows]
    return [r for r, ok in enumerate(close) if not ok], rows


def same_across_ranks(values: torch.Tensor, rtol: float = 1e-6) -> bool:
    """Whether the small float vector ``values`` (same length everywhere) agrees on all
    ranks; the same answer on every rank."""
    return not _disagreeing_ranks(values, rtol)[0]


def check_same_across_ranks(values: torch.Tensor, what: str, rtol: float = 1e-6) -> None:
    """Raise on every rank when the small float vector ``values`` differs between ranks.

    ``values`` must have the same length on every rank (e.g. counts and checksums).
    """
    bad, rows = _disagreeing_ranks(values, rtol)
    if bad:
        raise RuntimeError(
            f"{what} differs between processes: rank 0 has {rows[0].tolist()}, rank(s) {bad} "
            f"have {[rows[r].tolist() for r in bad]}; the ranks diverged (a step that should "
            "be identical on every rank is not deterministic)"
        )


def on_main(fn: Callable[[], Any], what: str, share: bool = False) -> Any:
    """Run ``fn`` on rank 0 only; every rank learns whether it worked.

    A barrier carrying the outcome: when ``fn`` fails on rank 0, rank 0 re-raises and
    every other rank raises a ``RuntimeError`` naming ``what``, instead of waiting for
    rank 0 in its next collective.  Returns ``fn()``'s result on rank 0, and on every
    rank with ``share=True`` (it must then be picklable), else ``None`` elsewhere.
    """
    result, error = None, None
    if is_main():
        try:
            result = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below on every rank
            error = e
    message = None if error is None else f"{type(error).__name__}: {error}"
    message, shared = broadcast_object((message, result if share else None))
    if error is not None:
        raise error
    if message is not None:
        raise RuntimeError(f"rank 0 failed to {what}: {message}")
    return result if is_main() else shared
