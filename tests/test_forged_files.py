"""Model files a hostile user made (issue 46): every file below has a valid checksum
(it was resealed after the edit), so what refuses it is the loaders' own checks: sizes
checked against the file before anything is read, every stored field of a 2DG model file
and of a ``.2dgz`` in its range and agreeing with the sharing structure, header fields of
the right kind, and paths that are no files named for what they are.  Each refusal is one
line naming the file and the field or value.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from fault_injection import forge_compact, forge_full, forgery
from test_cli_errors import one_line  # the CLI's one-line check
from test_file_reliability import _compact, _full_file, _memory_cap, _patched_floats, _refused

from twodg_pyro.data import load_digits_split
from twodg_pyro.files.atomic import safe_torch_load
from twodg_pyro.files.integrity import bytes_digest
from twodg_pyro.files.payload import write_payload
from twodg_pyro.io import load_model


def _forged(src: Path, dst: Path, **changes) -> Path:
    """The full model file ``src`` with tensors changed (``key=fn(tensor)``; ``__`` in a
    keyword stands for ``/``), resealed."""
    payload = safe_torch_load(src)
    for key, change in changes.items():
        key = key.replace("__", "/")
        payload[key] = change(payload[key].clone())
    write_payload(payload, dst)
    return dst


def _resealed_header(src: Path, dst: Path, change) -> Path:
    """The compact file ``src`` with its JSON header changed by ``change(header)`` and
    its SHA-256 recomputed (the sections' table included, unlike ``_rewrite``)."""
    data = src.read_bytes()
    _, version, h_len = struct.unpack_from("<8sHI", data, 0)
    header = json.loads(zlib.decompress(data[14 : 14 + h_len]))
    change(header)
    head = zlib.compress(json.dumps(header).encode())
    body = data[:8] + struct.pack("<HI", version, len(head)) + head + data[14 + h_len : -32]
    dst.write_bytes(body + bytes_digest(body))
    return dst


def _alphas(t):  # blending weights that sum to one but are not probabilities
    t[:, 0], t[:, 1] = -0.5, 1.5
    return t


# ---------------------------------------------------------------------------- 3. values
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (  # the case: a RuntimeError of torch.multinomial before
            {"guide__ellipse_alphas": _alphas, "structure__ellipse_alphas": _alphas},
            r"structure/ellipse_alphas holds -0.5 at \[0, 0\] .* must be in \[0, 1\]",
        ),
        ({"guide__ellipse_alphas": _alphas}, "guide/ellipse_alphas differs from the sharing"),
        ({"guide__plain_component": lambda t: t.fill_(3)}, "guide/plain_component differs"),
        ({"guide__plain_index": lambda t: t.fill_(0)}, "guide/plain_index differs"),
        ({"guide__site_counts": lambda t: t + 1}, "guide/site_counts differs"),
        (
            {"structure__plain_component": lambda t: t.fill_(3)},
            r"plain_component holds 3 .*\[0, 2\]",
        ),
        ({"structure__ellipse_components": lambda t: t.fill_(-1)}, "ellipse_components holds -1"),
        (
            {"structure__outlier_scale": lambda t: -t},
            r"structure/outlier_scale holds -0\.0(5|49999)",
        ),
        (
            {"structure__means": lambda t: t.index_fill_(1, torch.tensor([1]), -1.0)},
            r"means \(sigma\)",
        ),
        ({"structure__covariances": lambda t: -t}, r"covariances \(variances\) holds -0.000999"),
        ({"guide__outlier_loc": lambda t: t.fill_(3e38)}, "guide/outlier_loc holds 3"),
        ({"guide__chol_log_diag": lambda t: t.fill_(60.0)}, "guide covariances holds inf"),
        (
            {"guide__centre_mu": lambda t: t.fill_(2e9)},
            r"guide/centre_mu holds 2000000000.0 .* 1.07374e\+09",
        ),
        ({"guide__point_covs": lambda t: t.fill_(1e12)}, "guide/point_covs holds 99999999"),
    ],
)
def test_a_forged_2dg_file_is_refused_naming_the_field(tmp_path, changes, message):
    src = _full_file(tmp_path, "2dg")
    _refused(_forged(src, tmp_path / "forged.pt", **changes), message)


