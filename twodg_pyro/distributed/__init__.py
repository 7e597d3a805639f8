"""Multi-process training on ``torch.distributed`` (DDP, launched by ``torchrun``).

* :mod:`.env` -- joining the process group (:func:`setup`), ranks, small collectives;
* :mod:`.train` -- SVI with the ELBO module under DDP (:class:`DataParallelStep`, the
  step strategy of :func:`~twodg_pyro.infer.fit`; :func:`fit_distributed`), rank-0-only
  callbacks;
* :mod:`.data` -- each rank's shard of the data (:class:`ShardedLoader`);
* :mod:`.gmm` -- :class:`DistributedGaussianMixture2D`, EM with all-reduced statistics;
* :mod:`.parallel` -- DDP around a deterministic network, sharded prediction, the
  ranks' agreement on the sharing structure, the default backend;
* :mod:`.launch` -- starting N local processes on loopback (tests, benchmarks).

Everything also runs in a single process without a process group.  Nothing here knows
the pipeline: the whole main job under ``torchrun`` is
:func:`twodg_pyro.pipeline.run_distributed` (:mod:`twodg_pyro.pipeline.runtime.data_parallel`).
"""

from .data import ShardedLoader, local_batch_size
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
from .parallel import agree_on_structure, default_backend, sharded_predict
from .train import DataParallelStep, MainOnly, fit_distributed

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DataParallelStep",
    "DistInfo",
    "DistributedGaussianMixture2D",
    "DistributedSetupError",
    "MainOnly",
    "ShardedLoader",
    "agree_on_structure",
    "barrier",
    "cleanup",
    "default_backend",
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
    "setup",
    "sharded_predict",
]
