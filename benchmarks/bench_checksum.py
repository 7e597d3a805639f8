"""What the content checksum costs: writing and reading a real checkpoint with and without
it, side by side in one run (interleaved rounds).

The checkpoint is the one stage 1 writes for a mean-field ResNet-18 (CIFAR-10 head,
11.2M Bayesian weights): guide means and scales, Adam's two moments, the network's
BatchNorm state, RNG states and the header (about 180 MB).  Contenders:

* ``digest``: :func:`twodg_pyro.files.integrity.content_digest` of the payload alone;
* ``save_plain`` / ``save_sealed``: ``atomic_torch_save`` of the payload, and
  ``write_payload`` (digest + the same save);
* ``load_plain`` / ``load_verified``: ``safe_torch_load``, and the checkpoint reader
  ``read_payload`` (the same load + verifying the digest + the NaN/inf check).

Files go to a temporary folder (the page cache makes reads memory-speed: this measures
the CPU cost of the checks, not a disk).

Run: python benchmarks/bench_checksum.py [--threads N] [--repeats R]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from _common import interleaved, record

from twodg_pyro.bnn import BNNModel
from twodg_pyro.files.atomic import atomic_torch_save, safe_torch_load
from twodg_pyro.files.integrity import CHECKSUM_KEY, content_digest
from twodg_pyro.files.payload import read_payload, write_payload
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import DecomposedELBO
from twodg_pyro.infer import checkpoint as ckpt_mod
from twodg_pyro.infer.checkpoint import checkpoint_payload
from twodg_pyro.infer.state import start_state
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import build_network


def checkpoint() -> dict:
    """The payload of a stage-1 checkpoint of a mean-field ResNet-18 after one step."""
    torch.manual_seed(0)
    model = BNNModel(build_network("resnet18", num_classes=10), likelihood=Categorical(50000))
    guide = MeanFieldGuide(model)
    lr = {"loc": 1e-3, "scale": 1e-3}
    state = start_state(model, guide, 1, lr, DecomposedELBO(), torch.optim.Adam, None, None)
    for p in list(guide.parameters()) + list(model.parameters()):
        p.grad = torch.full_like(p, 1e-3)
    state.optimizer.step()  # Adam's moments exist
    payload = checkpoint_payload(state, "stage1")
    payload.pop(CHECKSUM_KEY, None)
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    payload = checkpoint()
    n_bytes = sum(v.numel() * v.element_size() for v in _tensors(payload) if v.device.type == "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        plain, sealed = Path(tmp) / "plain.pt", Path(tmp) / "sealed.pt"
        atomic_torch_save(payload, plain)
        write_payload(dict(payload), sealed)
        fmt = ckpt_mod._FORMAT
        times = interleaved(
            {
                "digest": lambda: content_digest(payload),
                "save_plain": lambda: atomic_torch_save(payload, plain),
                "save_sealed": lambda: write_payload(dict(payload), sealed),
                "load_plain": lambda: safe_torch_load(sealed),
                "load_verified": lambda: read_payload(sealed, fmt),
            },
            repeats=args.repeats,
            inner=1,
            warmup=1,
        )
        size = sealed.stat().st_size
    save_x = times["save_sealed"] / times["save_plain"]
    load_x = times["load_verified"] / times["load_plain"]
    rate = n_bytes / times["digest"] / 1e6
    lines = [
        "# Content checksum: cost on a mean-field ResNet-18 checkpoint",
        "",
        f"{size / 1e6:.0f} MB file ({n_bytes / 1e6:.0f} MB of tensors), {args.threads} "
        f"thread(s), median of {args.repeats} interleaved rounds.",
        "",
        "| step | s | ratio |",
        "|---|---|---|",
        f"| SHA-256 content digest | {times['digest']:.3f} | {rate:.0f} MB/s |",
        f"| save without checksum | {times['save_plain']:.3f} | 1.00 |",
        f"| save with checksum (write_payload) | {times['save_sealed']:.3f} | {save_x:.2f} |",
        f"| load without checks (safe_torch_load) | {times['load_plain']:.3f} | 1.00 |",
        f"| load + verify + NaN/inf check (read_payload) | {times['load_verified']:.3f} "
        f"| {load_x:.2f} |",
        "",
        "Command: `python benchmarks/bench_checksum.py`",
        "",
    ]
    record(
        "bench_checksum",
        {
            "file_mb": size / 1e6,
            "tensor_mb": n_bytes / 1e6,
            "threads": args.threads,
            "repeats": args.repeats,
            "seconds": times,
            "save_ratio": save_x,
            "load_ratio": load_x,
            "digest_mb_per_s": rate,
        },
        "\n".join(lines),
    )


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


if __name__ == "__main__":
    main()