def test_overlapping_sites_and_a_structure_header_of_the_wrong_kind_are_refused(tmp_path):
    src = _full_file(tmp_path, "2dg")
    payload = safe_torch_load(src)
    header = json.loads(payload["structure/header"])
    for sites, message in (
        ([[n, sh, 0] for n, sh, _ in header["sites"]], "the sites must cover the 610 weights"),
        ([["a", [-3], 0]], r"are not \[\[name, shape, offset\]\]"),
        ("sites", r"are not \[\[name, shape, offset\]\]"),
    ):
        payload["structure/header"] = json.dumps({**header, "sites": sites})
        write_payload(payload, tmp_path / "sites.pt")
        _refused(tmp_path / "sites.pt", message)


@pytest.mark.parametrize(
    ("section", "index", "value", "message"),
    [
        ("centres", 1, -0.05, r"means \(sigma\) holds -0.0499"),
        ("outliers", 0, 1e30, r"outlier_loc holds .*e\+3\d"),  # a layer's mean scale
    ],
)
def test_a_forged_compact_file_is_refused_naming_the_field(
    tmp_path, section, index, value, message
):
    src = _compact(tmp_path, tying="stochastic")
    dtype = "<f4" if section == "outliers" else "<f2"
    assert json.dumps(_header(src)["centre_dtype"]) == '"float16"'
    _refused(_patched_floats(src, tmp_path / "bad.2dgz", section, dtype, index, value), message)


def _header(path: Path) -> dict:
    from twodg_pyro.io.compact import read_compact

    return read_compact(path)[0]


def test_evaluate_refuses_a_forged_file_in_one_line(tmp_path, capsys):
    src = _full_file(tmp_path, "2dg")
    bad = _forged(src, tmp_path / "forged.pt", guide__ellipse_alphas=_alphas)
    bad = _forged(bad, tmp_path / "forged.pt", structure__ellipse_alphas=_alphas)
    one_line(
        capsys,
        2,
        ["evaluate", str(bad), "--num-samples", "2", "--data", "digits"],
        str(bad),
        "structure/ellipse_alphas holds -0.5",
    )


# ---------------------------------------------------------------------------- 2. sizes
def test_a_compact_file_padded_to_gigabytes_is_refused_by_its_size(tmp_path):
    """Its declared lengths are checked against the file's size before the payload is
    read: a file padded (sparse) to 2 GiB is refused under a 1 GiB address-space cap,
    where reading it whole was a MemoryError; so is a header length of 4 GiB."""
    src = _compact(tmp_path)
    padded = tmp_path / "padded.2dgz"
    padded.write_bytes(src.read_bytes())
    os.truncate(padded, 2 << 30)
    with _memory_cap(1):
        _refused(padded, r"is longer than its content: 2147483648 bytes, its layout says \d+")
    data = bytearray(src.read_bytes())
    data[10:14] = struct.pack("<I", 2**32 - 1)
    huge = tmp_path / "huge_header.2dgz"
    huge.write_bytes(bytes(data))
    os.truncate(huge, 2**32 + 64)
    with _memory_cap(1):
        _refused(huge, "declares a header of 4294967295 bytes")


# ---------------------------------------------------------------------------- 4. header types
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h: h["sections"][0].__setitem__(0, ["centres"]), r"section name \['centres'\]"),
        (lambda h: h["sections"].append(["net", 0]), "section name 'net' appears twice"),
        (lambda h: h.__setitem__("kind", ["x"]), r"of unknown kind \['x'\]"),
        (lambda h: h.__setitem__("prior", "normal"), "the header's prior 'normal' is not a table"),
    ],
)
def test_compact_header_fields_of_the_wrong_kind_are_refused(tmp_path, change, message):
    _refused(_resealed_header(_compact(tmp_path), tmp_path / "h.2dgz", change), message)


_KINDS = [["x"], {"a": 1}, None, "s", -1, 1e300, True]


def _paths(obj, at=()):
    """Every place of a JSON value (lists: their first two items)."""
    items = (
        obj.items()
        if isinstance(obj, dict)
        else enumerate(obj[:2])
        if isinstance(obj, list)
        else ()
    )
    for key, value in items:
        yield (*at, key)
        yield from _paths(value, (*at, key))


