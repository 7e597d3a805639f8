"""Files: atomic writes and loading without executing code; model files of every method
(:func:`save_model` / :func:`load_model`), the 2DG format underneath them
(:func:`save_2dg` / :func:`load_2dg`), compact ``.2dgz`` files, and the non-Bayesian
baselines' files (:func:`save_baseline` / :func:`load_baseline`)."""

from .baseline_file import load_baseline, save_baseline
from .bnn_file import load_2dg, save_2dg
from .compact import export_compact, load_compact
from .files import atomic_torch_save, safe_torch_load
from .model_file import load_model, load_model_file, read_model_header, save_model
from .specs import PriorNotStoredWarning, UnavailablePrior

__all__ = [
    "PriorNotStoredWarning",
    "UnavailablePrior",
    "atomic_torch_save",
    "export_compact",
    "load_2dg",
    "load_baseline",
    "load_compact",
    "load_model",
    "load_model_file",
    "read_model_header",
    "safe_torch_load",
    "save_2dg",
    "save_baseline",
    "save_model",
]
