"""Saving and loading a trained 2DG BNN.

One file holds plain tensors and a JSON header (no pickled objects), readable with
``torch.load(path, weights_only=True)``:

* ``header``: kind, ``format_version``, tying, coordinates, the likelihood, the prior
  (:mod:`twodg_pyro.io.specs`: the library's priors and scalar ``pyro.distributions``
  are stored; any other prior is recorded by its ``repr`` with a warning, and loads as
  an :class:`~twodg_pyro.io.specs.UnavailablePrior`, never as a silent N(0, 1)), the
  network's ``dtype`` (``"float32"``, ``"float64"``), optionally how to rebuild the
  network (``{"name": ..., "kwargs": {...}}`` for :func:`twodg_pyro.models.build_network`)
  and how the model was evaluated (``evaluation``, written by the pipeline);
* ``structure/<name>``: the :class:`~twodg_pyro.sharing.SharingStructure` tensors;
* ``guide/<name>``: the guide's parameters and buffers;
* ``net/<name>``: the network's state (deterministic parts such as BatchNorm, and the
  frozen initial values of the Bayesian tensors, which a ``PretrainedPrior`` is centred
  at);
* ``prior/<site>``: the centres of a ``PretrainedPrior`` that are not the network's;
* ``checksum``: ``"sha256:..."``, the content digest of everything above
  (:mod:`twodg_pyro.files.integrity`), verified on load.

Tensors are stored on the CPU whatever device the model was trained on, and loaded with
``map_location="cpu"``; :func:`load_2dg` then puts the model on the ``device`` asked for,
in the saved dtype.  A loaded model predicts exactly what the saved one did under the
same seed on the same device.  Loading refuses a file whose content does not match its
checksum, one with NaN/inf parameters, and a header that lacks a field or holds a value
of the wrong kind, each a ``ValueError`` naming the file.  Files of format version 1
(before the checksum) still load, with an
:class:`~twodg_pyro.files.payload.UnverifiedFileWarning`.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from ..files.payload import PayloadFormat, payload_section, read_payload, write_payload
from .specs import (
    likelihood_spec,
    prior_spec,
    rebuild_bnn_model,
    rebuild_parts,
)

__all__ = ["save_2dg", "load_2dg", "load_2dg_payload", "FILE_FORMAT_VERSION"]

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
    finite_prefixes=("guide/", "net/", "structure/", "prior/"),
)


def save_2dg(
    path: str | Path, model, guide, network: dict | None = None, evaluation: dict | None = None
) -> None:
    """Write ``model`` + shared-GMM ``guide`` atomically to ``path``.

    Args:
        network: how to rebuild the network (``{"name", "kwargs"}`` for
            :func:`twodg_pyro.models.build_network`), so that :func:`load_2dg` needs no
            ``net``.
        evaluation: optional record of how the model was evaluated (the pipeline stores
            its seed, number of draws, data settings and metrics; ``twodg-pyro evaluate``
            takes its defaults from it).

    A prior that cannot be stored warns (:class:`~twodg_pyro.io.specs.PriorNotStoredWarning`,
    see :mod:`twodg_pyro.io.specs`).

    Raises:
        TypeError: ``guide`` is not a :class:`~twodg_pyro.guides.SharedGMMGuide` (use
            :func:`~twodg_pyro.io.save_model`, which stores every method).
    """
    from ..guides.shared_gmm import SharedGMMGuide

    if not isinstance(guide, SharedGMMGuide):
        raise TypeError(
            f"save_2dg stores a SharedGMMGuide, got {type(guide).__name__}: use "
            "twodg_pyro.io.save_model(path, model, guide), which stores every method"
        )
    structure = guide.structure()
    prior, prior_tensors = prior_spec(model.prior, model)
    header = {
        "kind": _KIND,
        "format_version": FILE_FORMAT_VERSION,
        "tying": guide.tying,
        "coordinates": guide.coordinates,
        "likelihood": likelihood_spec(model.likelihood),
        "prior": prior,
        "network": network,
        "site_names": model.site_names,
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    if evaluation is not None:
        header["evaluation"] = evaluation
    payload: dict = {"header": json.dumps(header)}
    for k, v in structure.to_payload().items():
        payload[f"structure/{k}"] = v
    for k, v in guide.state_dict().items():
        payload[f"guide/{k}"] = v.detach().cpu().clone()
    for k, v in model.net.state_dict().items():
        payload[f"net/{k}"] = v.detach().cpu().clone()
    for k, v in prior_tensors.items():
        payload[f"prior/{k}"] = v
    write_payload(payload, path)


def _bad(header: dict, where: str, field: str, what: str) -> ValueError:
    return ValueError(f"{where!r}: the header's {field} = {header.get(field)!r:.80} {what}")


def _check_header(header: dict, where: str) -> None:
    """Every field :func:`load_2dg` reads, of the right kind (a hand-edited header)."""
    from ..guides.tyings import TYINGS

    if header.get("tying") not in TYINGS:
        raise _bad(header, where, "tying", f"is not one of {list(TYINGS)}")
    check_common_header(header, where)


def check_common_header(header: dict, where: str) -> None:
    """The fields every full model file has (likelihood, prior, network, site names, an
    optional evaluation record), of the right kind.

    Raises:
        ValueError: naming the file and the field.
    """

    def bad(field: str, what: str) -> ValueError:
        return _bad(header, where, field, what)

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
    evaluation = header.get("evaluation")
    if evaluation is not None and not isinstance(evaluation, dict):
        raise bad("evaluation", "is not a table")


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
    payload, header = read_payload(path, _FORMAT)
    return load_2dg_payload(payload, header, str(path), net=net, prior=prior, device=device)


def load_2dg_payload(payload: dict, header: dict, where: str, net=None, prior=None, device="cpu"):
    """:func:`load_2dg` on a payload already read and verified (:func:`read_payload`)."""
    from ..guides.shared_gmm import SharedGMMGuide
    from ..sharing.structure import SharingStructure

    _check_header(header, where)
    net, lik, prior = rebuild_parts(payload, header, where, net, prior)
    model = rebuild_bnn_model(net, prior, lik, header["site_names"], where)
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
