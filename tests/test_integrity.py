"""Content checksums of model files and checkpoints: a changed byte is a ValueError naming
the file, NaN/inf parameters are refused, files of format version 1 (before the checksum)
are refused saying what to do, and random byte flips either fail clearly or change
nothing (fault injection)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from fault_injection import same  # bitwise equality of loaded payloads

from twodg_pyro.files.integrity import (
    CHECKSUM_KEY,
    ChecksumError,
    check_finite,
    content_digest,
    seal,
    verify_checksum,
)
from twodg_pyro.infer.checkpoint import load_checkpoint
from twodg_pyro.io import load_2dg, load_model


@pytest.fixture
def run_dir(tiny_run) -> Path:
    return tiny_run


def _raw(path: Path) -> dict:
    return torch.load(path, weights_only=True)


# ---------------------------------------------------------------------- the digest
def test_digest_is_of_the_content_and_sees_every_change():
    x = torch.linspace(-1, 1, 50)
    payload = {"header": json.dumps({"a": 1}), "t/x": x, "n": [1, 2.5, None, True, "s"]}
    d = content_digest(payload)
    assert d.startswith("sha256:") and len(d) == len("sha256:") + 64
    assert content_digest(dict(reversed(list(payload.items())))) == d  # order of keys
    assert content_digest({**payload, "t/x": x.clone()}) == d  # same values, new tensor
    y = x.clone()
    y[17] = torch.nextafter(y[17], torch.tensor(2.0))  # one ulp
    assert content_digest({**payload, "t/x": y}) != d
    assert content_digest({**payload, "t/x": x.double()}) != d  # dtype is content
    assert content_digest({**payload, "t/x": x.reshape(5, 10)}) != d  # shape is content
    for changed in (
        [1, 2.5, None, True, "t"],
        (1, 2.5, None, True, "s"),
        [1.0, 2.5, None, True, "s"],
    ):
        assert content_digest({**payload, "n": changed}) != d
    # views: only the values count (a one-element view may keep any stride)
    base = torch.arange(8.0)
    assert content_digest(base[::2]) == content_digest(torch.tensor([0.0, 2.0, 4.0, 6.0]))
    assert content_digest(base[2:3].as_strided((1,), (2,))) == content_digest(torch.tensor([2.0]))
    assert content_digest(base.reshape(2, 4)[:, 1:2].t()) == content_digest(
        torch.tensor([[1.0, 5.0]])
    )
    # other formats (bytes, NumPy arrays) use the same helper
    assert content_digest(b"abc") != content_digest(b"abd")
    assert content_digest(np.arange(4, dtype=np.uint8)) != content_digest(np.arange(4))
    sealed = seal(dict(payload))
    assert sealed[CHECKSUM_KEY] == d and verify_checksum(sealed, "p.pt")
    assert verify_checksum(payload, "p.pt", required=False) is False
    with pytest.raises(ChecksumError, match="'p.pt' has no content checksum"):
        verify_checksum(payload, "p.pt")
    with pytest.raises(ChecksumError, match="'p.pt' is corrupted"):
        verify_checksum({**sealed, "t/x": y}, "p.pt")
    with pytest.raises(ValueError, match=r"'f' holds 2 non-finite .* t/x \(2 of 50, first nan\)"):
        x2 = x.clone()
        x2[[3, 9]] = float("nan")
        check_finite({"t/x": x2, "i": torch.arange(3)}, "f")
    check_finite({"big": torch.full((4,), 1e308, dtype=torch.float64)}, "f")  # sum overflows
    with pytest.raises(ValueError, match=r"big \(1 of 4, first -inf\)"):
        check_finite(
            {"big": torch.tensor([1e308, 1e308, -float("inf"), 0.0], dtype=torch.float64)}, "f"
        )


# ---------------------------------------------------------------------- files
def test_files_carry_a_checksum_and_a_changed_value_is_refused(run_dir, tmp_path):
    for name, load in (
        ("model_2dg.pt", load_2dg),
        ("checkpoints/stage3.pt", load_checkpoint),
        ("checkpoints/stage1.pt", load_checkpoint),
    ):
        payload = _raw(run_dir / name)
        assert payload[CHECKSUM_KEY] == content_digest(payload)
        key = next(k for k in payload if k.startswith("guide/") and payload[k].is_floating_point())
        payload[key].view(-1)[0] += 1e-3  # one changed value, checksum not updated
        bad = tmp_path / name.replace("/", "_")
        torch.save(payload, bad)
        with pytest.raises(ValueError, match=f"{bad.name}' is corrupted: its content does not"):
            load(bad)


def test_nan_or_inf_parameters_are_refused(run_dir, tmp_path):
    for name, load, section in (
        ("model_2dg.pt", load_2dg, "guide/"),
        ("model_2dg.pt", load_2dg, "net/"),
        ("checkpoints/stage1.pt", load_checkpoint, "guide/"),
        ("checkpoints/stage3.pt", load_checkpoint, "guide/"),
    ):
        payload = _raw(run_dir / name)
        key = next(k for k in payload if k.startswith(section) and payload[k].is_floating_point())
        payload[key].view(-1)[:3] = torch.tensor([float("nan"), float("inf"), float("nan")])
        bad = tmp_path / "nan.pt"
        torch.save(seal(payload), bad)  # a consistent file of a diverged model
        with pytest.raises(ValueError, match=rf"'{bad}' holds 3 non-finite .*{key}"):
            load(bad)


def test_format_version_1_files_are_refused_saying_what_to_do(run_dir, tmp_path):
    """A file written before checksums (format version 1) is not read: the message names
    the file, its version, the version this release reads and what to do; a file of the
    current version without its checksum is refused as damaged."""
    cases = (
        ("model_2dg.pt", load_2dg, "format version", "re-save it with a twodg_pyro"),
        ("model_2dg.pt", load_model, "format version", "or retrain the model"),
        ("checkpoints/stage3.pt", load_checkpoint, "checkpoint format version", "run the stage"),
    )
    for name, loader, noun, todo in cases:
        payload = _raw(run_dir / name)
        del payload[CHECKSUM_KEY]
        header = json.loads(payload["header"])
        assert header["format_version"] == 2
        torch.save(payload, tmp_path / "v2.pt")
        with pytest.raises(ChecksumError, match="v2.pt' has no content checksum"):
            loader(tmp_path / "v2.pt")
        payload["header"] = json.dumps({**header, "format_version": 1})
        torch.save(payload, tmp_path / "v1.pt")
        read = f"v1.pt' has {noun} 1; this version of twodg_pyro reads {noun} 2 only: "
        with pytest.raises(ValueError, match=f"{read}an earlier twodg_pyro wrote it; .*{todo}"):
            loader(tmp_path / "v1.pt")


# ---------------------------------------------------------------------- fault injection
def _flip(data: bytes, rng: np.random.Generator) -> bytes:
    """``data`` with one random bit of one random byte flipped."""
    b = bytearray(data)
    i = int(rng.integers(len(b)))
    b[i] ^= 1 << int(rng.integers(8))
    return bytes(b)


def _model_state(model, guide) -> dict:
    return {
        "net": {k: v.clone() for k, v in model.net.state_dict().items()},
        "guide": {k: v.clone() for k, v in guide.state_dict().items()},
        "structure": guide.structure().to_payload(),
        "lik": [type(model.likelihood).__name__, model.likelihood.dataset_size],
        "tying": guide.tying,
    }


@pytest.mark.parametrize("name, flips", [("model_2dg.pt", 40), ("checkpoints/stage3.pt", 40)])
def test_random_byte_flips_fail_clearly_or_change_nothing(run_dir, tmp_path, name, flips):
    """Flip one random bit ``flips`` times (seeded); every load either raises a
    ValueError naming the file or gives exactly the original content."""
    original = (run_dir / name).read_bytes()
    if name == "model_2dg.pt":

        def load(path):
            return _model_state(*load_2dg(path))

    else:

        def load(path):
            ckpt = load_checkpoint(path)
            return {"header": ckpt.header, "payload": ckpt.payload}

    reference = load(run_dir / name)
    rng = np.random.default_rng(17)
    failed = unchanged = 0
    for _ in range(flips):
        bad = tmp_path / "flipped.pt"
        bad.write_bytes(_flip(original, rng))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a flip must not turn into a mere warning
                got = load(bad)
        except ValueError as e:
            assert str(bad) in str(e)
            failed += 1
            continue
        assert same(got, reference), "a flipped byte loaded with changed content"
        unchanged += 1
    assert failed + unchanged == flips and failed > flips // 2
