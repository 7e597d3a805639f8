"""Fault injection: flip one random bit of a model file and of a checkpoint, many times,
and classify every load.

A small digits run (64-16-10 MLP, two epochs per stage, checkpoints on) writes
``model_2dg.pt`` and ``checkpoints/stage3.pt``.  Each of ``--flips`` seeded trials flips
one bit of one byte of a fresh copy and loads it (``load_2dg`` / ``load_checkpoint``).
Outcomes: ``refused (checksum)`` (the content checksum caught it), ``refused (other)``
(another ``ValueError`` naming the file: an unreadable container, a bad header),
``unchanged`` (the flip hit container bytes that carry no content, e.g. a zip
timestamp or CRC: everything loaded is bit for bit the original), and ``CHANGED`` (a
load that returned other content: must be 0) or ``ERROR`` (any other exception: must
be 0).  The default test suite runs the same check with 40 flips of each
(``tests/test_integrity.py``).

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

sys.path.insert(0, str(Path(__file__).parent))
from _common import record  # noqa: E402

from twodg_pyro.infer.checkpoint import load_checkpoint  # noqa: E402
from twodg_pyro.io import load_2dg  # noqa: E402
from twodg_pyro.pipeline import config_from_dict, run  # noqa: E402

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


def load_model(path):
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
        for name, load in (("model_2dg.pt", load_model), ("checkpoints/stage3.pt", load_ckpt)):
            original = (out / name).read_bytes()
            reference = load(out / name)
            rng = np.random.default_rng(args.seed)
            counts = collections.Counter(
                trial(original, Path(tmp) / "flipped.pt", load, reference, rng)
                for _ in range(args.flips)
            )
            rows[name] = {"bytes": len(original), **counts}
    kinds = ["refused (checksum)", "refused (other)", "unchanged", "CHANGED"]
    kinds += sorted({k for r in rows.values() for k in r if k.startswith("ERROR")})
    lines = [
        "# Fault injection: one random bit flipped per load",
        "",
        f"{args.flips} seeded flips (seed {args.seed}) of each file of a small digits run.",
        "",
        "| file | bytes | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['bytes']:,} | " + " | ".join(str(r.get(k, 0)) for k in kinds) + " |"
        )
    lines += [
        "",
        "`unchanged`: the flip hit container bytes without content (the load returned the",
        "original, bit for bit). `CHANGED` and `ERROR` must be 0.",
        "",
        "Command: `python benchmarks/fault_injection.py`",
        "",
    ]
    record(
        "fault_injection", {"flips": args.flips, "seed": args.seed, "files": rows}, "\n".join(lines)
    )
    bad = sum(v for r in rows.values() for k, v in r.items() if k == "CHANGED" or "ERROR" in k)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
