r"""Model files for every method: one save/load API.

:func:`save_model` writes a trained model and guide of any of the library's methods to
one file; :func:`load_model` reads any model file the library writes and returns
``(model, guide)`` ready for :func:`~twodg_pyro.prediction.predict`, the ArviZ export or
further training:

========================  ==================================  ===========================
method                    guide                               file (``kind`` in header)
========================  ==================================  ===========================
``mean_field``            :class:`~twodg_pyro.guides.MeanFieldGuide`   ``twodg_pyro.BNN``
``rank1``                 :class:`~twodg_pyro.guides.Rank1Guide`       ``twodg_pyro.BNN``
``ssvi``                  :class:`~twodg_pyro.guides.SSVIGuide`        ``twodg_pyro.BNN``
``2dg``                   :class:`~twodg_pyro.guides.SharedGMMGuide`   ``twodg_pyro.SharedGMMBNN``
                                                                        (:mod:`.bnn_file`)
compact 2DG / INT8 MF     (``.2dgz``, :mod:`.compact`)         magic bytes ``2DGZ``
========================  ==================================  ===========================

:func:`load_model` dispatches on the file: the compact format's magic bytes, else the
header's ``kind`` (and, for ``twodg_pyro.BNN``, its ``method``).  Every full file is
plain tensors plus a JSON header, read with ``torch.load(weights_only=True)``, sealed
with a SHA-256 content checksum (:mod:`twodg_pyro.files.integrity`) that is verified on
load, with NaN/inf parameters refused; a damaged or foreign file is a ``ValueError``
naming it.

Layout of a ``twodg_pyro.BNN`` file (format version 1):

* ``header``: ``kind``, ``format_version``, ``method``, ``guide``
  (``{"class", "kwargs"}``: the constructor arguments that fix the parameters' shapes,
  e.g. an SSVI guide's ``density``), ``model`` (``{"class": "BNNModel"}`` or
  ``{"class": "Rank1BNNModel", "components", "routing", "layers"}``), ``site_names``,
  the likelihood, the prior (:mod:`twodg_pyro.io.specs`), the network's ``dtype``, the
  network spec (``{"name", "kwargs"}`` for :func:`twodg_pyro.models.build_network`, or
  ``None``: pass ``net=`` to the loader) and optionally ``evaluation`` (how the
  pipeline evaluated it: seed, draws, data, metrics);
* ``guide/<name>``: the guide's ``state_dict`` (an SSVI guide's active indices too);
* ``net/<name>``: the network's ``state_dict`` (a rank-1 BNN's shared weights, BatchNorm,
  and the frozen initial values of the Bayesian tensors);
* ``prior/<site>``: a ``PretrainedPrior``'s centres when they are not the network's;
* ``checksum``.

Refused at save time, each with a ``TypeError`` saying what to use: a Pyro autoguide
(``AutoNormal``, ...: use :class:`~twodg_pyro.guides.MeanFieldGuide`, or Pyro's
``pyro.get_param_store().save``), and any guide or model of another kind.  A prior that
cannot be stored warns (:class:`~twodg_pyro.io.specs.PriorNotStoredWarning`) and loads
as an :class:`~twodg_pyro.io.specs.UnavailablePrior`, never as a silent N(0, 1).
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from ..files.payload import PayloadFormat, payload_section, read_payload, write_payload
from .specs import (
    exact_include,
    likelihood_spec,
    prior_spec,
    rebuild_bnn_model,
    rebuild_parts,
    site_types,
)

__all__ = [
    "MODEL_FILE_KIND",
    "MODEL_FILE_VERSION",
    "load_model",
    "load_model_file",
    "read_model_header",
    "save_model",
]

MODEL_FILE_KIND = "twodg_pyro.BNN"
MODEL_FILE_VERSION = 1
_FORMAT = PayloadFormat(
    kind=MODEL_FILE_KIND,
    version=MODEL_FILE_VERSION,
    noun="a twodg_pyro model file",
    header_noun="the model file's header",
    kind_noun="a twodg_pyro model file",
    finite_prefixes=("guide/", "net/", "prior/"),
)
_METHODS = ("mean_field", "rank1", "ssvi")


def _refuse_autoguide(guide, what: str) -> None:
    try:
        from pyro.infer.autoguide import AutoGuide
    except ImportError:  # pragma: no cover
        return
    if isinstance(guide, AutoGuide):
        raise TypeError(
            f"{what} does not store a Pyro autoguide ({type(guide).__name__}): its "
            "parameters live in Pyro's param store (save them with "
            "pyro.get_param_store().save(path)). For a model file, train "
            "twodg_pyro.guides.MeanFieldGuide(model) (the same mean-field Normal family) or "
            "SharedGMMGuide / Rank1Guide / SSVIGuide"
        )


def _guide_spec(model, guide) -> tuple[str, dict, dict]:
    """``(method, guide spec, model spec)``."""
    from ..guides import MeanFieldGuide, Rank1BNNModel, Rank1Guide, SSVIGuide
    from ..model import BNNModel

    if isinstance(guide, Rank1Guide):
        if not isinstance(model, Rank1BNNModel):
            raise TypeError(f"a Rank1Guide goes with a Rank1BNNModel, got {type(model).__name__}")
        layers = [layer.module_name for layer in model.layers]
        model_spec = {
            "class": "Rank1BNNModel",
            "components": model.components,
            "routing": model.routing,
            "layers": layers,
        }
        return "rank1", {"class": "Rank1Guide", "kwargs": {}}, model_spec
    if not isinstance(model, BNNModel):
        raise TypeError(
            f"save_model stores a BNNModel or a Rank1BNNModel, got {type(model).__name__}"
        )
    if isinstance(guide, SSVIGuide):
        init = guide.init_scale
        kwargs = {"density": guide.density, "init_scale": init}
        return "ssvi", {"class": "SSVIGuide", "kwargs": kwargs}, {"class": "BNNModel"}
    if isinstance(guide, MeanFieldGuide):
        return "mean_field", {"class": "MeanFieldGuide", "kwargs": {}}, {"class": "BNNModel"}
    raise TypeError(
        f"save_model stores MeanFieldGuide, SharedGMMGuide, Rank1Guide and SSVIGuide, got "
        f"{type(guide).__name__}"
    )


def save_model(
    path: str | Path,
    model,
    guide,
    network: dict | None = None,
    evaluation: dict | None = None,
) -> Path:
    """Write a trained ``model`` and ``guide`` of any method to ``path``, atomically.

    Args:
        path: the file (conventionally ``model_<method>.pt``).
        model: the :class:`~twodg_pyro.model.BNNModel` (or
            :class:`~twodg_pyro.guides.Rank1BNNModel`).
        guide: a mean-field, shared-GMM (written by :func:`~twodg_pyro.io.save_2dg`),
            rank-1 or SSVI guide.
        network: ``{"name", "kwargs"}`` for :func:`twodg_pyro.models.build_network`, so
            that :func:`load_model` needs no ``net``.
        evaluation: optional record of how the model was evaluated (JSON-able).

    Returns the path.

    Raises:
        TypeError: a Pyro autoguide or a guide/model of another kind (the message says
            what to use).
    """
    from ..guides import SharedGMMGuide

    _refuse_autoguide(guide, "save_model")
    if isinstance(guide, SharedGMMGuide):
        from .bnn_file import save_2dg

        save_2dg(path, model, guide, network=network, evaluation=evaluation)
        return Path(path)
    method, g_spec, m_spec = _guide_spec(model, guide)
    prior, prior_tensors = prior_spec(model.prior, model)
    header = {
        "kind": MODEL_FILE_KIND,
        "format_version": MODEL_FILE_VERSION,
        "method": method,
        "guide": g_spec,
        "model": m_spec,
        "site_names": model.site_names,
        "likelihood": likelihood_spec(model.likelihood),
        "prior": prior,
        "network": network,
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    if evaluation is not None:
        header["evaluation"] = evaluation
    payload: dict = {"header": json.dumps(header)}
    for k, v in guide.state_dict().items():
        payload[f"guide/{k}"] = v.detach().cpu().clone()
    for k, v in model.net.state_dict().items():
        payload[f"net/{k}"] = v.detach().cpu().clone()
    for k, v in prior_tensors.items():
        payload[f"prior/{k}"] = v
    return write_payload(payload, path)


def _check_header(header: dict, where: str) -> None:
    from .bnn_file import check_common_header

    check_common_header(header, where)
    if header.get("method") not in _METHODS:
        raise ValueError(
            f"{where!r}: the header's method {header.get('method')!r:.40} is not one of "
            f"{list(_METHODS)}"
        )
    for field in ("guide", "model"):
        spec = header.get(field)
        if not isinstance(spec, dict) or not isinstance(spec.get("class"), str):
            raise ValueError(f"{where!r}: the header's {field} is not a table with a class")


def _rebuild(payload: dict, header: dict, where: str, net, prior, device):
    from ..guides import MeanFieldGuide, Rank1BNNModel, Rank1Guide, SSVIGuide

    _check_header(header, where)
    net, lik, prior = rebuild_parts(payload, header, where, net, prior)
    m_spec, g_spec = header["model"], header["guide"]
    try:
        if header["method"] == "rank1":
            layers = list(m_spec["layers"])
            model = Rank1BNNModel(
                net,
                prior=prior,
                likelihood=lik,
                components=int(m_spec["components"]),
                layer_types=site_types(net, layers),
                include=exact_include([f"{m}.weight" if m else "weight" for m in layers]),
                routing=m_spec.get("routing", "modulo"),
            )
            if model.site_names != header["site_names"]:
                raise ValueError(
                    f"its factor sites are {model.site_names[:4]}..., the file's "
                    f"{header['site_names'][:4]}..."
                )
            guide = Rank1Guide(model, **g_spec.get("kwargs", {}))
        else:
            model = rebuild_bnn_model(net, prior, lik, header["site_names"], where)
            if header["method"] == "ssvi":
                guide = SSVIGuide(model, **g_spec.get("kwargs", {}))
            else:
                guide = MeanFieldGuide(model, **g_spec.get("kwargs", {}))
        guide.load_state_dict(payload_section(payload, "guide/"))
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as e:
        if where in str(e):
            raise
        raise ValueError(
            f"{where!r}: its {header['method']} guide does not fit the saved network: "
            f"{type(e).__name__}: {e}"
        ) from e
    return model.to(device), guide.to(device)


def load_model(path: str | Path, net: nn.Module | None = None, prior=None, device="cpu"):
    """Read any model file of the library: ``(model, guide)``.

    Full files of every method (:func:`save_model`, :func:`~twodg_pyro.io.save_2dg`) and
    compact ``.2dgz`` files (:func:`~twodg_pyro.io.export_compact`), told apart by their
    magic bytes and header.

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
            (checksum), NaN/inf parameters, a header missing a field, or a network that
            does not match the saved one.
    """
    from ..files.atomic import safe_torch_load
    from .compact import is_compact_file, load_compact

    if is_compact_file(path):
        return load_compact(path, net=net, prior=prior, device=device)
    loaded = safe_torch_load(path)
    kind = _peek_kind(loaded)
    if kind == MODEL_FILE_KIND:
        payload, header = read_payload(path, _FORMAT, loaded=loaded)
        return _rebuild(payload, header, str(path), net, prior, device)
    from .baseline_file import BASELINE_FILE_KIND
    from .bnn_file import _FORMAT as FORMAT_2DG
    from .bnn_file import load_2dg_payload

    if kind == BASELINE_FILE_KIND:
        raise ValueError(
            f"{str(path)!r} is a model file of a non-Bayesian baseline (an ensemble, a "
            "Laplace approximation or a network), not a model and guide: read it with "
            "twodg_pyro.io.load_baseline(path); twodg-pyro evaluate takes it as it is"
        )
    if kind == FORMAT_2DG.kind or kind is None:  # (no kind: the 2DG reader names the problem)
        payload, header = read_payload(path, FORMAT_2DG, loaded=loaded)
        return load_2dg_payload(payload, header, str(path), net=net, prior=prior, device=device)
    raise ValueError(
        f"{str(path)!r} is not a twodg_pyro model file (kind {kind!r}; a checkpoint is read "
        "with twodg_pyro.files.checkpoint.load_checkpoint)"
    )


def _peek_kind(loaded) -> str | None:
    if not isinstance(loaded, dict) or not isinstance(loaded.get("header"), str):
        return None
    try:
        header = json.loads(loaded["header"])
    except (json.JSONDecodeError, RecursionError):
        return None
    return header.get("kind") if isinstance(header, dict) else None


def read_model_header(path: str | Path) -> dict:
    """The JSON header of a full model file (a baseline's too,
    :mod:`~twodg_pyro.io.baseline_file`), verified like :func:`load_model` does, or of a
    compact file; ``{}`` when the file is none of them (the loader then names the
    problem)."""
    from ..files.atomic import safe_torch_load
    from .compact import is_compact_file, read_compact

    if is_compact_file(path):
        return dict(read_compact(path)[0])
    loaded = safe_torch_load(path)
    kind = _peek_kind(loaded)
    from .baseline_file import BASELINE_FORMAT
    from .bnn_file import _FORMAT as FORMAT_2DG

    formats = (_FORMAT, FORMAT_2DG, BASELINE_FORMAT)
    fmt = {f.kind: f for f in formats}.get(kind)
    if fmt is None:
        return {}
    return read_payload(path, fmt, loaded=loaded)[1]


def load_model_file(path: str | Path, net=None, prior=None, device="cpu"):
    """``(model, guide)`` from any model file: :func:`~twodg_pyro.io.load_model` (full
    files of every method and compact ones, told apart by magic bytes and header)."""
    return load_model(path, net=net, prior=prior, device=device)
