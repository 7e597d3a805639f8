"""Model files of every Bayesian model and guide (:func:`save_model` / :func:`load_model`;
a 2DG BNN's alone: :func:`save_2dg` / :func:`load_2dg`), a new guide's file support as
one :func:`register_guide_file` (:mod:`.model_format`), compact ``.2dgz`` files, and the
container every trained method's file uses (:mod:`twodg_pyro.methods` writes and reads
the baselines' through it).  The file
plumbing below them (atomic writes, safe loading, checksums, checkpoints) is
:mod:`twodg_pyro.files`."""

from .compact import export_compact, load_compact
from .model_file import (
    load_2dg,
    load_model,
    load_model_file,
    read_model_header,
    save_2dg,
    save_model,
)
from .model_format import register_guide_file
from .specs import PriorNotStoredWarning, UnavailablePrior

__all__ = [
    "PriorNotStoredWarning",
    "UnavailablePrior",
    "export_compact",
    "load_2dg",
    "load_compact",
    "load_model",
    "load_model_file",
    "read_model_header",
    "register_guide_file",
    "save_2dg",
    "save_model",
]
