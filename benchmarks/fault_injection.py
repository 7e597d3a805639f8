"""Fault injection: flip one random bit of a model file and of a checkpoint, many times,
and classify every load; then forge values behind a resealed checksum.

A small digits run (64-16-10 MLP, two epochs per stage, checkpoints on) writes
``model_2dg.pt``, ``model_2dg.2dgz`` and ``checkpoints/stage3.pt``.

**Damage** (``model_2dg.pt``, ``checkpoints/stage3.pt``): each of ``--flips`` seeded
trials flips one bit of one byte of a fresh copy and loads it (``load_2dg`` /
``load_checkpoint``).  Outcomes: ``refused (checksum)`` (the content checksum caught
it), ``refused (other)`` (another ``ValueError`` naming the file: an unreadable
container, a bad header), ``unchanged`` (the flip hit container bytes that carry no
content, e.g. a zip timestamp or CRC: everything loaded is bit for bit the original),
and ``CHANGED`` (a load that returned other content: must be 0) or ``ERROR`` (any other
exception: must be 0).  The default test suite runs the same check with 40 flips of each
(``tests/test_integrity.py``).

**Forgery** (``model_2dg.pt (resealed)``, ``model_2dg.2dgz (resealed)``): the checksum
is unkeyed, so whoever edits a file can recompute it.  Each trial flips one bit of the
*content* -- of a tensor or of the JSON header of the full file (its content checksum
then recomputed by ``seal``), of the bytes before the SHA-256 of the compact file (the
SHA-256 recomputed) -- and loads it with ``load_model``.  Outcomes: ``refused (named)``
(a ``ValueError`` naming the file), ``loads (valid, finite)`` (the loaded guide's
fields pass its checks, ``SharedGMMGuide.check_values``, and its predictions of the
test images, 4 seeded draws, are finite), and ``NON-FINITE`` (a load whose predictions
hold NaN/inf: must be 0) or ``ERROR`` (any other exception: must be 0).  The default
test suite runs 40 forgeries of each (``tests/test_forged_files.py``).

Run: python benchmarks/fault_injection.py [--flips 1500] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from _common import record

from twodg_pyro.data import load_digits_split
from twodg_pyro.evaluation import seeded_predict
from twodg_pyro.files.atomic import safe_torch_load
from twodg_pyro.files.integrity import bytes_digest
from twodg_pyro.files.payload import write_payload
from twodg_pyro.infer.checkpoint import load_checkpoint
from twodg_pyro.io import load_2dg, load_model
from twodg_pyro.pipeline import config_from_dict, run

TINY = {
    "methods": ["mean_field", "2dg"],
    "num_samples": 2,
    "progress": False,
    "checkpoint_every": 1,
    "network": {"hidden": [16]},
    "stage1": {"epochs": 2, "deterministic_epochs": 1},
    "sharing": {
        "outlier_rule": "quantile",
        "mu_quantile": 0.99,
        "grad_percentile": 0.01,
        "n_components": 4,
        "n_min": 5,
        "k_nearest": 4,  # at most K (the neighbours an ellipse weight is blended from)
    },
    "stage3": {"epochs": 2},
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(a, b) -> bool:
    """Bitwise equality of loaded content."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    return type(a) is type(b) and a == b


def load_model_content(path):
    model, guide = load_2dg(path)
    return {
        "net": model.net.state_dict(),
        "guide": guide.state_dict(),
        "structure": guide.structure().to_payload(),
        "tying": guide.tying,
        "likelihood": [type(model.likelihood).__name__, model.likelihood.dataset_size],
    }


def load_ckpt(path):
    c = load_checkpoint(path)
    return {"header": c.header, "payload": c.payload}


def trial(original: bytes, path: Path, load, reference, rng) -> str:
    data = bytearray(original)
    data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
    path.write_bytes(bytes(data))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = load(path)
    except ValueError as e:
        if str(path) not in str(e):
            return "ERROR (message does not name the file)"
        return "refused (checksum)" if "checksum" in str(e) else "refused (other)"
    except Exception as e:  # noqa: BLE001 - counted, must not happen
        return f"ERROR ({type(e).__name__})"
    return "unchanged" if same(got, reference) else "CHANGED"


def _flip(buf: bytearray, rng) -> None:
    buf[int(rng.integers(len(buf)))] ^= 1 << int(rng.integers(8))


