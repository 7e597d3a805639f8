"""Multi-process training on ``torch.distributed`` (DDP, launched by ``torchrun``).

* :mod:`.env` -- joining the process group (:func:`setup`), ranks, small collectives;
* :mod:`.train` -- stage-1/stage-3 SVI with the ELBO module under DDP
  (:func:`fit_distributed`), sharded loaders, rank-0-only callbacks;
* :mod:`.gmm` -- :class:`DistributedGaussianMixture2D`, EM with all-reduced statistics;
* :mod:`.runner` -- the whole pipeline under ``torchrun`` (:func:`run_distributed`);
* :mod:`.launch` -- starting N local processes on loopback (tests, benchmarks).

Everything also runs in a single process without a process group.
"""

from .env import (
    DEFAULT_TIMEOUT_S,
    DistInfo,
    DistributedSetupError,
    barrier,
    cleanup,
    env_rank,
    env_world_size,
    get_info,
    get_rank,
    get_world_size,
    is_distributed,
    is_main,
    on_main,
    setup,
)
from .gmm import DistributedGaussianMixture2D
from .train import MainOnly, ShardedLoader, fit_distributed, local_batch_size, shard_loader

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DistInfo",
    "DistributedGaussianMixture2D",
    "DistributedSetupError",
    "MainOnly",
    "ShardedLoader",
    "barrier",
    "cleanup",
    "env_rank",
    "env_world_size",
    "fit_distributed",
    "get_info",
    "get_rank",
    "get_world_size",
    "is_distributed",
    "is_main",
    "local_batch_size",
    "on_main",
    "run_distributed",
    "setup",
    "shard_loader",
]


def run_distributed(*args, **kwargs):
    """See :func:`twodg_pyro.distributed.runner.run_distributed` (imported lazily)."""
    from .runner import run_distributed as _run

    return _run(*args, **kwargs)
