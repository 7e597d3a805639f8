"""Algorithm 1 end to end, its settings, and the results table."""

from .config import (
    ConfigError,
    DataConfig,
    NetworkConfig,
    PriorConfig,
    RunConfig,
    SharingConfig,
    Stage1Config,
    Stage3Config,
    config_from_dict,
    load_config,
)
from .data_parallel import run_distributed
from .results import format_table, read_results, write_results
from .run_folder import RunFolder, RunFolderError, RunFolderLocked
from .runner import run

__all__ = [
    "ConfigError",
    "DataConfig",
    "NetworkConfig",
    "PriorConfig",
    "RunConfig",
    "RunFolder",
    "RunFolderError",
    "RunFolderLocked",
    "SharingConfig",
    "Stage1Config",
    "Stage3Config",
    "config_from_dict",
    "format_table",
    "load_config",
    "read_results",
    "run",
    "run_distributed",
    "write_results",
]
