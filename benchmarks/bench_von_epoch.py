"""Stage-1 cost per step: a variational online Newton (VON) step of the mean-field guide
against a deterministic SGD step of the same network, and against the SVI (Adam) step of
the same guide, side by side (interleaved rounds), on ResNet-20 and LeNet-5 at the
recipe's batch size (MNIST-sized inputs: 1 x 28 x 28, 10 classes).

Target (issue 43): a VON epoch <= 1.3x a deterministic epoch.  An epoch is a fixed number
of such steps, so the ratio of steps is the ratio of epochs.

Run: python benchmarks/bench_von_epoch.py [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.nn.functional as F
from _common import interleaved, record

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import DecomposedELBO, VariationalOnlineNewton
from twodg_pyro.infer.optim import build_optimizer
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import build_network
from twodg_pyro.priors import LayerwiseNormalPrior


def steps(arch: str, batch: int, n_data: int = 3600) -> dict:
    """One step of each trainer, as zero-argument functions."""
    torch.manual_seed(0)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))

    def network():
        return build_network(arch, num_classes=10, in_channels=1)

    det = network()
    sgd = torch.optim.SGD(det.parameters(), lr=0.1, momentum=0.9)

    def det_step():
        sgd.zero_grad(set_to_none=True)
        F.cross_entropy(det(x), y).backward()
        sgd.step()

    out = {"deterministic SGD": det_step}
    for name, opt in (
        ("mean-field VON", functools.partial(VariationalOnlineNewton, kl_weight=0.1)),
        ("mean-field SVI (Adam)", torch.optim.Adam),
    ):
        model = BNNModel(network(), prior=LayerwiseNormalPrior(), likelihood=Categorical(n_data))
        guide = MeanFieldGuide(model, init_scale=1e-3)
        model.train()
        optimizer = build_optimizer(model, guide, 1e-3, opt)
        elbo = DecomposedELBO(beta=0.1)

        def step(model=model, guide=guide, optimizer=optimizer, elbo=elbo):
            optimizer.zero_grad(set_to_none=True)
            elbo.combine(elbo.loss_terms(model, guide, x, y)).backward()
            optimizer.step()

        out[name] = step
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for arch, batch, inner in (("resnet20", 256, 2), ("lenet5", 128, 10)):
        times = interleaved(steps(arch, batch), repeats=args.repeats, inner=inner)
        base = times["deterministic SGD"]
        for name, sec in times.items():
            row = {"network": arch, "batch": batch, "step": name, "ms": sec * 1e3}
            rows.append({**row, "ratio": sec / base})
    lines = [
        "# Stage-1 step time over a deterministic SGD step (target: VON <= 1.3x)",
        "",
        f"`python benchmarks/bench_von_epoch.py --threads {args.threads} --repeats "
        f"{args.repeats}`; medians of interleaved rounds.",
        "",
        "| network | batch | step | ms | / deterministic |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['network']} | {r['batch']} | {r['step']} | {r['ms']:.1f} | {r['ratio']:.2f}x |"
        for r in rows
    ]
    record("bench_von_epoch", {"rows": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
