r"""Model files for every method: one save/load API.

:func:`save_model` writes a trained model and guide of any of the library's methods to
one file; :func:`load_model` reads any model file the library writes and returns
``(model, guide)`` ready for :func:`~twodg_pyro.prediction.predict`, the ArviZ export or
further training:

========================  ============================================  ======================
method                    guide                                         file (header ``kind``)
========================  ============================================  ======================
``mean_field``            :class:`~twodg_pyro.guides.MeanFieldGuide`    ``twodg_pyro.BNN``
``rank1``                 :class:`~twodg_pyro.guides.Rank1Guide`        ``twodg_pyro.BNN``
``ssvi``                  :class:`~twodg_pyro.guides.SSVIGuide`         ``twodg_pyro.BNN``
``2dg``                   :class:`~twodg_pyro.guides.SharedGMMGuide`    ``twodg_pyro.SharedGMMBNN``
compact 2DG / INT8 MF     (``.2dgz``, :mod:`.compact`)                  magic bytes ``2DGZ``
baselines                 a method's ``save`` (not a guide)             ``twodg_pyro.Baseline``
========================  ============================================  ======================

The files' layout and versions, and the registry of the methods' file support (a new
method is one :func:`register_guide_file`), are :mod:`twodg_pyro.io.model_format`.
:func:`load_model` dispatches on the compact format's magic bytes, else the header's
``kind`` (and, for ``twodg_pyro.BNN``, its ``method``); a 2DG file of version 1 (written
before checksums) is refused like any other version.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from ..files.atomic import safe_torch_load
from ..files.payload import read_payload
from ..guides import SharedGMMGuide
from .model_format import (
    BASELINE_FORMAT,
    BNN_FILE,
    FORMATS,
    SHARED_GMM_FILE,
    model_from_payload,
    write_model_file,
)


def save_model(
    path: str | Path, model, guide, network: dict | None = None, evaluation: dict | None = None
) -> Path:
    """Write a trained ``model`` and ``guide`` of any registered method to ``path``,
    atomically.

    Args:
        path: the file (conventionally ``model_<method>.pt``).
        model: the :class:`~twodg_pyro.bnn.BNNModel` (or
            :class:`~twodg_pyro.guides.Rank1BNNModel`).
        guide: a mean-field, shared-GMM, rank-1 or SSVI guide, or one of a type
            registered with :func:`~twodg_pyro.io.model_format.register_guide_file`.
        network: ``{"name", "kwargs"}`` for :func:`twodg_pyro.models.build_network`, so
            that :func:`load_model` needs no ``net``.
        evaluation: optional record of how the model was evaluated (JSON-able; the
            pipeline stores its seed, draws, data settings and metrics, and
            ``twodg-pyro evaluate`` takes its defaults from it).

    Returns the path.

    Raises:
        TypeError: a Pyro autoguide (``AutoNormal``, ...: the message says to train a
            :class:`~twodg_pyro.guides.MeanFieldGuide` or save Pyro's param store), a
            guide of an unregistered type, or a model of another class than its method's.
    """
    return write_model_file(path, model, guide, network, evaluation)


def load_model(
    path: str | Path, net: nn.Module | None = None, prior=None, device="cpu", loaded=None
):
    """Read any model file of the library: ``(model, guide)``.

    Full files of every method (:func:`save_model`) and compact ``.2dgz`` files
    (:func:`~twodg_pyro.io.export_compact`), told apart by their magic bytes and header.

    Args:
        net: the network architecture (its weights are restored from the file); built
            from the file's network spec when ``None``.
        prior: the prior (default: the saved one; a prior the file could not store loads
            as an :class:`~twodg_pyro.io.specs.UnavailablePrior`, with a warning).
        device: where the model and guide go, whatever device they were saved from; they
            keep the saved dtype.
        loaded: the file's content already read (safely), not read again.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: not a model file, another format version, corrupted
            (checksum), NaN/inf parameters, a header missing a field, or a network (or
            sharing structure) that does not match the saved one.
    """
    from .compact import is_compact_file, load_compact

    if is_compact_file(path):
        return load_compact(path, net=net, prior=prior, device=device)
    loaded, kind = _load(path, loaded)
    if kind == BASELINE_FORMAT.kind:
        raise ValueError(
            f"{str(path)!r} is a model file of a baseline (an ensemble, a Laplace "
            "approximation, MCMC chains or a network), not a model and guide: read it with "
            "twodg_pyro.methods.load_method(path); twodg-pyro evaluate takes it as it is"
        )
    if kind is not None and kind not in (BNN_FILE.fmt.kind, SHARED_GMM_FILE.fmt.kind):
        raise ValueError(
            f"{str(path)!r} is not a twodg_pyro model file (kind {kind!r}; a checkpoint is "
            "read with twodg_pyro.infer.checkpoint.load_checkpoint)"
        )
    fmt = FORMATS.get(kind, BNN_FILE.fmt)  # (no kind: the reader names the problem)
    payload, header = read_payload(path, fmt, loaded=loaded)
    return model_from_payload(payload, header, str(path), net=net, prior=prior, device=device)


def _load(path, loaded=None) -> tuple[object, str | None]:
    """A full file's content (loaded safely, unless given) and its header's ``kind``
    (``None``: none)."""
    loaded = safe_torch_load(path) if loaded is None else loaded
    try:
        header = json.loads(loaded["header"])
    except (TypeError, KeyError, IndexError, json.JSONDecodeError, RecursionError):
        return loaded, None
    return loaded, header.get("kind") if isinstance(header, dict) else None


def read_model_header(path: str | Path) -> dict:
    """The JSON header of a full model file (a baseline's too), verified like
    :func:`load_model` does, or of a compact file; ``{}`` when the file is none of them
    (the loader then names the problem)."""
    from .compact import is_compact_file, read_compact

    if is_compact_file(path):
        return dict(read_compact(path)[0])
    loaded, kind = _load(path)
    fmt = FORMATS.get(kind)
    return {} if fmt is None else read_payload(path, fmt, loaded=loaded)[1]


#: :func:`load_model` (full files of every method and compact ones) by another name.
load_model_file = load_model


def save_2dg(
    path: str | Path, model, guide, network: dict | None = None, evaluation: dict | None = None
) -> Path:
    """:func:`save_model` for a trained 2DG BNN only: ``model`` + its
    :class:`~twodg_pyro.guides.SharedGMMGuide` (the sharing structure included).

    Raises:
        TypeError: ``guide`` is not a :class:`~twodg_pyro.guides.SharedGMMGuide` (use
            :func:`save_model`, which stores every method).
    """
    if not isinstance(guide, SharedGMMGuide):
        raise TypeError(
            f"save_2dg stores a SharedGMMGuide, got {type(guide).__name__}: use "
            "twodg_pyro.io.save_model(path, model, guide), which stores every method"
        )
    return save_model(path, model, guide, network=network, evaluation=evaluation)


def load_2dg(path: str | Path, net: nn.Module | None = None, prior=None, device="cpu"):
    """:func:`load_model` for a 2DG BNN's full file only (:func:`save_2dg`): ``(model,
    guide)``, in the saved dtype on ``device``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: not a 2DG BNN's file, or any refusal of
            :func:`load_model`.
    """
    payload, header = read_payload(path, SHARED_GMM_FILE.fmt)
    return model_from_payload(payload, header, str(path), net=net, prior=prior, device=device)
