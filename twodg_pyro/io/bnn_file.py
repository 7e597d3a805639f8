"""Saving and loading a trained 2DG BNN.

One file holds plain tensors and a JSON header (no pickled objects), readable with
``torch.load(path, weights_only=True)``:

* ``header``: kind, ``format_version``, tying, coordinates, the likelihood, the prior
  (when it is one of the library's), the network's ``dtype`` (``"float32"``,
  ``"float64"``), and optionally how to rebuild the network
  (``{"name": ..., "kwargs": {...}}`` for :func:`twodg_pyro.models.build_network`);
* ``structure/<name>``: the :class:`~twodg_pyro.sharing.SharingStructure` tensors;
* ``guide/<name>``: the guide's parameters and buffers;
* ``net/<name>``: the network's state (deterministic parts such as BatchNorm).

Tensors are stored on the CPU whatever device the model was trained on, and loaded with
``map_location="cpu"``; :func:`load_2dg` then puts the model on the ``device`` asked for,
in the saved dtype.  A loaded model predicts exactly what the saved one did under the
same seed on the same device.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .files import atomic_torch_save
from .payload import PayloadFormat, payload_section, read_payload

__all__ = ["save_2dg", "load_2dg", "FILE_FORMAT_VERSION"]

FILE_FORMAT_VERSION = 1
_KIND = "twodg_pyro.SharedGMMBNN"
_FORMAT = PayloadFormat(
    kind=_KIND,
    version=FILE_FORMAT_VERSION,
    noun="a twodg_pyro model file",
    header_noun="the model file's header",
    kind_noun="a 2DG BNN file",
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
    atomic_torch_save(payload, path)


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
        ValueError: not such a file, another format version, a truncated or corrupted
            file, or a network that does not match the saved sharing structure.
    """
    from ..guides.shared_gmm import SharedGMMGuide
    from ..likelihoods import Categorical, Gaussian
    from ..model import BNNModel
    from ..sharing.structure import SharingStructure

    payload, header = read_payload(path, _FORMAT)
    if net is None:
        spec = header.get("network")
        if not spec:
            raise ValueError(f"{str(path)!r} does not say how to build its network: pass net=")
        from ..models import build_network

        net = build_network(spec["name"], **spec.get("kwargs", {}))
    net_state = payload_section(payload, "net/")
    net = net.to(_saved_dtype(header, net_state, str(path)))  # before load_state_dict casts
    try:
        net.load_state_dict(net_state)
    except RuntimeError as e:
        raise ValueError(f"the network does not match the one saved in {str(path)!r}: {e}") from e
    lik_spec = header["likelihood"]
    if lik_spec["kind"] == "Gaussian":
        lik = Gaussian(lik_spec["dataset_size"], lik_spec["scale"])
    else:
        lik = Categorical(lik_spec["dataset_size"])
    prior = prior if prior is not None else _rebuild_prior(header.get("prior", {}), net)
    model = BNNModel(net, prior=prior, likelihood=lik)
    structure = SharingStructure.from_payload(payload_section(payload, "structure/"))
    guide = SharedGMMGuide(model, structure, tying=header["tying"])
    guide.load_state_dict(payload_section(payload, "guide/"))
    return model.to(device), guide.to(device)
