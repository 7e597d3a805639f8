r"""The model-file format: the kinds of full model files, the header fields they share,
and each method's file support as one registration.

Every full model file (:func:`~twodg_pyro.io.save_model`,
:meth:`~twodg_pyro.methods.TrainedMethod.save`) is the container of :mod:`twodg_pyro.files.payload`:
plain tensors plus a JSON header (``torch.load(weights_only=True)``), sealed with a
SHA-256 content checksum verified on load, NaN/inf parameters refused.

**A BNN's file** (``kind = "twodg_pyro.BNN"``, format version 1, :data:`BNN_FILE`):

* ``header``: ``kind``, ``format_version``, ``method``, the guide's fields (``guide``:
  ``{"class", "kwargs"}``, the constructor arguments that fix the parameters' shapes,
  e.g. an SSVI guide's ``density``), ``model`` (``{"class": "BNNModel"}`` or
  ``{"class": "Rank1BNNModel", "components", "routing", "layers"}``), ``site_names``,
  the likelihood and the prior (:mod:`twodg_pyro.io.specs`: a prior that cannot be
  stored is recorded by its ``repr`` with a warning and loads as an
  :class:`~twodg_pyro.io.specs.UnavailablePrior`), the network spec (``{"name",
  "kwargs"}`` for :func:`twodg_pyro.models.build_network`, or ``None``: pass ``net=``),
  the network's ``dtype`` and optionally ``evaluation`` (how the pipeline evaluated it:
  seed, draws, data, metrics);
* the guide's own sections, if any (a 2DG guide's ``structure/<name>``: its
  :class:`~twodg_pyro.sharing.SharingStructure`);
* ``guide/<name>``: the guide's ``state_dict`` (an SSVI guide's active indices too);
* ``net/<name>``: the network's ``state_dict`` (deterministic parts such as BatchNorm,
  a rank-1 BNN's shared weights, the frozen initial values of the Bayesian tensors);
* ``prior/<site>``: a ``PretrainedPrior``'s centres when they are not the network's;
* ``checksum``.

A 2DG BNN's file keeps the layout it has always had (``kind =
"twodg_pyro.SharedGMMBNN"``, format version 2, :data:`SHARED_GMM_FILE`): its method is
``"2dg"`` and its model a ``BNNModel``, so it has no ``method``, ``guide`` or ``model``
field; the guide's fields are ``tying`` and ``coordinates``, its section the sharing
structure, and ``site_names`` follows the network spec.

**A baseline's file** (``kind = "twodg_pyro.Baseline"``, format version 1,
:data:`BASELINE_FORMAT`), the file of every trained method but a model and guide
(:meth:`~twodg_pyro.methods.TrainedMethod.save`; its fields and tensors are the method's
``file_content``, read back by the class registered under its ``baseline`` tag): a deep
ensemble, a post-hoc Laplace approximation (nothing of laplace-torch is pickled: its
network plus the fitted precision factors, rebuilt as a
:class:`~twodg_pyro.methods.LaplacePosterior`), the thinned chains of a reference
posterior by MCMC (:class:`~twodg_pyro.methods.mcmc.MCMCPosterior`), one deterministic
network, or a method registered elsewhere:

* ``header``: ``kind``, ``format_version``, ``method`` (the results row:
  ``"ensemble"``, ``"laplace"``, ``"deterministic_matched"``, ...), ``baseline``
  (the method class's ``file_tag``: ``"ensemble"``, ``"laplace"``, ``"mcmc"``,
  ``"network"``, ...), the network spec (``{"name",
  "kwargs"}`` for :func:`twodg_pyro.models.build_network`, or ``None``: pass ``net=``),
  the network's ``dtype``, optionally ``evaluation`` (the run's seed, draws, data and
  metrics); an ensemble's ``members``; a Laplace approximation's ``laplace`` table
  (``subset``, ``hessian``, ``pred_type``, ``param_names``, ``block_sizes``,
  ``h_factor``); the chains' ``mcmc`` table (``site_names``, the ``prior`` and
  ``likelihood`` specs, the sampler's ``settings``, the names of the ``stats``);
* ``mcmc/draws`` (``(chains, draws, n_w)``), ``mcmc/stats/<name>`` (``(chains, draws)``)
  and ``prior/<name>`` (MCMC);
* ``member/<m>/<name>``: member ``m``'s ``state_dict`` (ensemble);
* ``net/<name>``: the network's ``state_dict`` (Laplace: the MAP; network);
* ``laplace/prior_precision``, ``laplace/kfac/<i>/<j>`` (Kronecker factor ``j`` of
  covered tensor ``i``, its upper triangle row by row: :func:`pack_upper`;
  files written before it hold the square factor) or ``laplace/diag``;
* ``checksum``.

**A guide's file support** is one :class:`GuideFile` in a registry
(:func:`register_guide_file`; the library's guides are registered at the end of this
module): a new guide is one call, e.g. ``register_guide_file(MyGuide)`` (under the name
``MyGuide.method``) when ``MyGuide(model)`` has the shapes of every trained ``MyGuide``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..bnn import BNNModel
from ..files.integrity import FieldError
from ..files.payload import PayloadFormat, payload_section, write_payload
from ..guides import MeanFieldGuide, Rank1BNNModel, Rank1Guide, SharedGMMGuide, SSVIGuide
from ..guides.tyings import TYINGS
from ..likelihoods import LIKELIHOODS
from ..sharing.structure import SharingStructure
from .specs import (
    exact_include,
    likelihood_spec,
    prior_spec,
    rebuild_bnn_model,
    rebuild_parts,
    site_types,
)

_GUIDE_FIELDS = "<guide>"  # in a layout's fields: where the guide's own go
_FINITE = ("guide/", "net/", "structure/", "prior/")


# ---------------------------------------------------------------------------- headers
def header_json(fmt: PayloadFormat, fields: dict, evaluation: dict | None = None) -> str:
    """A file's JSON header: ``kind`` and ``format_version`` of ``fmt``, ``fields`` in
    their order, and the optional ``evaluation`` record last."""
    header = {"kind": fmt.kind, "format_version": fmt.version, **fields}
    if evaluation is not None:
        header["evaluation"] = evaluation
    return json.dumps(header)


def state_tensors(module: nn.Module, prefix: str) -> dict:
    """``module``'s ``state_dict`` as CPU copies keyed ``prefix + name``."""
    return {f"{prefix}{k}": v.detach().cpu().clone() for k, v in module.state_dict().items()}


