"""Algorithm 1 end to end, its settings, and the results table.

The names load on first use (PEP 562, as ``twodg_pyro``'s): importing one module of the
package, such as the preset registry :mod:`twodg_pyro.pipeline.settings.presets` that the command
line's help lists, does not import torch and the whole pipeline.
"""

from __future__ import annotations

from .._lazy import lazy_names

#: exported name -> the module that defines or re-exports it
_EXPORTS: dict[str, str] = {
    "ConfigError": "twodg_pyro.pipeline.settings.config",
    "RunConfig": "twodg_pyro.pipeline.settings.config",
    "SharingConfig": "twodg_pyro.pipeline.settings.config",
    "config_from_dict": "twodg_pyro.pipeline.settings.config",
    "load_config": "twodg_pyro.pipeline.settings.config",
    "run_distributed": "twodg_pyro.pipeline.runtime.data_parallel",
    "format_table": "twodg_pyro.pipeline.outputs.results",
    "read_results": "twodg_pyro.pipeline.outputs.results",
    "write_results": "twodg_pyro.pipeline.outputs.results",
    "RunFolder": "twodg_pyro.pipeline.runtime.run_folder",
    "RunFolderError": "twodg_pyro.pipeline.runtime.run_folder",
    "RunFolderLocked": "twodg_pyro.pipeline.runtime.run_folder",
    "run": "twodg_pyro.pipeline.runtime.runner",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