def forge_full(original: dict, path: Path, rng) -> None:
    """One bit of one tensor or JSON header of the full file flipped, checksum resealed."""
    items = [(k, v) for k, v in original.items() if k != "checksum"]
    sizes = np.array(
        [len(v.encode()) if isinstance(v, str) else v.numel() * v.element_size() for _, v in items]
    )
    at = int(rng.integers(sizes.sum()))
    i = int(np.searchsorted(np.cumsum(sizes), at, side="right"))
    key, value = items[i]
    payload = dict(original)
    if isinstance(value, str):
        raw = bytearray(value.encode())
        _flip(raw, rng)
        payload[key] = raw.decode("utf-8", "surrogateescape")
    else:
        t = value.clone()
        _flip(t.reshape(-1).view(torch.uint8).numpy(), rng)
        payload[key] = t
    write_payload(payload, path)


def forge_compact(original: bytes, path: Path, rng) -> None:
    """One bit before the SHA-256 of the compact file flipped, the SHA-256 recomputed."""
    body = bytearray(original[:-32])
    _flip(body, rng)
    path.write_bytes(bytes(body) + bytes_digest(bytes(body)))


def forgery(forge, original, path: Path, images, rng) -> str:
    forge(original, path, rng)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, guide = load_model(path)
    except ValueError as e:
        return "refused (named)" if str(path) in str(e) else "ERROR (message does not name it)"
    except Exception as e:  # noqa: BLE001 - counted, must not happen
        return f"ERROR ({type(e).__name__})"
    try:
        guide.check_values()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probs = seeded_predict(model, guide, images, num_samples=4, seed=0).mean
    except Exception as e:  # noqa: BLE001 - counted, must not happen
        return f"ERROR after loading ({type(e).__name__}: {str(e)[:60]})"
    return "loads (valid, finite)" if bool(torch.isfinite(probs).all()) else "NON-FINITE"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flips", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        run(config_from_dict(TINY), out)
        for name, load in (
            ("model_2dg.pt", load_model_content),
            ("checkpoints/stage3.pt", load_ckpt),
        ):
            original = (out / name).read_bytes()
            reference = load(out / name)
            rng = np.random.default_rng(args.seed)
            counts = collections.Counter(
                trial(original, Path(tmp) / "flipped.pt", load, reference, rng)
                for _ in range(args.flips)
            )
            rows[name] = {"bytes": len(original), **counts}
        images = load_digits_split().test.tensors[0]
        for name, forge, original in (
            ("model_2dg.pt", forge_full, safe_torch_load(out / "model_2dg.pt")),
            ("model_2dg.2dgz", forge_compact, (out / "model_2dg.2dgz").read_bytes()),
        ):
            rng = np.random.default_rng(args.seed)
            path = Path(tmp) / f"forged{Path(name).suffix}"
            counts = collections.Counter(
                forgery(forge, original, path, images, rng) for _ in range(args.flips)
            )
            size = (out / name).stat().st_size
            rows[f"{name} (resealed)"] = {"bytes": size, **counts}
    damage = [k for k in rows if "resealed" not in k]
    forged = [k for k in rows if "resealed" in k]
    lines = [
        "# Fault injection: one random bit flipped per load",
        "",
        f"{args.flips} seeded flips (seed {args.seed}) of each file of a small digits run.",
        "",
        *_table(rows, damage, ["refused (checksum)", "refused (other)", "unchanged", "CHANGED"]),
        "",
        "`unchanged`: the flip hit container bytes without content (the load returned the",
        "original, bit for bit). `CHANGED` and `ERROR` must be 0.",
        "",
        "## Forged: one bit of the content flipped, the checksum recomputed",
        "",
        *_table(rows, forged, ["refused (named)", "loads (valid, finite)", "NON-FINITE"]),
        "",
        "`loads (valid, finite)`: the loaded guide passes its field checks and predicts",
        "finite probabilities (4 seeded draws, the digits test images): a valid, different",
        "model (or the same one). `NON-FINITE` and `ERROR` must be 0.",
        "",
        "Command: `python benchmarks/fault_injection.py`",
        "",
    ]
    record(
        "fault_injection", {"flips": args.flips, "seed": args.seed, "files": rows}, "\n".join(lines)
    )
    bad = sum(
        v
        for r in rows.values()
        for k, v in r.items()
        if k in ("CHANGED", "NON-FINITE") or "ERROR" in k
    )
    sys.exit(1 if bad else 0)


def _table(rows: dict, names: list[str], kinds: list[str]) -> list[str]:
    kinds = kinds + sorted({k for n in names for k in rows[n] if k.startswith("ERROR")})
    lines = ["| file | bytes | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for name in names:
        r = rows[name]
        cells = " | ".join(str(r.get(k, 0)) for k in kinds)
        lines.append(f"| {name} | {r['bytes']:,} | {cells} |")
    return lines


if __name__ == "__main__":
    main()