def pack_upper(m: torch.Tensor) -> torch.Tensor:
    r"""The upper triangle of a square Kronecker factor, row by row: :math:`p(p+1)/2`
    numbers instead of :math:`p^2`.  Prediction reads only this triangle (``eigh`` with
    ``UPLO="U"``, and the diagonal), so a factor read back by :func:`unpack_upper`
    predicts bit for bit as the one written."""
    rows, cols = torch.triu_indices(m.shape[0], m.shape[0])
    return m[rows, cols]  # advanced indexing: a copy, not a view of m


def unpack_upper(t: torch.Tensor, p: int) -> torch.Tensor:
    """The symmetric ``(p, p)`` factor of :func:`pack_upper`'s ``t``; a square ``t`` (a
    file written before the factors were packed) is returned as it is."""
    if t.dim() == 2:
        return t
    if t.dim() != 1 or t.numel() != p * (p + 1) // 2:
        raise ValueError(
            f"a packed {p} x {p} factor has {p * (p + 1) // 2} values, not {t.numel()}"
        )
    rows, cols = torch.triu_indices(p, p)
    m = t.new_zeros(p, p)
    m[rows, cols] = t
    m[cols, rows] = t
    return m


def header_error(header: dict, where: str, field: str, what: str) -> ValueError:
    """``'<file>': the header's <field> = <value> <what>``."""
    return ValueError(f"{where!r}: the header's {field} = {header.get(field)!r:.80} {what}")


