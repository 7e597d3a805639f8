"""The main job under ``torchrun``: :func:`~twodg_pyro.pipeline.run` with every stage on
all processes (the pieces from :mod:`twodg_pyro.distributed`).

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
(:func:`~twodg_pyro.pipeline.outputs.artifacts.write_artifacts`), and with
``checkpoint_every > 0`` the stage checkpoints under ``checkpoints/`` (the pipeline's
format; resuming them is single-process only for now).

Environment: ``TWODG_DIST_BACKEND`` (default
:func:`~twodg_pyro.distributed.parallel.default_backend`: ``nccl`` when the
run's ``device`` is CUDA and CUDA is available, else ``gloo``) and
``TWODG_DIST_TIMEOUT_S`` (default 1800 s, the longest any rank waits for the others).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pyro
import torch

from ...baselines import train_deterministic
from ...distributed import env
from ...distributed.data import ShardedLoader, local_batch_size
from ...distributed.gmm import DistributedGaussianMixture2D
from ...distributed.parallel import (
    agree_on_structure,
    ddp_network,
    default_backend,
    sharded_predict,
)
from ...distributed.train import average_buffers, fit_distributed
from ..settings.config import RunConfig
from ..settings.registry import METHOD_REGISTRY
from .execution import Execution
from .runner import run
from .trained import RunArtifacts

#: Methods that run under torch.distributed.
SUPPORTED_METHODS = tuple(name for name, method in METHOD_REGISTRY.items() if method.distributed)


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
        wrapped = ddp_network(net, torch.device(device))
        train_deterministic(wrapped, data, epochs, lr, device=device, progress=progress, **recipe)
        average_buffers(net)
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
