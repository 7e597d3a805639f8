"""Model files of the non-Bayesian baselines: a deep ensemble, a post-hoc Laplace
approximation, or one deterministic network.

The same container as every model file of the library (:mod:`twodg_pyro.files.payload`):
plain tensors plus a JSON header, read with ``torch.load(weights_only=True)``, sealed
with a SHA-256 content checksum verified on load, NaN/inf refused; a damaged or foreign
file is a ``ValueError`` naming it.  Nothing of laplace-torch is pickled: a Laplace
approximation is stored as its network plus the fitted precision factors, and rebuilt as
a :class:`~twodg_pyro.baselines.LaplacePosterior` (which predicts without laplace-torch).

Layout (``kind = "twodg_pyro.Baseline"``, format version 1):

* ``header``: ``kind``, ``format_version``, ``method`` (the results row:
  ``"ensemble"``, ``"laplace"``, ``"deterministic_matched"``, ...), ``baseline``
  (``"ensemble"``, ``"laplace"`` or ``"network"``), the network spec (``{"name",
  "kwargs"}`` for :func:`twodg_pyro.models.build_network`, or ``None``: pass ``net=``),
  the network's ``dtype``, optionally ``evaluation`` (the run's seed, draws, data and
  metrics); an ensemble's ``members``; a Laplace approximation's ``laplace`` table
  (``subset``, ``hessian``, ``pred_type``, ``param_names``, ``block_sizes``,
  ``h_factor``);
* ``member/<m>/<name>``: member ``m``'s ``state_dict`` (ensemble);
* ``net/<name>``: the network's ``state_dict`` (Laplace: the MAP; network);
* ``laplace/prior_precision``, ``laplace/kfac/<i>/<j>`` (Kronecker factor ``j`` of
  covered tensor ``i``) or ``laplace/diag``;
* ``checksum``.
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from ..files.payload import payload_section, read_payload, write_payload
from .model_format import (
    BASELINE_FORMAT,
    check_spec_fields,
    header_error,
    header_json,
    state_tensors,
)
from .specs import rebuild_network

__all__ = ["BASELINE_FILE_KIND", "baseline_kind", "load_baseline", "save_baseline"]

BASELINE_FILE_KIND = BASELINE_FORMAT.kind
_BASELINES = ("ensemble", "laplace", "network")


def baseline_kind(obj) -> str:
    """``"ensemble"``, ``"laplace"`` or ``"network"`` for what :func:`save_baseline`
    stores.

    Raises:
        TypeError: anything else (a BNN's model and guide go to
            :func:`~twodg_pyro.io.save_model`).
    """
    from ..baselines.ensemble import Ensemble
    from ..baselines.laplace import LaplacePosterior

    if isinstance(obj, Ensemble):
        return "ensemble"
    if isinstance(obj, LaplacePosterior):
        return "laplace"
    if isinstance(obj, nn.Module) and not hasattr(obj, "site_names"):
        return "network"
    raise TypeError(
        f"save_baseline stores an Ensemble, a LaplacePosterior or a plain network, got "
        f"{type(obj).__name__} (a BNN's model and guide: twodg_pyro.io.save_model)"
    )


def save_baseline(
    path: str | Path,
    obj,
    network: dict | None = None,
    evaluation: dict | None = None,
    method: str | None = None,
) -> Path:
    """Write a baseline to ``path`` atomically (conventionally ``model_<method>.pt``).

    Args:
        obj: an :class:`~twodg_pyro.baselines.Ensemble`, a
            :class:`~twodg_pyro.baselines.LaplacePosterior` or a trained network.
        network: ``{"name", "kwargs"}`` for :func:`twodg_pyro.models.build_network`, so
            that :func:`load_baseline` needs no ``net``.
        evaluation: optional record of how it was evaluated (JSON-able).
        method: the results row's name (default: ``"ensemble"``, ``"laplace"`` or
            ``"deterministic"``).

    Raises:
        TypeError: another kind of object.
    """
    kind = baseline_kind(obj)
    net = obj.net if kind != "network" else obj
    fields = {
        "method": method or {"network": "deterministic"}.get(kind, kind),
        "baseline": kind,
        "network": network,
        "dtype": str(next(net.parameters()).dtype).removeprefix("torch."),
    }
    payload: dict = {}
    if kind == "ensemble":
        fields["members"] = obj.num_members
        for m, member in enumerate(obj.members):
            payload.update(state_tensors(member, f"member/{m}/"))
    else:
        payload.update(state_tensors(net, "net/"))
    if kind == "laplace":
        fields["laplace"] = {
            "subset": obj.subset,
            "hessian": obj.hessian,
            "pred_type": obj.pred_type,
            "param_names": obj.param_names,
            "block_sizes": obj.block_sizes,
            "h_factor": obj.h_factor,
        }
        payload["laplace/prior_precision"] = obj.prior_precision.detach().cpu().clone()
        if obj.hessian == "diag":
            payload["laplace/diag"] = obj.diag_h.detach().cpu().clone()
        else:
            for i, block in enumerate(obj.factors):
                for j, f in enumerate(block):
                    payload[f"laplace/kfac/{i}/{j}"] = f.detach().cpu().clone()
    return write_payload(
        {"header": header_json(BASELINE_FORMAT, fields, evaluation), **payload}, path
    )


def load_baseline(path: str | Path, net: nn.Module | None = None, device="cpu"):
    """Read a file of :func:`save_baseline`: the :class:`~twodg_pyro.baselines.Ensemble`,
    :class:`~twodg_pyro.baselines.LaplacePosterior` or network, on ``device`` in the
    saved dtype.

    Args:
        net: the architecture (weights from the file; copied for each ensemble member);
            built from the file's network spec when ``None``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: not a baseline model file, another format version,
            corrupted (checksum), NaN/inf, a header missing a field, or a network that
            does not match the saved one.
    """
    from ..baselines.ensemble import Ensemble
    from ..baselines.laplace import LaplacePosterior

    payload, header = read_payload(path, BASELINE_FORMAT)
    where = str(path)
    _check_header(header, where)
    kind = header["baseline"]
    if kind == "ensemble":
        members = []
        for m in range(header["members"]):
            state = payload_section(payload, f"member/{m}/")
            if not state:
                raise ValueError(f"{where!r}: ensemble member {m} is missing")
            arch = None if net is None else copy.deepcopy(net)
            members.append(rebuild_network(header, arch, state, where))
        return Ensemble(members).to(device)
    network = rebuild_network(header, net, payload_section(payload, "net/"), where)
    if kind == "network":
        return network.eval().to(device)
    la = header["laplace"]
    try:
        if la["hessian"] == "diag":
            factors = payload["laplace/diag"]
        else:
            factors = [
                [payload[f"laplace/kfac/{i}/{j}"] for j in range(len(sizes))]
                for i, sizes in enumerate(la["block_sizes"])
            ]
        post = LaplacePosterior(
            network,
            subset=la["subset"],
            hessian=la["hessian"],
            param_names=la["param_names"],
            factors=factors,
            prior_precision=payload["laplace/prior_precision"],
            h_factor=float(la["h_factor"]),
            pred_type=la["pred_type"],
        )
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ValueError(
            f"{where!r}: its Laplace approximation does not fit the saved network: "
            f"{type(e).__name__}: {e}"
        ) from e
    return post.to(device)


def _check_header(header: dict, where: str) -> None:
    def bad(field: str, what: str) -> ValueError:
        return header_error(header, where, field, what)

    if header.get("baseline") not in _BASELINES:
        raise bad("baseline", f"is not one of {list(_BASELINES)}")
    if not isinstance(header.get("method"), str):
        raise bad("method", "is not a method name")
    check_spec_fields(header, where)
    members = header.get("members")
    if header["baseline"] == "ensemble" and (
        isinstance(members, bool) or not isinstance(members, int) or members < 1
    ):
        raise bad("members", "is not an integer >= 1")
    la = header.get("laplace")
    if header["baseline"] == "laplace" and not (
        isinstance(la, dict)
        and all(isinstance(la.get(k), str) for k in ("subset", "hessian", "pred_type"))
        and isinstance(la.get("param_names"), list)
        and isinstance(la.get("block_sizes"), list)
        and isinstance(la.get("h_factor"), (int, float))
    ):
        raise bad("laplace", "is not a table of the approximation's settings")
