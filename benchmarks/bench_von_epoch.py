"""Stage-1 cost per step: a variational online Newton (VON) step of the mean-field guide
against a deterministic SGD step of the same network, and against the SVI (Adam) step of
the same guide, side by side (interleaved rounds), on ResNet-20 and LeNet-5 at the
recipe's batch size (MNIST-sized inputs: 1 x 28 x 28, 10 classes).

Target (issue 43): a VON epoch <= 1.3x a deterministic epoch.  Each mean-field trainer
runs twice: site by site (the default, the traced step bit for bit) and with
``DecomposedELBO(fused_kl=True)`` (all sites drawn, and their KL taken, as one flat vector:
:mod:`twodg_pyro.guides.fast_normal`).  Two measures: the bare
step (the forward, backward and update of one minibatch already in memory: the ratio
of steps), and an epoch of the library's own trainers over one loader of 3,600
MNIST-sized images (``train_deterministic`` with SGD against ``fit`` with VON: the
loader's batching and each trainer's bookkeeping counted, as a user pays them).

Those epochs run on random images and labels, where the two trainers' networks drift
apart (SGD at learning rate 0.1, VON's means at 1e-3), and a network's speed can depend
on its activations (max pooling, ReLU's backward): the script reports the deterministic
network's forward and backward time at its first and last weights, and on LeNet-5 it
also measures epochs on real images
(``--mnist-root``, the MNIST subset of ``experiments/mnist_subset_data.py``): both
trainers start from the same network pretrained for three epochs, the deterministic one
continues with SGD (learning rate 0.05) and VON trains at the natural-gradient recipe's
settings (learning rate 0.1, precision rate 0.01, KL weight 0.03, ``mnist-lenet5-von``).
A run with ``--networks`` keeps the committed rows of the other networks.

Run: python benchmarks/bench_von_epoch.py [--threads 1] [--repeats 15] [--networks lenet5]
[--mnist-root data/mnist_subset]
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import time

import torch
import torch.nn.functional as F
from _common import RESULTS, interleaved, interleaved_rounds, machine, paired_ratios, record

from twodg_pyro.baselines.deterministic import train_deterministic
from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import DecomposedELBO, VariationalOnlineNewton, fit
from twodg_pyro.infer.optim import build_optimizer
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import build_network
from twodg_pyro.nn.functional import VECTORISED_FROM, _Softplus, inverse_softplus, softplus
from twodg_pyro.priors import LayerwiseNormalPrior

#: the networks measured: their batch size (the recipe's) and steps per timing
NETWORKS = {"resnet20": (256, 2), "lenet5": (128, 10)}


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
    von = functools.partial(VariationalOnlineNewton, kl_weight=0.1)
    for name, opt, fused in (
        ("mean-field VON", von, False),
        ("mean-field VON, fused_kl", von, True),
        ("mean-field SVI (Adam)", torch.optim.Adam, False),
        ("mean-field SVI (Adam), fused_kl", torch.optim.Adam, True),
    ):
        model = BNNModel(network(), prior=LayerwiseNormalPrior(), likelihood=Categorical(n_data))
        guide = MeanFieldGuide(model, init_scale=1e-3)
        model.train()
        optimizer = build_optimizer(model, guide, 1e-3, opt)
        elbo = DecomposedELBO(beta=0.1, fused_kl=fused)

        def step(model=model, guide=guide, optimizer=optimizer, elbo=elbo):
            optimizer.zero_grad(set_to_none=True)
            elbo.combine(elbo.loss_terms(model, guide, x, y)).backward()
            optimizer.step()

        out[name] = step
    return out


def epochs(arch: str, batch: int, n_data: int = 3600) -> dict:
    """One more epoch of each library trainer over the same loader, as zero-argument
    functions (each call continues the same training)."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(n_data, 1, 28, 28), torch.randint(0, 10, (n_data,))
    )
    loader = make_loader(data, batch, shuffle=True)
    det = build_network(arch, num_classes=10, in_channels=1)

    def det_epoch():
        train_deterministic(det, loader, 1, lr=0.1, optimizer="sgd", progress=False)

    det_epoch.net = det  # its speed is measured at its first and last weights

    def von_epochs(fused: bool):
        net = build_network(arch, num_classes=10, in_channels=1)
        return von_epoch(net, loader, n_data, 1e-3, 0.1, fused)

    return {
        "deterministic SGD": det_epoch,
        "mean-field VON": von_epochs(False),
        "mean-field VON, fused_kl": von_epochs(True),
    }


