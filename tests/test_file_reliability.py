"""Model files that cannot lie or exhaust memory (issue 23): every bad file below has a
*valid* checksum (it is written by the project's own writers), so what refuses it is the
loader's checks: non-finite values, a likelihood that does not fit the data, sizes the
file cannot back, and header fields that do not fit together.

The memory-bomb tests run under an address-space cap (:func:`_memory_cap`): a loader
that allocated what the file declares fails there with a ``MemoryError`` instead of
taking the machine down; the fixed loader refuses first, with a one-line ``ValueError``.
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import tracemalloc

import numpy as np
import pytest
import torch
from test_protocol_and_loop import toy_structure  # the small structure the tests share
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.cli import main
from twodg_pyro.files.atomic import safe_torch_load
from twodg_pyro.files.payload import write_payload
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.io import save_2dg, save_model
from twodg_pyro.io.compact import export_compact, export_int8_mean_field, read_compact
from twodg_pyro.io.compact_format import _write_container
from twodg_pyro.io.entropy import decode_index, rans_decode, rans_encode
from twodg_pyro.io.model_file import load_model
from twodg_pyro.io.network_size import MAX_NETWORK_VALUES
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import build_network
from twodg_pyro.pipeline.outputs.saved_models import evaluate_model_file

SPEC = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [8], "num_classes": 10}}
HUGE = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [200000, 200000]}}
GAUSSIAN = {"kind": "Gaussian", "dataset_size": 100, "scale": 1.0}


@contextlib.contextmanager
def _memory_cap(extra_gib: int = 4):
    """Cap this process's address space at its current size plus ``extra_gib`` GiB (a
    loader that allocates what a crafted file declares then fails, instead of swapping)."""
    if not sys.platform.startswith("linux"):
        yield
        return
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size + (extra_gib << 30)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# ---------------------------------------------------------------------------- models
def _model(spec: dict = SPEC, seed: int = 0) -> BNNModel:
    torch.manual_seed(seed)
    net = build_network(spec["name"], **spec["kwargs"])
    return BNNModel(net, prior=1.0, likelihood=Categorical(100))


def _compact(tmp_path, tying: str = "stochastic", name: str = "good.2dgz"):
    model = _model()
    path = tmp_path / name
    export_compact(path, model, SharedGMMGuide(model, toy_structure(model), tying=tying), SPEC)
    return path


def _rewrite(src, dst, header: dict | None = None, sections: dict | None = None):
    """``src`` with header fields and sections replaced, written by the project's own
    writer: a file with a valid SHA-256."""
    old, sec = read_compact(src)
    new = {k: v for k, v in old.items() if k != "sections"}
    new.update(header or {})
    parts = {n: bytes(v) for n, v in sec.items()}
    parts.update(sections or {})
    _write_container(dst, new, list(parts.items()))
    return dst


def _patched_floats(src, dst, section: str, dtype: str, index: int, value: float):
    _, sec = read_compact(src)
    a = np.frombuffer(bytes(sec[section]), dtype=np.dtype(dtype)).copy()
    a.reshape(-1)[index] = value
    return _rewrite(src, dst, sections={section: a.tobytes()})


def _full_file(tmp_path, kind: str):
    model = _model()
    path = tmp_path / f"model_{kind}.pt"
    if kind == "2dg":
        save_2dg(path, model, SharedGMMGuide(model, toy_structure(model)), network=SPEC)
    else:
        save_model(path, model, MeanFieldGuide(model), network=SPEC)
    return path


def _edit_full(src, dst, **fields):
    """A full model file with header fields replaced, sealed again by ``write_payload``."""
    payload = safe_torch_load(src)
    payload["header"] = json.dumps({**json.loads(payload["header"]), **fields})
    write_payload(payload, dst)
    return dst


def _refused(path, match: str, **kwargs) -> str:
    with pytest.raises(ValueError, match=match) as err:
        load_model(path, **kwargs)
    text = str(err.value)
    assert str(path) in text and "\n" not in text
    return text


# ---------------------------------------------------------------------------- 1. NaN / inf
@pytest.mark.parametrize(
    ("section", "index", "value", "message"),
    [
        ("centres", 0, float("nan"), r"means holds nan at \[0, 0\]"),
        ("centres", 3, float("inf"), r"means holds inf at \[1, 1\]"),
        ("covariances", 2, float("nan"), "covariances holds nan"),
        ("covariances", 0, 60000.0, "covariances holds (nan|inf)"),  # exp overflows
    ],
)
def test_non_finite_compact_centres_are_refused(tmp_path, section, index, value, message):
    src = _compact(tmp_path)
    dtype = {"centres": "centre_dtype", "covariances": "cov_dtype"}[section]
    dt = {"float16": "<f2", "float32": "<f4"}[read_compact(src)[0][dtype]]
    bad = _patched_floats(src, tmp_path / "bad.2dgz", section, dt, index, value)
    _refused(bad, message)


def test_non_finite_outliers_int8_and_network_tensors_are_refused(tmp_path):
    src = _compact(tmp_path)
    bad = _patched_floats(src, tmp_path / "o.2dgz", "outliers", "<f4", 0, float("nan"))
    _refused(bad, "outlier_loc holds nan")

    model = _model()
    int8 = tmp_path / "int8.2dgz"
    export_int8_mean_field(int8, model, MeanFieldGuide(model), network=SPEC)
    bad = _patched_floats(int8, tmp_path / "i.2dgz", "params", "<f4", 1, float("inf"))
    _refused(bad, "the means and log-scales of site 'layers.0.weight' holds")

    def bn_net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))

    bn = BNNModel(bn_net(), prior=1.0, likelihood=Categorical(10))
    path = tmp_path / "bn.2dgz"
    export_compact(path, bn, SharedGMMGuide(bn, toy_structure(bn, n_out=2, n_ell=2)))
    first = read_compact(path)[0]["net"][0]
    assert first[1] == "<f4"
    bad = _patched_floats(path, tmp_path / "bn_bad.2dgz", "net", "<f4", 0, float("nan"))
    _refused(bad, f"network tensor '{first[0]}' contains NaN", net=bn_net())


# ---------------------------------------------------------------------------- 2. likelihood
@pytest.mark.parametrize("kind", ["compact", "2dg", "mean_field"])
def test_a_gaussian_likelihood_on_a_classifier_is_refused_by_evaluate(tmp_path, kind):
    if kind == "compact":
        bad = _rewrite(_compact(tmp_path), tmp_path / "g.2dgz", header={"likelihood": GAUSSIAN})
    else:
        bad = _edit_full(_full_file(tmp_path, kind), tmp_path / f"g_{kind}.pt", likelihood=GAUSSIAN)
    with pytest.raises(ValueError, match="its likelihood is Gaussian") as err:
        evaluate_model_file(bad, num_samples=2)
    assert str(bad) in str(err.value) and "class labels" in str(err.value)


def test_an_unknown_likelihood_is_not_read_as_categorical(tmp_path):
    poisson = {"kind": "Poisson", "dataset_size": 100}
    bad = _rewrite(_compact(tmp_path), tmp_path / "p.2dgz", header={"likelihood": poisson})
    _refused(bad, "is not Categorical, Gaussian or HeteroscedasticGaussian")


@pytest.mark.parametrize("case", ["nan_centres", "gaussian_compact", "gaussian_pt"])
def test_cli_evaluate_refuses_a_lying_file_in_one_line(tmp_path, capsys, case):
    if case == "nan_centres":
        src = _compact(tmp_path, tying="representative")
        dt = {"float16": "<f2", "float32": "<f4"}[read_compact(src)[0]["centre_dtype"]]
        bad = _patched_floats(src, tmp_path / "nan.2dgz", "centres", dt, 0, float("nan"))
        message = "means holds nan"
    elif case == "gaussian_compact":
        bad = _rewrite(_compact(tmp_path), tmp_path / "g.2dgz", header={"likelihood": GAUSSIAN})
        message = "its likelihood is Gaussian"
    else:
        bad = _edit_full(_full_file(tmp_path, "mean_field"), tmp_path / "g.pt", likelihood=GAUSSIAN)
        message = "its likelihood is Gaussian"
    capsys.readouterr()
    assert main(["evaluate", str(bad), "--num-samples", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and message in err, err


# ---------------------------------------------------------------------------- 3. sizes
def test_a_compact_file_declaring_a_billion_components_is_refused_before_decoding(tmp_path):
    src = _compact(tmp_path)
    header = read_compact(src)[0]
    header_fields = {
        "n_components": 10**9,
        "component_bits": 30,
        "index": dict(header["index"], alphabet=10**9 + 2),
    }
    bad = _rewrite(src, tmp_path / "k.2dgz", header=header_fields)
    with _memory_cap():
        text = _refused(bad, "declares 1000000000 components, but its centres section of")
    assert "holds at most 3" in text


@pytest.mark.parametrize(
    ("network", "message"),
    [
        (HUGE, f"declares 40015200010 parameters and buffers, more than the {MAX_NETWORK_VALUES}"),
        (
            {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [2000, 2000]}},
            "declares 4152010 parameters and buffers, more than the 610 the file describes",
        ),
        (
            {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [1] * 100000}},
            "has lists of 100000 values, but the file describes only 4 tensors",
        ),
    ],
)
def test_a_compact_header_with_a_huge_network_is_refused_before_building_it(
    tmp_path, network, message
):
    bad = _rewrite(_compact(tmp_path), tmp_path / "n.2dgz", header={"network": network})
    with _memory_cap():
        _refused(bad, message)


def test_a_compact_header_declaring_too_many_weights_is_refused(tmp_path):
    sites = [["layers.0.weight", [200000, 200000]], ["layers.0.bias", [200000]]]
    fields = {"network": HUGE, "sites": sites, "n_weights": 40000200000}
    bad = _rewrite(_compact(tmp_path), tmp_path / "w.2dgz", header=fields)
    with _memory_cap():
        _refused(bad, f"declares 40000200000 weights, more than the {MAX_NETWORK_VALUES}")


@pytest.mark.parametrize("kind", ["mean_field", "2dg"])
def test_a_full_model_file_with_a_huge_network_spec_is_refused_before_building_it(tmp_path, kind):
    bad = _edit_full(_full_file(tmp_path, kind), tmp_path / f"huge_{kind}.pt", network=HUGE)
    with _memory_cap():
        _refused(bad, "declares 40015200010 parameters and buffers, more than the")
    smaller = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [2000, 2000]}}
    bad = _edit_full(_full_file(tmp_path, kind), tmp_path / f"big_{kind}.pt", network=smaller)
    _refused(bad, "declares 4152010 parameters and buffers, more than the 610 the file stores")


def test_ellipse_tables_wider_than_the_components_are_refused(tmp_path):
    src = _compact(tmp_path)
    for k in (10**9, 0):
        bad = _rewrite(src, tmp_path / f"e{k}.2dgz", header={"ellipse_k": k})
        with _memory_cap():
            _refused(bad, r"ellipse_k must be an integer in \[1, 3\], got")


def test_decode_index_checks_its_tables_fit_the_bytes_before_allocating():
    with _memory_cap(), pytest.raises(ValueError, match="fewer than its 1000 tables over"):
        decode_index(b"\0" * 100, [1] * 1000, 10**8, "per_site", 1, 0)


@pytest.mark.parametrize("n_ctx", [3000, 300])
def test_rans_decode_of_many_full_tables_does_not_build_their_slot_tables(n_ctx):
    """Tables of 2^16 slots in every context would make a slot table of n_ctx * 2^16
    entries; the decoder searches the tables instead (and decodes the same)."""
    rng = np.random.default_rng(0)
    alphabet = 5
    freqs = rng.multinomial((1 << 16) - alphabet, np.full(alphabet, 1 / alphabet), n_ctx) + 1
    per = 3 if n_ctx > 1000 else 20
    ctx = np.repeat(np.arange(n_ctx), per)
    sym = rng.integers(0, alphabet, ctx.size)
    bits = np.full(n_ctx, 16)
    states, words = rans_encode(sym, ctx, freqs, bits, lanes=7)
    tracemalloc.start()
    try:
        with _memory_cap(1):
            out = rans_decode(states, words, ctx, freqs, bits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(out, sym)
    assert peak < 64 << 20, peak


# ---------------------------------------------------------------------------- 4. fields
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"n_components": -1}, r"n_components must be an integer in \[1, 3\], got -1"),
        ({"n_outliers": -4}, "n_outliers must be an integer in"),
        ({"n_outliers": 10**6}, r"n_outliers must be an integer in \[0, 610\]"),
        ({"component_bits": 30}, r"component_bits must be an integer in \[2, 2\], got 30"),
        ({"alpha_bits": 40}, "alpha_bits must be an integer in"),
        ({"outlier_mu_bits": 12}, "outlier_mu_bits must be 8 or 16, got 12"),
        ({"covariances": "yes"}, "covariances 'yes' is not a boolean"),
        ({"centre_dtype": "float8"}, "centre_dtype 'float8' is not float16 or float32"),
        ({"sites": [["layers.0.weight", [-8, 64]]]}, "with a shape of non-negative integers"),
        ({"index": {"coding": "huffman"}}, "the header's index .* has no known coding"),
        ({"index": {"coding": "global", "lanes": 0, "words": 1}}, "index lanes must be"),
        ({"ellipse_alphas": {"coding": "packed", "bytes": 10**6}}, "ellipse_alphas bytes"),
        ({"net": [["x", "O", [1]]]}, r"net tensor \['x', 'O', \[1\]\] is not"),
        ({"net": [["x", "<f4", [3]]]}, "net tensors take 12 bytes, its net section 0"),
    ],
)
def test_header_fields_that_do_not_fit_together_are_refused(tmp_path, fields, message):
    bad = _rewrite(_compact(tmp_path), tmp_path / "f.2dgz", header=fields)
    _refused(bad, message)


def test_the_index_alphabet_must_be_the_components_plus_two(tmp_path):
    src = _compact(tmp_path)
    index = dict(read_compact(src)[0]["index"], alphabet=7)
    bad = _rewrite(src, tmp_path / "a.2dgz", header={"index": index})
    _refused(bad, "index alphabet 7 is not K [+] 2 = 5")


def test_good_files_still_load_and_match(tmp_path):
    """The checks refuse none of the files the writers make."""
    for tying in ("representative", "stochastic", "tied"):
        model, guide = load_model(_compact(tmp_path, tying, f"{tying}.2dgz"))
        assert isinstance(guide, SharedGMMGuide) and guide.tying == tying
    for kind in ("2dg", "mean_field"):
        load_model(_full_file(tmp_path, kind))