def check_spec_fields(header: dict, where: str) -> None:
    """The network spec and the evaluation record that every full model file may hold.

    Raises:
        ValueError: naming the file and the field.
    """
    network = header.get("network")
    if network is not None and not (
        isinstance(network, dict)
        and isinstance(network.get("name"), str)
        and isinstance(network.get("kwargs", {}), dict)
    ):
        raise header_error(header, where, "network", 'is not {"name": ..., "kwargs": {...}}')
    if header.get("evaluation") is not None and not isinstance(header["evaluation"], dict):
        raise header_error(header, where, "evaluation", "is not a table")


def _check_model_fields(header: dict, where: str, layout: ModelFileLayout) -> None:
    bad = partial(header_error, header, where)  # bad(field, what)
    if layout is SHARED_GMM_FILE:
        if header.get("tying") not in TYINGS:
            raise bad("tying", f"is not one of {list(TYINGS)}")
    else:
        methods = [e.method for e in _GUIDE_FILES.values() if e.layout is BNN_FILE]
        if header.get("method") not in methods:
            raise bad("method", f"is not one of {methods}")
        for field in ("guide", "model"):
            spec = header.get(field)
            if not isinstance(spec, dict) or not isinstance(spec.get("class"), str):
                raise ValueError(f"{where!r}: the header's {field} is not a table with a class")
    lik = header.get("likelihood")
    if not isinstance(lik, dict) or lik.get("kind") not in list(LIKELIHOODS):  # (unhashable)
        raise bad("likelihood", "is not a Categorical or Gaussian likelihood")
    size = lik.get("dataset_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise bad("likelihood", "has no dataset_size (an integer >= 1)")
    scale = lik.get("scale")
    if lik["kind"] == "Gaussian" and (
        isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0
    ):
        raise bad("likelihood", "has no positive scale")
    if header.get("prior") is not None and not isinstance(header["prior"], dict):
        raise bad("prior", "is not a table")
    names = header.get("site_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad("site_names", "is not a list of site names")
    check_spec_fields(header, where)


# ---------------------------------------------------------------------------- file kinds
@dataclass(frozen=True)
class ModelFileLayout:
    """A kind of BNN model file: its container format, its header's fields after
    ``kind`` and ``format_version`` in the order written, the method of all its files
    (``None``: the header's ``method``) and what a loading error names as not fitting."""

    fmt: PayloadFormat
    fields: tuple[str, ...]
    method: str | None
    misfit: str


#: The file of every method but the 2DG (a newly registered one's too).
BNN_FILE = ModelFileLayout(
    PayloadFormat(kind="twodg_pyro.BNN", version=1, finite_prefixes=_FINITE),
    ("method", _GUIDE_FIELDS, "model", "site_names", "likelihood", "prior", "network", "dtype"),
    method=None,
    misfit="{method} guide",
)
#: A 2DG BNN's file: format version 2 (with a content checksum; 1, without, is refused).
SHARED_GMM_FILE = ModelFileLayout(
    PayloadFormat(
        kind="twodg_pyro.SharedGMMBNN",
        version=2,
        kind_noun="a 2DG BNN file",
        finite_prefixes=_FINITE,
    ),
    (_GUIDE_FIELDS, "likelihood", "prior", "network", "site_names", "dtype"),
    method="2dg",
    misfit="sharing structure or guide",
)
#: The baselines' files (:meth:`~twodg_pyro.methods.TrainedMethod.save`).
BASELINE_FORMAT = PayloadFormat(
    kind="twodg_pyro.Baseline",
    version=1,
    kind_noun="a twodg_pyro baseline model file",
    finite_prefixes=("member/", "net/", "laplace/"),
)
_LAYOUTS = {layout.fmt.kind: layout for layout in (BNN_FILE, SHARED_GMM_FILE)}
#: Every kind of full model file, by its header's ``kind``.
FORMATS = {fmt.kind: fmt for fmt in (BNN_FILE.fmt, SHARED_GMM_FILE.fmt, BASELINE_FORMAT)}


# ---------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class GuideFile:
    """One method's file support: the arguments of :func:`register_guide_file`."""

    guide_cls: type
    method: str
    write: Callable[[Any], tuple[dict, dict]]
    read: Callable[[Any, dict, dict], Any]
    model_cls: type
    layout: ModelFileLayout


_GUIDE_FILES: dict[type, GuideFile] = {}


def guide_table(guide, **kwargs) -> dict:
    """The header field ``guide`` of a :data:`BNN_FILE`: ``{"class": ..., "kwargs": kwargs}``
    (``kwargs``: the JSON constructor arguments that fix the parameters' shapes)."""
    return {"guide": {"class": type(guide).__name__, "kwargs": kwargs}}


def register_guide_file(
    guide_cls: type,
    method: str | None = None,
    write: Callable[[Any], tuple[dict, dict]] | None = None,
    read: Callable[[Any, dict, dict], Any] | None = None,
    *,
    model_cls: type = BNNModel,
    layout: ModelFileLayout = BNN_FILE,
) -> GuideFile:
    """Make :func:`~twodg_pyro.io.save_model` / :func:`~twodg_pyro.io.load_model` store
    and read guides of type ``guide_cls`` (exactly: a subclass registers itself).

    Args:
        method: the method's name (the header's ``method``); by default the class's
            :attr:`~twodg_pyro.guide.BNNGuide.method`.
        write: ``write(guide) -> (fields, tensors)``: the header fields the guide adds
            (JSON) and its tensors keyed ``"<section>/<name>"``, written before
            ``guide/``; by default ``(guide_table(guide), {})``.
        read: ``read(model, header, payload) -> guide``: a guide of the saved shapes
            (its state is then loaded from ``guide/``); by default
            ``guide_cls(model, **header["guide"]["kwargs"])``.
        model_cls: :class:`~twodg_pyro.bnn.BNNModel` or
            :class:`~twodg_pyro.guides.Rank1BNNModel` (the models a file rebuilds).
        layout: :data:`BNN_FILE` (:data:`SHARED_GMM_FILE` is the 2DG's own).

    Raises:
        ValueError: ``method`` is another guide class's, or none is given or declared.
    """
    method = method or getattr(guide_cls, "method", None)
    if not method:
        raise ValueError(f"{guide_cls.__name__} declares no method: pass method=")
    owner = next((e.guide_cls for e in _GUIDE_FILES.values() if e.method == method), guide_cls)
    if owner is not guide_cls:
        raise ValueError(f"method {method!r} is {owner.__name__}'s, not {guide_cls.__name__}'s")

    def construct(model, header: dict, payload: dict):
        return guide_cls(model, **header["guide"].get("kwargs", {}))

    def bare(guide) -> tuple[dict, dict]:
        return guide_table(guide), {}

    entry = GuideFile(guide_cls, method, write or bare, read or construct, model_cls, layout)
    _GUIDE_FILES[guide_cls] = entry
    return entry


def _guide_file(guide) -> GuideFile:
    entry = _GUIDE_FILES.get(type(guide))
    if entry is not None:
        return entry
    from pyro.infer.autoguide import AutoGuide

    name = type(guide).__name__
    if isinstance(guide, AutoGuide):
        raise TypeError(
            f"save_model does not store a Pyro autoguide ({name}): its parameters live in "
            "Pyro's param store (save them with pyro.get_param_store().save(path)). For a "
            "model file, train twodg_pyro.guides.MeanFieldGuide(model) (the same mean-field "
            "Normal family) or SharedGMMGuide / Rank1Guide / SSVIGuide"
        )
    known = ", ".join(cls.__name__ for cls in _GUIDE_FILES)
    raise TypeError(
        f"save_model stores the guides registered for model files ({known}), got {name}: "
        f"register it with twodg_pyro.io.register_guide_file({name}, method, ...)"
    )


# ---------------------------------------------------------------------------- writing
def _model_spec(model) -> dict:
    if not isinstance(model, Rank1BNNModel):
        return {"class": "BNNModel"}
    return {
        "class": "Rank1BNNModel",
        "components": model.components,
        "routing": model.routing,
        "layers": [layer.module_name for layer in model.layers],
    }


def write_model_file(
    path: str | Path, model, guide, network: dict | None, evaluation: dict | None
) -> Path:
    """:func:`~twodg_pyro.io.save_model`."""
    entry = _guide_file(guide)
    if not isinstance(model, entry.model_cls):
        raise TypeError(
            f"a {entry.guide_cls.__name__} goes with a {entry.model_cls.__name__}, got "
            f"{type(model).__name__}"
        )
    guide_fields, guide_tensors = entry.write(guide)
    prior, prior_tensors = prior_spec(model.prior, model)
    values = {
        "method": entry.method,
        "model": _model_spec(model),
        "site_names": model.site_names,
        "likelihood": likelihood_spec(model.likelihood),
        "prior": prior,
        "network": network,
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    fields: dict = {}
    for name in entry.layout.fields:
        fields.update(guide_fields if name == _GUIDE_FIELDS else {name: values[name]})
    payload = {
        "header": header_json(entry.layout.fmt, fields, evaluation),
        **guide_tensors,
        **state_tensors(guide, "guide/"),
        **state_tensors(model.net, "net/"),
        **{f"prior/{k}": v for k, v in prior_tensors.items()},
    }
    return write_payload(payload, path)


# ---------------------------------------------------------------------------- reading
def _rebuild_model(model_cls: type, header: dict, net, prior, lik, where: str):
    if model_cls is not Rank1BNNModel:
        return rebuild_bnn_model(net, prior, lik, header["site_names"], where)
    spec = header["model"]
    layers = list(spec["layers"])
    model = Rank1BNNModel(
        net,
        prior=prior,
        likelihood=lik,
        components=int(spec["components"]),
        layer_types=site_types(net, layers),
        include=exact_include([f"{m}.weight" if m else "weight" for m in layers]),
        routing=spec.get("routing", "modulo"),
    )
    if model.site_names != header["site_names"]:
        raise ValueError(
            f"its factor sites are {model.site_names[:4]}..., the file's "
            f"{header['site_names'][:4]}..."
        )
    return model


def model_from_payload(payload: dict, header: dict, where: str, net=None, prior=None, device="cpu"):
    """:func:`~twodg_pyro.io.load_model` of a BNN's file already read and verified
    (:func:`~twodg_pyro.files.payload.read_payload` with its layout's ``fmt``)."""
    layout = _LAYOUTS[header["kind"]]
    _check_model_fields(header, where, layout)
    method = layout.method or header["method"]
    entry = next(e for e in _GUIDE_FILES.values() if e.method == method)
    net, lik, prior = rebuild_parts(payload, header, where, net, prior)
    try:
        model = _rebuild_model(entry.model_cls, header, net, prior, lik, where)
        guide = entry.read(model, header, payload)
        guide.load_state_dict(payload_section(payload, "guide/"))
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as e:
        if where in str(e):
            raise
        if isinstance(e, FieldError):  # a stored value out of its range
            raise ValueError(f"{where!r}: {e}") from e
        raise ValueError(
            f"{where!r}: its {layout.misfit.format(method=method)} does not fit the saved "
            f"network: {type(e).__name__}: {e}"
        ) from e
    return model.to(device), guide.to(device)


# ---------------------------------------------------------------------------- the library's
def _read_2dg(model, header: dict, payload: dict) -> SharedGMMGuide:
    structure = SharingStructure.from_payload(payload_section(payload, "structure/"))
    structure.check_values("structure/")
    return SharedGMMGuide(model, structure, tying=header["tying"])


def _write_2dg(guide: SharedGMMGuide) -> tuple[dict, dict]:
    tensors = {f"structure/{k}": v for k, v in guide.structure().to_payload().items()}
    return {"tying": guide.tying, "coordinates": guide.coordinates}, tensors


register_guide_file(MeanFieldGuide)
register_guide_file(Rank1Guide, model_cls=Rank1BNNModel)
register_guide_file(
    SSVIGuide, write=lambda g: (guide_table(g, density=g.density, init_scale=g.init_scale), {})
)
register_guide_file(SharedGMMGuide, write=_write_2dg, read=_read_2dg, layout=SHARED_GMM_FILE)