def _set(obj, path, value):
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def test_any_header_field_of_any_kind_loads_or_is_refused_by_name(tmp_path):
    """Every field of the full 2DG file's two headers and of the compact header, set to
    a list, a table, null, a string, a number or a boolean: the file loads, or is
    refused with a ValueError naming it (never a TypeError or a KeyError)."""
    full, compact = _full_file(tmp_path, "2dg"), _compact(tmp_path)
    payload = safe_torch_load(full)
    cases = []
    for key in ("header", "structure/header"):
        header = json.loads(payload[key])
        cases += [(key, path) for path in _paths(header)]
    cases += [("2dgz", path) for path in _paths(_header(compact))]
    assert len(cases) > 80
    for key, path in cases:
        for value in _KINDS:
            if key == "2dgz":
                change = lambda h, path=path, value=value: _set(h, path, value)  # noqa: E731
                bad = _resealed_header(compact, tmp_path / "f.2dgz", change)
            else:
                header = json.loads(payload[key])
                _set(header, path, value)
                bad = tmp_path / "f.pt"
                write_payload({**payload, key: json.dumps(header)}, bad)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    load_model(bad)
            except ValueError as e:
                assert str(bad) in str(e) and "\n" not in str(e), (key, path, value, e)


# ---------------------------------------------------------------------------- 8. no files
def test_paths_that_are_no_files_are_named_for_what_they_are(tmp_path, capsys):
    """A named pipe, a symbolic link loop and ``/dev/zero`` were each "no such file"."""
    fifo, loop, dangling = tmp_path / "fifo", tmp_path / "loop", tmp_path / "dangling"
    os.mkfifo(fifo)
    os.symlink(loop, loop)
    os.symlink(tmp_path / "gone.pt", dangling)
    for path, message in (
        (fifo, r"is a named pipe \(FIFO\), not a file"),
        (loop, r"is a symbolic link loop \(it leads back to itself\), not a file"),
        ("/dev/zero", "is a character device, not a file"),
        (dangling, r"no such file: '.*dangling' \(a symbolic link to '.*gone.pt'\)"),
    ):
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            load_model(path)
        one_line(capsys, 2, ["evaluate", str(path)], str(path))
    assert fifo.is_fifo()


# ---------------------------------------------------------------------------- fault injection
@pytest.mark.parametrize("name", ["model_2dg.pt", "model_2dg.2dgz"])
def test_forged_bit_flips_are_refused_or_load_as_a_valid_finite_model(tiny_run, tmp_path, name):
    """40 seeded forgeries (one bit of the content flipped, the checksum recomputed:
    ``benchmarks/fault_injection.py`` runs 1,500): each is refused naming the file, or
    loads as a model whose fields pass the checks and whose predictions are finite."""
    path = tiny_run / name
    forge, original = (
        (forge_full, safe_torch_load(path))
        if name.endswith(".pt")
        else (forge_compact, path.read_bytes())
    )
    images = load_digits_split().test.tensors[0][:64]
    rng = np.random.default_rng(0)
    target = tmp_path / f"forged{path.suffix}"
    outcomes = [forgery(forge, original, target, images, rng) for _ in range(40)]
    assert set(outcomes) <= {"refused (named)", "loads (valid, finite)"}, outcomes
    assert outcomes.count("refused (named)") >= 20


def test_a_compact_ellipse_component_of_k_is_refused_naming_the_field(tmp_path):
    from test_file_reliability import _rewrite

    from twodg_pyro.io.bits import pack_bits, unpack_bits
    from twodg_pyro.io.compact import read_compact

    src = _compact(tmp_path)
    header = _header(src)
    info, K, k = header["ellipse_components"], header["n_components"], header["ellipse_k"]
    assert info["coding"] == "packed"
    buf = bytes(read_compact(src)[1]["ellipses"])
    n, bits = header["n_ellipses"] * k, header["component_bits"]
    comps = unpack_bits(buf[: info["bytes"]], n, bits).copy()
    comps[0] = K  # fits the bit width, names no component
    packed = pack_bits(comps, bits)
    bad = _rewrite(src, tmp_path / "k.2dgz", sections={"ellipses": packed + buf[info["bytes"] :]})
    _refused(bad, rf"ellipse_components holds {K} at \[0, 0\] .* must be in \[0, {K - 1}\]")
