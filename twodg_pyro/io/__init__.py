"""Files: atomic writes and loading without executing code; full and compact model files."""

from .bnn_file import load_2dg, save_2dg
from .compact import export_compact, load_compact, load_model_file
from .files import atomic_torch_save, safe_torch_load

__all__ = [
    "atomic_torch_save",
    "export_compact",
    "load_2dg",
    "load_compact",
    "load_model_file",
    "safe_torch_load",
    "save_2dg",
]
