"""What a data-parallel run needs beyond the training loop: DDP around a deterministic
network, sharded prediction, the ranks' agreement on stage 2's sharing structure, and
the process-group backend for a device.

The pipeline's data-parallel execution
(:class:`~twodg_pyro.pipeline.runtime.data_parallel.DataParallel`) is built from these pieces;
nothing here knows the pipeline.
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset

from ..evaluation import data_to_device, n_examples
from ..prediction import Prediction
from . import env


def default_backend(device: str) -> str:
    """The process-group backend for a run on ``device``: ``"nccl"`` when it is a CUDA
    device and CUDA (with NCCL) is available, else ``"gloo"`` (a CPU run on a GPU machine
    uses gloo: NCCL moves only CUDA tensors)."""
    cuda = str(device).startswith("cuda") and torch.cuda.is_available()
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    return "nccl" if cuda and nccl else "gloo"


def ddp_network(net: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``net`` under DDP on ``device`` (itself without a process group)."""
    if not env.is_distributed():
        return net
    if device.type != "cuda":
        return DDP(net)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DDP(net, device_ids=[index])


def structure_checksum(s) -> torch.Tensor:
    """Counts and sums of a :class:`~twodg_pyro.sharing.SharingStructure` (float64)."""
    parts = [getattr(s, name) for name in s._TENSORS if name != "inlier_points"]
    sums = [float(t.to(torch.float64).sum()) if t.numel() else 0.0 for t in parts]
    return torch.tensor([s.n_gaussians, s.n_outliers, s.n_ellipses, *sums], dtype=torch.float64)


def agree_on_structure(structure):
    """Every rank's structure when all are equal; otherwise rank 0's, broadcast (with a
    warning: stage 2 was not deterministic across ranks)."""
    if env.same_across_ranks(structure_checksum(structure)):
        return structure
    if env.is_main():
        warnings.warn(
            "the sharing structures built on the ranks differ; using rank 0's on every rank",
            RuntimeWarning,
            stacklevel=2,
        )
    return env.broadcast_object(structure)


def sharded_predict(fn, eval_data, device: torch.device) -> Prediction:
    """``fn(data)`` on this rank's contiguous share of the evaluation data, gathered: the
    predictions of the whole set, in order, on every rank."""
    world, rank = env.get_world_size(), env.get_rank()
    n = n_examples(eval_data)
    if world == 1 or n < world:
        return fn(data_to_device(eval_data, device))
    lo, hi = rank * n // world, (rank + 1) * n // world
    if isinstance(eval_data, tuple):
        part = tuple(t[lo:hi].to(device) for t in eval_data)
    else:
        part = DataLoader(Subset(eval_data.dataset, range(lo, hi)), batch_size=eval_data.batch_size)
    pred = fn(part)
    targets = None if pred.targets is None else env.all_gather_rows(pred.targets)
    return Prediction(mean=env.all_gather_rows(pred.mean), targets=targets)