def von_epoch(net, loader, n_data: int, lr: float, kl_weight: float, fused: bool, **von):
    """One more VON epoch of a mean-field BNN around ``net`` (``init_scale`` 1e-3, the
    layer-wise prior) by the library's ``fit``, as a zero-argument function: each call
    continues the same training (its ``TrainState``)."""
    model = BNNModel(net, LayerwiseNormalPrior(), Categorical(n_data))
    guide, state = MeanFieldGuide(model, init_scale=1e-3), None
    optimizer = functools.partial(VariationalOnlineNewton, kl_weight=kl_weight, **von)

    def epoch():
        nonlocal state
        upto = 1 if state is None else state.epoch + 1
        state = fit(
            model, guide, loader, upto, lr=lr, optimizer=optimizer, progress=False, state=state,
            elbo=DecomposedELBO(beta=kl_weight, fused_kl=fused),
        )  # fmt: skip

    return epoch


def forward_backward_ms(net, x: torch.Tensor, y: torch.Tensor, repeats: int = 30) -> float:
    """Median milliseconds of one forward and backward pass of ``net`` on ``(x, y)``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        F.cross_entropy(net(x), y).backward()
        times.append(time.perf_counter() - start)
    net.zero_grad(set_to_none=True)
    return statistics.median(times) * 1e3


def mnist_train(root: str) -> torch.utils.data.TensorDataset | None:
    """The MNIST subset's training images in memory (no decoding per epoch); ``None``
    without the subset."""
    from twodg_pyro.data import load_dataset

    try:
        split = load_dataset("mnist", root)
    except (FileNotFoundError, ValueError, OSError):
        return None
    xs, ys = zip(*make_loader(split.train, 512), strict=True)
    return torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys))


def pretrained_lenet5(data, batch: int) -> tuple:
    """``(loader, net)``: ``data`` shuffled in minibatches of ``batch`` (seed 0) and a
    LeNet-5 trained on them for three epochs, the start both trainers share."""
    torch.manual_seed(0)
    loader = make_loader(data, batch, shuffle=True)
    net = build_network("lenet5", num_classes=10, in_channels=1)
    train_deterministic(net, loader, 3, lr=1e-3, progress=False)
    return loader, net


def real_epochs(root: str, batch: int = 128) -> dict | None:
    """Epochs of LeNet-5 on the MNIST subset's training images (module docstring), as
    zero-argument functions; ``None`` without the subset."""
    data = mnist_train(root)
    if data is None:
        return None
    loader, net = pretrained_lenet5(data, batch)
    det = copy.deepcopy(net)

    def von_epochs(fused: bool):  # the natural-gradient recipe's settings
        return von_epoch(copy.deepcopy(net), loader, len(data), 0.1, 0.03, fused, beta2=0.99)

    return {
        "deterministic SGD": lambda: train_deterministic(
            det, loader, 1, lr=0.05, optimizer="sgd", progress=False
        ),
        "mean-field VON": von_epochs(False),
        "mean-field VON, fused_kl": von_epochs(True),
    }


def operations(arch: str, batch: int) -> dict[str, int]:
    """The torch operations one step of each trainer dispatches (``aten`` calls, views and
    autograd's included): what a small network's step pays per operation, not per
    weight."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    out = {}
    for name, step in steps(arch, batch).items():
        step()  # the optimiser's state made
        Count.n = 0
        with Count():
            step()
        out[name] = Count.n
    return out


def scale_maps(n: int = 48_000) -> dict:
    """The map between a guide's rho and its scale on LeNet-5's ``fc1`` (48,000 weights),
    torch's element-by-element float32 kernels against the library's vectorised ones."""
    rho = torch.full((n,), -6.9) + 0.5 * torch.randn(n)
    sigma = F.softplus(rho)
    return {
        "softplus, torch": lambda: F.softplus(rho),
        "softplus, library": lambda: softplus(rho),
        "inverse softplus, torch (log expm1)": lambda: torch.log(torch.expm1(sigma)),
        "inverse softplus, library": lambda: inverse_softplus(sigma),
    }


def crossover() -> dict:
    """Softplus forward and backward on float32 tensors around
    :data:`~twodg_pyro.nn.functional.VECTORISED_FROM`: torch's kernel against the
    ``exp``/``log`` forms (LeNet-5's sites hold 6 to 48,000 weights)."""
    out = {}
    for n in (150, 2400, 8192, 10080, 48000):
        rho = (torch.full((n,), -6.9) + 0.5 * torch.randn(n)).requires_grad_()
        ones = torch.ones(n)
        out[f"{n} torch"] = lambda rho=rho, g=ones: F.softplus(rho).backward(g)
        out[f"{n} forms"] = lambda rho=rho, g=ones: _Softplus.apply(rho).backward(g)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--networks", nargs="+", choices=NETWORKS, default=list(NETWORKS))
    p.add_argument("--mnist-root", default="data/mnist_subset")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows, speed, today = [], {}, machine()["date"]
    for arch in args.networks:
        batch, inner = NETWORKS[arch]
        units = [("step", steps, inner), ("epoch", epochs, 1)]
        if arch == "lenet5":
            units.append(("epoch, MNIST", lambda a, b: real_epochs(args.mnist_root, b), 1))
        for unit, make, n in units:
            fns = make(arch, batch)
            if fns is None:
                print(f"no MNIST subset at {args.mnist_root}: its epochs are not measured")
                continue
            net = getattr(fns["deterministic SGD"], "net", None)
            if net is not None:
                x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
                speed[arch] = [forward_backward_ms(net, x, y)]
            rounds = interleaved_rounds(fns, repeats=args.repeats, inner=n)
            if net is not None:
                speed[arch].append(forward_backward_ms(net, x, y))
            ratios = paired_ratios(rounds, "deterministic SGD")
            for name, secs in rounds.items():
                row = {"network": arch, "batch": batch, "unit": unit, "step": name, "date": today}
                q1, ratio, q3 = ratios[name]
                ms = statistics.median(secs) * 1e3
                rows.append({**row, "ms": ms, "ratio": ratio, "ratio_q1": q1, "ratio_q3": q3})
        ops = operations(arch, batch)
        rows += [
            {"network": arch, "batch": batch, "unit": "step", "step": k, "operations": v}
            for k, v in ops.items()
        ]
    old = RESULTS / "bench_von_epoch.json"
    command = (
        f"python benchmarks/bench_von_epoch.py --threads {args.threads} --repeats {args.repeats}"
    )
    note = ""
    if set(args.networks) != set(NETWORKS) and old.exists():  # the other networks' rows
        kept = json.loads(old.read_text())
        rows = [r for r in kept["rows"] if r["network"] not in args.networks] + rows
        speed = {**kept.get("deterministic_forward_backward_ms", {}), **speed}
        others = sorted(set(NETWORKS) - set(args.networks))
        command += f" --networks {' '.join(args.networks)}"
        dates = {r.get("date", kept["machine"]["date"]) for r in rows if r["network"] in others}
        note = f" (the {', '.join(others)} rows: kept from the run of {', '.join(sorted(dates))})"
    lines = [
        "# Stage-1 step time over a deterministic SGD step (target: VON <= 1.3x)",
        "",
        f"`{command}`{note}; medians of interleaved rounds. The ratio is the "
        "median over the rounds of each round's time over the deterministic one's, with its "
        "quartiles.",
        "",
        "An epoch: the library's trainers over one loader of 3,600 images "
        "(`train_deterministic`, SGD; `fit`, VON): random images, and (`epoch, MNIST`) "
        "the MNIST subset's training images from one pretrained network, VON at the "
        "natural-gradient recipe's settings (module docstring).",
        "",
        "| network | batch | per | trainer | ms | / deterministic | quartiles |",
        "|---|---|---|---|---|---|---|",
    ]
    timed = [r for r in rows if "ms" in r]
    lines += [
        f"| {r['network']} | {r['batch']} | {r['unit']} | {r['step']} | {r['ms']:.1f} "
        f"| {r['ratio']:.2f}x | {r['ratio_q1']:.2f}-{r['ratio_q3']:.2f} |"
        for r in timed
    ]
    lines += [
        "",
        "The deterministic network of the random-image epochs: one forward and backward "
        "pass (ms) at its first weights and after the rounds (SGD at learning rate 0.1 on "
        "random labels).",
        "",
        "| network | first weights | last weights |",
        "|---|---|---|",
    ]
    lines += [f"| {arch} | {a:.1f} | {b:.1f} |" for arch, (a, b) in speed.items()]
    lines += [
        "",
        "Operations one step dispatches (torch's `aten` calls, forward, backward and update).",
        "",
        "| network | trainer | operations |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r['network']} | {r['step']} | {r['operations']:,} |" for r in rows if "operations" in r
    ]
    maps = {k: v * 1e6 for k, v in interleaved(scale_maps(), args.repeats, inner=200).items()}
    lines += [
        "",
        "The scales of LeNet-5's `fc1` (48,000 weights, float32): rho to sigma and back.",
        "",
        "| map | us |",
        "|---|---|",
    ]
    lines += [f"| {name} | {us:.0f} |" for name, us in maps.items()]
    cross = {k: v * 1e6 for k, v in interleaved(crossover(), args.repeats, inner=200).items()}
    lines += [
        "",
        "Softplus forward and backward by size (float32): torch's kernel against the "
        "`exp`/`log` forms; the library uses the forms from "
        f"{VECTORISED_FROM:,} elements.",
        "",
        "| elements | torch, us | forms, us |",
        "|---|---|---|",
    ]
    sizes = dict.fromkeys(k.split()[0] for k in cross)
    lines += [f"| {n} | {cross[n + ' torch']:.0f} | {cross[n + ' forms']:.0f} |" for n in sizes]
    payload = {
        "rows": rows,
        "deterministic_forward_backward_ms": speed,
        "scale_maps_us": maps,
        "softplus_by_size_us": cross,
    }
    record("bench_von_epoch", payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
