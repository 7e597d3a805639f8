"""Files: atomic writes and loading without executing code."""

from .bnn_file import load_2dg, save_2dg
from .files import atomic_torch_save, safe_torch_load

__all__ = ["atomic_torch_save", "load_2dg", "safe_torch_load", "save_2dg"]
