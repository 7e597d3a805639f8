"""The main job under ``torchrun``: :func:`~twodg_pyro.pipeline.run` with every stage on
all processes.

``torchrun --nproc_per_node=N twodg-pyro train --config FILE`` lands here (the CLI sees
``WORLD_SIZE > 1``).  :func:`run_distributed` joins the process group and runs the one
pipeline (:func:`~twodg_pyro.pipeline.run`) on every rank with a :class:`DataParallel`
execution, which differs from the single-process one in these pieces:

* ``deterministic``: the network under DDP on sharded data (the configured batch is the
  global batch; :class:`~twodg_pyro.distributed.ShardedLoader`);
* ``mean_field`` (stage 1): :func:`~twodg_pyro.distributed.fit_distributed` on sharded
  data;
* ``2dg``: stage 2 on every rank from identical inputs (outlier gradients on the same,
  unsharded minibatches under the same seed; the mixture fitted with
  :class:`~twodg_pyro.distributed.DistributedGaussianMixture2D`, each rank's E-step on a
  shard of the points), a check that every rank holds the same structure (rank 0's is
  broadcast if not), then stage 3 with the merge and Mahalanobis hooks under
  :func:`~twodg_pyro.distributed.fit_distributed`;
* test-set predictions are sharded and gathered; every record gets ``world_size``.

Only rank 0 prints the table and writes files (the pipeline does so through
:func:`~twodg_pyro.distributed.env.on_main` and :class:`~twodg_pyro.distributed.MainOnly`):
``results.json``/``results.md``, the model file, diagnostics and figures
(:func:`~twodg_pyro.pipeline.artifacts.write_artifacts`), and with
``checkpoint_every > 0`` the stage checkpoints under ``checkpoints/`` (the pipeline's
format; resuming them is single-process only for now).

Environment: ``TWODG_DIST_BACKEND`` (default :func:`default_backend`: ``nccl`` when the
run's ``device`` is CUDA and CUDA is available, else ``gloo``) and
``TWODG_DIST_TIMEOUT_S`` (default 1800 s, the longest any rank waits for the others).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import pyro
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset

from ..baselines import train_deterministic
from ..pipeline.config import RunConfig
from ..pipeline.execution import Execution
from ..pipeline.runner import RunArtifacts, _to, run
from ..predict import Prediction
from . import env
from .gmm import DistributedGaussianMixture2D
from .train import ShardedLoader, _average_buffers, fit_distributed, local_batch_size

__all__ = [
    "DataParallel",
    "SUPPORTED_METHODS",
    "agree_on_structure",
    "check_supported",
    "default_backend",
    "run_distributed",
    "sharded_predict",
    "structure_checksum",
]

#: Methods that run under torch.distributed.
SUPPORTED_METHODS = ("deterministic", "mean_field", "2dg")


def run_distributed(
    cfg: RunConfig,
    out_dir: str | Path | None = None,
    *,
    overwrite: bool = False,
    backend: str | None = None,
    timeout_s: float | None = None,
) -> RunArtifacts:
    """Run ``cfg``'s methods on every process of the group; rank 0 writes the results.

    Joins the process group from ``torchrun``'s environment (and leaves it at the end
    if it joined it here).  Every rank must call it with the same configuration.
    ``overwrite`` replaces an earlier run's files in ``out_dir`` (see
    :func:`~twodg_pyro.pipeline.run`; rank 0 checks and locks the folder).

    Raises:
        ValueError: a method without distributed support, or a configured batch size
            that the world size does not divide (every rank, before any communication);
            :class:`~twodg_pyro.distributed.env.DistributedSetupError` when the group
            cannot be formed.
    """
    check_supported(cfg, env.env_world_size())
    backend = backend or os.environ.get("TWODG_DIST_BACKEND") or default_backend(cfg.device)
    if timeout_s is None:
        timeout_s = float(os.environ.get("TWODG_DIST_TIMEOUT_S", env.DEFAULT_TIMEOUT_S))
    joined_here = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    info = env.setup(backend, timeout_s)
    try:
        return run(cfg, out_dir, overwrite=overwrite, execution=DataParallel(info))
    finally:
        if joined_here:
            env.cleanup()


def default_backend(device: str) -> str:
    """The process-group backend for a run on ``device``: ``"nccl"`` when it is a CUDA
    device and CUDA (with NCCL) is available, else ``"gloo"`` (a CPU run on a GPU machine
    uses gloo: NCCL moves only CUDA tensors)."""
    cuda = str(device).startswith("cuda") and torch.cuda.is_available()
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    return "nccl" if cuda and nccl else "gloo"


def check_supported(cfg: RunConfig, world_size: int) -> None:
    """Raise ``ValueError`` for a method without distributed support, or a configured
    batch size that ``world_size`` does not divide (the same message on every rank)."""
    unsupported = [m for m in cfg.methods if m not in SUPPORTED_METHODS]
    if unsupported:
        raise ValueError(
            f"methods {unsupported} have no multi-process support yet; run them in one "
            f"process (plain `twodg-pyro`), or keep to {list(SUPPORTED_METHODS)} under torchrun"
        )
    local_batch_size(cfg.data.batch_size, world_size)


class DataParallel(Execution):
    """The pipeline's stages on every rank of the process group (see the module docstring).

    Without a group (one process) every piece is its single-process form: the same
    result as the distributed run would have with one rank.

    Args:
        info: this rank's place in the group (default:
            :func:`~twodg_pyro.distributed.env.get_info`).
    """

    mixture = DistributedGaussianMixture2D

    def __init__(self, info: env.DistInfo | None = None):
        self.info = info if info is not None else env.get_info()

    def check(self, cfg: RunConfig, resume: bool = False) -> None:
        if resume:
            raise ValueError("--resume runs in one process; start it without torchrun")
        check_supported(cfg, self.info.world_size)

    def configure(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` on this rank's GPU: the group's under NCCL; ``cuda:<local rank>`` for a
        bare ``"cuda"`` under another backend with several processes."""
        if cfg.device.startswith("cuda") and self.info.backend == "nccl":
            return dataclasses.replace(cfg, device=str(self.info.device))
        if cfg.device == "cuda" and self.info.world_size > 1:
            return dataclasses.replace(cfg, device=f"cuda:{self.info.local_rank}")
        return cfg

    def shard(self, loader, seed: int) -> ShardedLoader:
        """This rank's shard of ``loader``'s data set, ``loader``'s batch being the global one."""
        return ShardedLoader(loader.dataset, loader.batch_size, seed=seed)

    def fit(self, model, guide, data, epochs: int, *, seed: int, **kwargs):
        return fit_distributed(model, guide, data, epochs, seed=seed, **kwargs)

    def train_deterministic(
        self, net, data, epochs: int, lr: float, *, device, progress: bool, **recipe
    ):
        wrapped = _ddp(net, torch.device(device))
        train_deterministic(wrapped, data, epochs, lr, device=device, progress=progress, **recipe)
        _average_buffers(net)
        return net

    def predict(self, fn, eval_data, device):
        return sharded_predict(fn, eval_data, torch.device(device))

    def seed_common(self, seed: int) -> None:
        """The same random state on every rank (stage 1 left the ranks' states apart)."""
        pyro.set_rng_seed(seed)

    def agree(self, structure):
        return agree_on_structure(structure)

    def record_fields(self) -> dict:
        return {"world_size": self.info.world_size}


