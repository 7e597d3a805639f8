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
ensemble, laplace, mcmc  :func:`save_baseline` (not a guide)           ``twodg_pyro.Baseline``
========================  ============================================  ======================

The files' layout and versions, and the registry of the methods' file support (a new
method is one :func:`register_guide_file`), are :mod:`twodg_pyro.io.model_format`.
:func:`load_model` dispatches on the compact format's magic bytes, else the header's
``kind`` (and, for ``twodg_pyro.BNN``, its ``method``); a 2DG file of version 1 (written
before checksums) is refused like any other version.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from torch import nn

from ..files.atomic import safe_torch_load
from ..files.payload import payload_section, read_payload, write_payload
from ..guides import SharedGMMGuide
from .model_format import (
    BASELINE_FORMAT,
    BNN_FILE,
    FORMATS,
    SHARED_GMM_FILE,
    check_spec_fields,
    header_error,
    header_json,
    model_from_payload,
    register_guide_file,
    state_tensors,
    write_model_file,
)
from .specs import (
    likelihood_spec,
    prior_spec,
    rebuild_bnn_model,
    rebuild_likelihood,
    rebuild_network,
    rebuild_prior,
)

__all__ = [
    "BASELINE_FILE_KIND",
    "load_2dg",
    "load_baseline",
    "load_model",
    "load_model_file",
    "read_model_header",
    "register_guide_file",
    "save_2dg",
    "save_baseline",
    "save_model",
]

BASELINE_FILE_KIND = BASELINE_FORMAT.kind
_BASELINES = ("ensemble", "laplace", "mcmc", "network")


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


def load_model(path: str | Path, net: nn.Module | None = None, prior=None, device="cpu"):
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

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: not a model file, another format version, corrupted
            (checksum), NaN/inf parameters, a header missing a field, or a network (or
            sharing structure) that does not match the saved one.
    """
    from .compact import is_compact_file, load_compact

    if is_compact_file(path):
        return load_compact(path, net=net, prior=prior, device=device)
    loaded, kind = _load(path)
    if kind == BASELINE_FORMAT.kind:
        raise ValueError(
            f"{str(path)!r} is a model file of a non-Bayesian baseline (an ensemble, a "
            "Laplace approximation or a network), not a model and guide: read it with "
            "twodg_pyro.io.load_baseline(path); twodg-pyro evaluate takes it as it is"
        )
    if kind is not None and kind not in (BNN_FILE.fmt.kind, SHARED_GMM_FILE.fmt.kind):
        raise ValueError(
            f"{str(path)!r} is not a twodg_pyro model file (kind {kind!r}; a checkpoint is "
            "read with twodg_pyro.infer.checkpoint.load_checkpoint)"
        )
    fmt = FORMATS.get(kind, BNN_FILE.fmt)  # (no kind: the reader names the problem)
    payload, header = read_payload(path, fmt, loaded=loaded)
    return model_from_payload(payload, header, str(path), net=net, prior=prior, device=device)


def _load(path) -> tuple[object, str | None]:
    """A full file's content (loaded safely) and its header's ``kind`` (``None``: none)."""
    loaded = safe_torch_load(path)
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
    from ..baselines.ensemble import Ensemble
    from ..baselines.laplace import LaplacePosterior
    from ..infer.mcmc import MCMCPosterior

    if isinstance(obj, Ensemble):
        kind = "ensemble"
    elif isinstance(obj, LaplacePosterior):
        kind = "laplace"
    elif isinstance(obj, MCMCPosterior):
        kind = "mcmc"
    elif isinstance(obj, nn.Module) and not hasattr(obj, "site_names"):
        kind = "network"
    else:
        raise TypeError(
            f"save_baseline stores an Ensemble, a LaplacePosterior, an MCMCPosterior or a plain "
            f"network, got "
            f"{type(obj).__name__} (a BNN's model and guide: twodg_pyro.io.save_model)"
        )
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
    if kind == "mcmc":
        prior, prior_tensors = prior_spec(obj.model.prior, obj.model)
        fields["mcmc"] = {
            "site_names": obj.model.site_names,
            "prior": prior,
            "likelihood": likelihood_spec(obj.model.likelihood),
            "settings": obj.settings,
            "stats": sorted(obj.sample_stats),
        }
        payload["mcmc/draws"] = obj.draws.detach().cpu().clone()
        for name, value in obj.sample_stats.items():
            payload[f"mcmc/stats/{name}"] = value.detach().cpu().clone()
        for name, value in prior_tensors.items():
            payload[f"prior/{name}"] = value
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
    if kind == "mcmc":
        return _load_mcmc(header["mcmc"], payload, network, where).to(device)
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


def _load_mcmc(mc: dict, payload: dict, network: nn.Module, where: str):
    """The :class:`~twodg_pyro.infer.mcmc.MCMCPosterior` of a baseline file's ``mcmc``
    table and tensors, over the rebuilt ``network``."""
    from ..infer.mcmc import MCMCPosterior

    prior = rebuild_prior(mc["prior"], network, where, payload_section(payload, "prior/"))
    model = rebuild_bnn_model(
        network, prior, rebuild_likelihood(mc["likelihood"]), mc["site_names"], where
    )
    try:
        stats = {name: payload[f"mcmc/stats/{name}"] for name in mc["stats"]}
        return MCMCPosterior(model, payload["mcmc/draws"], stats, mc["settings"])
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"{where!r}: its MCMC draws do not fit the saved network: {type(e).__name__}: {e}"
        ) from e


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
    mc = header.get("mcmc")
    if header["baseline"] == "mcmc" and not (
        isinstance(mc, dict)
        and isinstance(mc.get("site_names"), list)
        and isinstance(mc.get("settings"), dict)
        and isinstance(mc.get("stats"), list)
        and isinstance(mc.get("likelihood"), dict)
    ):
        raise bad("mcmc", "is not a table of the chains' sites, settings and statistics")
    la = header.get("laplace")
    if header["baseline"] == "laplace" and not (
        isinstance(la, dict)
        and all(isinstance(la.get(k), str) for k in ("subset", "hessian", "pred_type"))
        and isinstance(la.get("param_names"), list)
        and isinstance(la.get("block_sizes"), list)
        and isinstance(la.get("h_factor"), (int, float))
    ):
        raise bad("laplace", "is not a table of the approximation's settings")
