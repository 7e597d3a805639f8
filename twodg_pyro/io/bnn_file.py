"""Saving and loading a trained 2DG BNN.

One file holds plain tensors and a JSON header (no pickled objects), readable with
``torch.load(path, weights_only=True)``:

* ``header``: kind, ``format_version``, tying, coordinates, the likelihood, the prior
  (when it is one of the library's), the network's ``dtype`` (``"float32"``,
  ``"float64"``), and optionally how to rebuild the network
  (``{"name": ..., "kwargs": {...}}`` for :func:`twodg_pyro.models.build_network`);
* ``structure/<name>``: the :class:`~twodg_pyro.sharing.SharingStructure` tensors;
* ``guide/<name>``: the guide's parameters and buffers;
* ``net/<name>``: the network's state (deterministic parts such as BatchNorm);
* ``checksum``: ``"sha256:..."``, the content digest of everything above
  (:mod:`twodg_pyro.io.integrity`), verified on load.

Tensors are stored on the CPU whatever device the model was trained on, and loaded with
``map_location="cpu"``; :func:`load_2dg` then puts the model on the ``device`` asked for,
in the saved dtype.  A loaded model predicts exactly what the saved one did under the
same seed on the same device.  Loading refuses a file whose content does not match its
checksum, one with NaN/inf parameters, and a header that lacks a field or holds a value
of the wrong kind, each a ``ValueError`` naming the file.  Files of format version 1
(before the checksum) still load, with an
:class:`~twodg_pyro.io.payload.UnverifiedFileWarning`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .payload import PayloadFormat, payload_section, read_payload, write_payload

__all__ = ["save_2dg", "load_2dg", "FILE_FORMAT_VERSION"]

#: 2: with a content checksum; 1 (no checksum) is still read, unverified.
FILE_FORMAT_VERSION = 2
_KIND = "twodg_pyro.SharedGMMBNN"
_FORMAT = PayloadFormat(
    kind=_KIND,
    version=FILE_FORMAT_VERSION,
    noun="a twodg_pyro model file",
    header_noun="the model file's header",
    kind_noun="a 2DG BNN file",
    legacy_versions=(1,),
    finite_prefixes=("guide/", "net/", "structure/"),
)


def _likelihood_spec(lik) -> dict:
    from ..likelihoods import Gaussian

    spec = {"kind": type(lik).__name__, "dataset_size": lik.dataset_size}
    if isinstance(lik, Gaussian):
        spec["scale"] = lik.scale
    return spec


def _prior_spec(prior) -> dict:
    from ..priors import LaplacePrior, LayerwiseNormalPrior, NormalPrior, PretrainedPrior

    if isinstance(prior, PretrainedPrior):
        # its centres are the network's own initial values, which the file keeps under net/
        return {"kind": "PretrainedPrior", "scale": prior.scale, "delta": prior.delta}
    if isinstance(prior, (NormalPrior, LaplacePrior)):
        return {"kind": type(prior).__name__, "loc": prior.loc, "scale": prior.scale}
    if isinstance(prior, LayerwiseNormalPrior):
        return {"kind": "LayerwiseNormalPrior", "gain": prior.gain, "bias_scale": prior.bias_scale}
    return {"kind": "custom", "repr": repr(prior)}


def save_2dg(path: str | Path, model, guide, network: dict | None = None) -> None:
    """Write ``model`` + shared-GMM ``guide`` atomically to ``path``."""
    structure = guide.structure()
    header = {
        "kind": _KIND,
        "format_version": FILE_FORMAT_VERSION,
        "tying": guide.tying,
        "coordinates": guide.coordinates,
        "likelihood": _likelihood_spec(model.likelihood),
        "prior": _prior_spec(model.prior),
        "network": network,
        "site_names": model.site_names,
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    payload: dict = {"header": json.dumps(header)}
    for k, v in structure.to_payload().items():
        payload[f"structure/{k}"] = v
    for k, v in guide.state_dict().items():
        payload[f"guide/{k}"] = v.detach().cpu().clone()
    for k, v in model.net.state_dict().items():
        payload[f"net/{k}"] = v.detach().cpu().clone()
    write_payload(payload, path)


def _rebuild_prior(spec: dict, net: nn.Module):
    from ..priors import LaplacePrior, LayerwiseNormalPrior, NormalPrior, PretrainedPrior

    kind = spec.get("kind")
    if kind == "PretrainedPrior":
        return PretrainedPrior.from_network(net, spec["scale"], spec["delta"])
    if kind == "NormalPrior":
        return NormalPrior(spec["scale"], spec["loc"])
    if kind == "LaplacePrior":
        return LaplacePrior(spec["scale"], spec["loc"])
    if kind == "LayerwiseNormalPrior":
        return LayerwiseNormalPrior(spec["gain"], spec["bias_scale"])
    return None


def _check_header(header: dict, where: str) -> None:
    """Every field :func:`load_2dg` reads, of the right kind (a hand-edited header)."""

    def bad(field: str, what: str) -> ValueError:
        return ValueError(f"{where!r}: the header's {field} = {header.get(field)!r:.80} {what}")

    from ..guides.shared_gmm import TYINGS

    if header.get("tying") not in TYINGS:
        raise bad("tying", f"is not one of {list(TYINGS)}")
    lik = header.get("likelihood")
    if not isinstance(lik, dict) or lik.get("kind") not in ("Categorical", "Gaussian"):
        raise bad("likelihood", "is not a Categorical or Gaussian likelihood")
    size = lik.get("dataset_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise bad("likelihood", "has no dataset_size (an integer >= 1)")
    scale = lik.get("scale")
    if lik["kind"] == "Gaussian" and (
        isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0
    ):
        raise bad("likelihood", "has no positive scale")
    prior = header.get("prior")
    if prior is not None and not isinstance(prior, dict):
        raise bad("prior", "is not a table")
    network = header.get("network")
    if network is not None and not (
        isinstance(network, dict)
        and isinstance(network.get("name"), str)
        and isinstance(network.get("kwargs", {}), dict)
    ):
        raise bad("network", 'is not {"name": ..., "kwargs": {...}}')
    names = header.get("site_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad("site_names", "is not a list of site names")


def _saved_dtype(header: dict, net_state: dict, where: str) -> torch.dtype:
    """The network dtype of a model file: its header's ``dtype``, else (files written before
    it was recorded) that of its floating network tensors, else float32."""
    name = header.get("dtype")
    if name is not None:
        if name not in ("float32", "float64", "float16", "bfloat16"):
            raise ValueError(f"{where!r}: unknown network dtype {name!r} in the header")
        return getattr(torch, name)
    for t in net_state.values():
        if torch.is_tensor(t) and t.is_floating_point():
            return t.dtype
    return torch.float32


def load_2dg(path: str | Path, net: nn.Module | None = None, prior=None, device="cpu"):
    """Read a file written by :func:`save_2dg`; returns ``(model, guide)``.

    Args:
        net: the network architecture (its weights are restored from the file); built
            from the file's ``network`` spec when ``None``.  It is cast to the saved dtype.
        prior: the prior (default: the saved one, when it is a library prior).
        device: where the model and guide go (``"cpu"``, ``"cuda"``, ...), whatever device
            they were saved from.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not such a file, another format version, a truncated or corrupted
            file (its content does not match its checksum), NaN/inf parameters, a header
            missing a field, or a network that does not match the saved sharing
            structure; the message names the file.
    """
    from ..guides.shared_gmm import SharedGMMGuide
    from ..likelihoods import Categorical, Gaussian
    from ..model import BNNModel
    from ..sharing.structure import SharingStructure

    payload, header = read_payload(path, _FORMAT)
    where = str(path)
    _check_header(header, where)
    if net is None:
        spec = header.get("network")
        if not spec:
            raise ValueError(f"{where!r} does not say how to build its network: pass net=")
        from ..models import build_network

        try:
            net = build_network(spec["name"], **spec.get("kwargs", {}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where!r}: cannot build its network {spec!r:.120}: {e}") from e
    net_state = payload_section(payload, "net/")
    net = net.to(_saved_dtype(header, net_state, where))  # before load_state_dict casts
    try:
        net.load_state_dict(net_state)
    except RuntimeError as e:
        raise ValueError(f"the network does not match the one saved in {where!r}: {e}") from e
    lik_spec = header["likelihood"]
    if lik_spec["kind"] == "Gaussian":
        lik = Gaussian(lik_spec["dataset_size"], lik_spec["scale"])
    else:
        lik = Categorical(lik_spec["dataset_size"])
    if prior is None:
        try:
            prior = _rebuild_prior(header.get("prior") or {}, net)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"{where!r}: the header's prior {header.get('prior')!r:.80} "
                f"cannot be rebuilt: {type(e).__name__}: {e}"
            ) from e
    model = BNNModel(net, prior=prior, likelihood=lik)
    if model.site_names != header["site_names"]:
        raise ValueError(
            f"the network does not match the one saved in {where!r}: its Bayesian sites are "
            f"{model.site_names[:4]}..., the file's {header['site_names'][:4]}..."
        )
    try:
        structure = SharingStructure.from_payload(payload_section(payload, "structure/"))
        guide = SharedGMMGuide(model, structure, tying=header["tying"])
        guide.load_state_dict(payload_section(payload, "guide/"))
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise ValueError(
            f"{where!r}: its sharing structure or guide does not fit the saved network: "
            f"{type(e).__name__}: {e}"
        ) from e
    return model.to(device), guide.to(device)
