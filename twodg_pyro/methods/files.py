"""Reading the model file of any trained method: :func:`load_method` (the writing is
each method's :meth:`~twodg_pyro.methods.TrainedMethod.save`).  The classes of the
library's files are imported here, so that their file tags are registered; a method
defined elsewhere registers its own when its module is imported."""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from ..files.payload import read_payload
from ..io.compact import is_compact_file
from ..io.compact_load import load_compact_parts
from ..io.model_file import _load, load_model
from ..io.model_format import BASELINE_FORMAT, check_spec_fields, header_error
from ..io.specs import rebuild_network
from . import ensemble, laplace, network  # noqa: F401 (their file tags)
from .base import _FILES, TrainedMethod
from .mcmc import posterior  # noqa: F401 (its file tag)
from .posterior import GuidePosterior


def load_method(
    path: str | Path, net: nn.Module | None = None, prior=None, device="cpu"
) -> TrainedMethod:
    """Read the model file of any trained method (full, compact or a baseline's): its
    :class:`TrainedMethod` on ``device`` in the saved dtype (a 2DG + Laplace compact
    file's :class:`~twodg_pyro.methods.laplace.LaplacePosterior` keeps the file's 2DG BNN
    as ``bnn``).

    Args:
        net: the network architecture (weights from the file); built from the file's
            network spec when ``None``.
        prior: a BNN's prior (default: the saved one).

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: not a model file, another format version, corrupted
            (checksum), NaN/inf, a header missing a field, a file tag whose class is not
            defined (its module not imported), or a network that does not match.
    """
    where = str(path)
    if is_compact_file(path):
        model, guide, laplace = load_compact_parts(path, net, prior, device)
        if laplace is None:
            return GuidePosterior(model, guide)
        # a 2DG + Laplace file: the approximation around the 2DG BNN's posterior means,
        # which it keeps as ``bnn`` (diagnose reads that part without reading the file again)
        table, tensors = laplace
        bnn = GuidePosterior(model, guide)
        means = bnn.mean_network()
        method = _file_class(table, "tag", where).from_file(
            {"laplace": table}, tensors, lambda state: means, where
        )
        method.name = table["method"] if isinstance(table.get("method"), str) else method.name
        method.bnn = bnn
        return method.to(device)
    loaded, kind = _load(path)
    if kind != BASELINE_FORMAT.kind:
        return GuidePosterior(*load_model(path, net=net, prior=prior, device=device, loaded=loaded))
    payload, header = read_payload(path, BASELINE_FORMAT, loaded=loaded)
    cls = _file_class(header, "baseline", where)
    if not isinstance(header.get("method"), str):
        raise header_error(header, where, "method", "is not a method name")
    check_spec_fields(header, where)

    def rebuild(state: dict) -> nn.Module:
        return rebuild_network(header, None if net is None else copy.deepcopy(net), state, where)

    method = cls.from_file(header, payload, rebuild, where)
    method.name = header["method"]
    return method.to(device)


def _file_class(header: dict, key: str, where: str) -> type[TrainedMethod]:
    """The method class whose file tag the header's ``key`` names."""
    tag = header.get(key)
    cls = _FILES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise header_error(
            header, where, key, f"is none of the defined methods' files {sorted(_FILES)}"
        )
    return cls
