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

Everything also runs in a single process without a process group.  The names load on
first use (PEP 562).  Nothing here knows the pipeline: the whole main job under
``torchrun`` is
:func:`twodg_pyro.pipeline.run_distributed` (:mod:`twodg_pyro.pipeline.runtime.data_parallel`).
"""

from __future__ import annotations

from .._lazy import lazy_names

#: exported name -> the module that defines it (loaded on first use, PEP 562)
_EXPORTS: dict[str, str] = {
    name: f"twodg_pyro.distributed.{module}"
    for module, names in {
        "data": ("ShardedLoader", "local_batch_size"),
        "env": (
            "DEFAULT_TIMEOUT_S",
            "DistInfo",
            "DistributedSetupError",
            "barrier",
            "cleanup",
            "env_rank",
            "env_world_size",
            "get_info",
            "get_rank",
            "get_world_size",
            "is_distributed",
            "is_main",
            "on_main",
            "setup",
        ),
        "gmm": ("DistributedGaussianMixture2D",),
        "parallel": ("agree_on_structure", "default_backend", "sharded_predict"),
        "train": ("DataParallelStep", "MainOnly", "fit_distributed"),
    }.items()
    for name in names
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
