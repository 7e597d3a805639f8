"""Rank-1 prediction: forward passes evaluated at once, against deterministic forwards.

A rank-1 BNN with ``M = 4`` components runs ``4 S`` forward passes for ``S`` draws.
:func:`twodg_pyro.prediction.predict` bounds the passes of one vectorised forward by
``sample_chunk`` (``max(1, sample_chunk // M)`` draws at a time); before this bound, a
chunk of 10 draws ran 40 passes at once, four times the activations of another model's
chunk.  The bound is for memory; whether it changes the time is what this benchmark
measures (the recorded run: not at the default chunk).  It times one prediction of ``S = 10`` draws
(40 passes) on a ResNet-20 (1 input channel, 28 x 28, as ``--arch resnet20`` runs it)
at several ``sample_chunk``, beside 40 deterministic forwards of the same network, in
interleaved rounds.  ``sample_chunk = 40`` reproduces the old behaviour (10 draws, 40
passes, in one vectorised forward).

Run: python benchmarks/bench_predict_rank1.py [--threads 1] [--images 1000]
"""

from __future__ import annotations

import argparse
import sys

import torch
from _common import interleaved, record

from twodg_pyro.guides import Rank1Guide
from twodg_pyro.models import resnet20
from twodg_pyro.prediction import predict
from twodg_pyro.rank1_bnn import Rank1BNNModel

S, M = 10, 4
CHUNKS = (40, 10, 4)


def contenders(images: int, batch: int) -> dict:
    torch.manual_seed(0)
    net = resnet20(num_classes=10, in_channels=1).eval()
    x = torch.randn(images, 1, 28, 28)
    model = Rank1BNNModel(net, prior=0.1, likelihood=4000, components=M)
    guide = Rank1Guide(model, init_scale=0.1, seed=0)

    @torch.no_grad()
    def deterministic():
        for _ in range(S * M):
            for i in range(0, images, batch):
                net(x[i : i + batch]).softmax(-1)

    fns = {f"deterministic_x{S * M}": deterministic}
    for c in CHUNKS:
        fns[f"rank1_sample_chunk_{c}"] = lambda c=c: predict(
            model, guide, x, S, batch_size=batch, sample_chunk=c
        )
    return fns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t = interleaved(contenders(args.images, args.batch), repeats=args.repeats, inner=1, warmup=1)
    base = t[f"deterministic_x{S * M}"]
    rows = {k: {"s": v, "ratio_to_deterministic": v / base} for k, v in t.items()}
    lines = [
        f"# Rank-1 prediction on a ResNet-20, {S} draws x {M} components = {S * M} passes",
        "",
        f"{args.images} images (1 x 28 x 28), batch {args.batch}, {args.threads} thread(s), "
        f"median of {args.repeats} interleaved rounds.  Ratio: a full prediction over "
        f"{S * M} deterministic forwards of the same network (the per-pass cost of a rank-1 "
        "forward: the factors multiply the inputs and outputs of every layer).  "
        f"`sample_chunk = 40`: the {S} draws' {S * M} passes in one vectorised forward "
        "(the behaviour before the bound); 10 (the default): 2 draws, 8 passes, at a time.",
        "",
        "| contender | s | ratio to det. forwards |",
        "|---|---|---|",
    ]
    for k, r in rows.items():
        lines.append(f"| {k} | {r['s']:.2f} | {r['ratio_to_deterministic']:.2f} |")
    command = " ".join(["python benchmarks/bench_predict_rank1.py", *sys.argv[1:]])
    lines += ["", f"Command: `{command}`"]
    record("bench_predict_rank1", {"results": rows, "argv": sys.argv[1:]}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