def _ddp(net: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    if not env.is_distributed():
        return net
    if device.type != "cuda":
        return DDP(net)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DDP(net, device_ids=[index])


def structure_checksum(s) -> torch.Tensor:
    """Counts and sums of a :class:`~twodg_pyro.sharing.SharingStructure` (float64)."""
    parts = [
        s.means,
        s.covariances,
        s.outlier_index,
        s.outlier_loc,
        s.outlier_scale,
        s.plain_index,
        s.plain_component,
        s.ellipse_index,
        s.ellipse_components,
        s.ellipse_alphas,
    ]
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
    if isinstance(eval_data, tuple):
        n = int(eval_data[0].shape[0])
    else:
        n = len(eval_data.dataset)
    if world == 1 or n < world:
        return fn(_to(eval_data, device))
    lo, hi = rank * n // world, (rank + 1) * n // world
    if isinstance(eval_data, tuple):
        part = tuple(t[lo:hi].to(device) for t in eval_data)
    else:
        part = DataLoader(Subset(eval_data.dataset, range(lo, hi)), batch_size=eval_data.batch_size)
    pred = fn(part)
    targets = None if pred.targets is None else env.all_gather_rows(pred.targets)
    return Prediction(mean=env.all_gather_rows(pred.mean), targets=targets)
