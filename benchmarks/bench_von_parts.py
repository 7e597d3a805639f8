"""Where a stage-1 step's time goes on LeNet-5: each part of a variational online Newton
(VON) step of the mean-field guide beside the same part of a deterministic SGD step, in
interleaved rounds (issue 43's 1.3x target, missed on LeNet-5 by ``bench_von_epoch.py``).

Each round takes the next minibatch of 128 of the MNIST subset's training images (random
images without the subset; the three trainers take the same one), from one LeNet-5
pretrained for three epochs, so the rounds train as epochs do: SGD (learning rate 0.05,
momentum 0.9) on the network, VON at the natural-gradient recipe's settings (learning rate
0.1, precision rate 0.01, KL weight 0.03, ``init_scale`` 1e-3), site by site (the default,
the traced step bit for bit) and with ``fused_kl``.  The VON step is the one
:class:`~twodg_pyro.infer.DecomposedELBO`'s fast step takes, written out part by part (the
same calls as :func:`~twodg_pyro.infer.fast_step.fast_particle_terms`, less its check of the
targets' shape):

- ``draw and KL``: the guide's draw of every weight and the KL's closed form
  (``fast_draw``, ``fast_kl``); the deterministic step has none;
- ``network``: the network's forward pass on the drawn weights (``run_network``) or on
  its own parameters;
- ``likelihood``: the minibatch's log-density scaled to the data set and the loss (or the
  cross-entropy);
- ``backward`` and ``update``: the loss's backward pass and the optimiser's step.

Beside them, the guide's scale map over all 61,706 weights at once: softplus (rho to sigma),
which the default VON step computes twice (the draw, the update), and its inverse (the
update writes rho back); the fused step shares its sigma between the draw and the update
(:mod:`twodg_pyro.nn.shared_scale`) and computes only the inverse.  Each part's time is
the median over the rounds; the parts of one step add up to about that step's time.

**The allocator.**  glibc gives freed memory back to the system (trimming, and ``mmap`` for
large blocks), and the next large tensor then pays page faults as it is first written: a
part's time would depend on what the parts before it freed (the network part of whichever
trainer ran third in a round took 2-3 ms more, the same network alone did not).  So the
script first asks glibc to keep freed memory (``mallopt``: no trimming below 1 GiB, no
``mmap`` below 32 MiB), and says so; ``--glibc-default`` leaves the allocator as it is.

Run: python benchmarks/bench_von_parts.py [--threads 1] [--repeats 200]
[--mnist-root data/mnist_subset] [--glibc-default]
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import functools
import itertools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import record
from bench_von_epoch import mnist_train, pretrained_lenet5

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import DecomposedELBO, VariationalOnlineNewton
from twodg_pyro.infer.fast_step import site_priors
from twodg_pyro.infer.optim import build_optimizer
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.nn.functional import inverse_softplus, softplus
from twodg_pyro.priors import LayerwiseNormalPrior

PARTS = ("draw and KL", "network", "likelihood", "backward", "update")
BATCH, N_DATA, KL_WEIGHT = 128, 3600, 0.03


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory in the process (module docstring); ``False`` where the
    C library is not glibc or refuses."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt's parameter numbers
    return bool(libc.mallopt(m_trim_threshold, 2**30) and libc.mallopt(m_mmap_threshold, 2**25))


def deterministic_step(net):
    """One SGD step of ``net``, as a function returning each part's seconds."""
    sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    def step(x, y) -> dict[str, float]:
        t0 = time.perf_counter()
        sgd.zero_grad(set_to_none=True)
        logits = net(x)
        t1 = time.perf_counter()
        loss = F.cross_entropy(logits, y)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        sgd.step()
        t4 = time.perf_counter()
        return {"network": t1 - t0, "likelihood": t2 - t1, "backward": t3 - t2, "update": t4 - t3}

    return step


def von_step(net, fused: bool):
    """One VON step of a mean-field BNN around ``net``, part by part (module docstring),
    as a function returning each part's seconds."""
    model = BNNModel(net, LayerwiseNormalPrior(), Categorical(N_DATA))
    guide = MeanFieldGuide(model, init_scale=1e-3)
    model.train()
    von = functools.partial(VariationalOnlineNewton, kl_weight=KL_WEIGHT, beta2=0.99)
    optimizer = build_optimizer(model, guide, 0.1, von)
    elbo = DecomposedELBO(beta=KL_WEIGHT, fused_kl=fused)
    priors = site_priors(model)

    def step(x, y) -> dict[str, float]:
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        values = guide.fast_draw(priors, fused=True) if fused else guide.fast_draw(priors)
        terms = dict(guide.fast_kl(priors, values, fused=fused))
        t1 = time.perf_counter()
        output = model.run_network(values, x)
        t2 = time.perf_counter()
        likelihood = model.likelihood
        log_p = likelihood.log_prob(output, y) * (N_DATA / output.shape[0])
        terms["nll"] = torch.zeros(()) - log_p.sum()
        loss = elbo.combine(terms)
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        optimizer.step()
        t5 = time.perf_counter()
        return dict(zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True))

    return step


def scale_maps(n: int) -> dict[str, Callable]:
    """Softplus and its inverse over ``n`` weights at once (float32, the CPU)."""
    rho = torch.full((n,), -7.0) + 0.5 * torch.randn(n)
    sigma = softplus(rho)
    return {"softplus": lambda: softplus(rho), "inverse softplus": lambda: inverse_softplus(sigma)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--mnist-root", default="data/mnist_subset")
    p.add_argument("--glibc-default", action="store_true", help="leave the allocator as it is")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kept = False if args.glibc_default else keep_freed_memory()
    data, images = mnist_train(args.mnist_root), "the MNIST subset's training images"
    if data is None:
        data = torch.utils.data.TensorDataset(
            torch.randn(N_DATA, 1, 28, 28), torch.randint(0, 10, (N_DATA,))
        )
        images = "random images (no MNIST subset found)"
    loader, net = pretrained_lenet5(data, BATCH)
    steps = {
        "deterministic SGD": deterministic_step(copy.deepcopy(net)),
        "mean-field VON": von_step(copy.deepcopy(net), fused=False),
        "mean-field VON, fused_kl": von_step(copy.deepcopy(net), fused=True),
    }
    batches = itertools.cycle(list(loader))  # every trainer takes each round's minibatch
    maps = scale_maps(sum(p.numel() for p in net.parameters()))
    parts: dict[str, dict[str, list[float]]] = {k: {} for k in [*steps, *maps]}
    for r in range(args.repeats + 10):  # 10 warm-up rounds
        x, y = next(batches)
        for name, step in steps.items():
            for part, secs in step(x, y).items():
                if r >= 10:
                    parts[name].setdefault(part, []).append(secs)
        for name, fn in maps.items():
            t = time.perf_counter()
            fn()
            if r >= 10:
                parts[name].setdefault("all weights", []).append(time.perf_counter() - t)
    ms = {k: {part: statistics.median(v) * 1e3 for part, v in d.items()} for k, d in parts.items()}
    det = ms["deterministic SGD"]
    command = (
        f"python benchmarks/bench_von_parts.py --threads {args.threads} --repeats {args.repeats}"
        + (" --glibc-default" if args.glibc_default else "")
    )
    allocator = "freed memory kept by glibc" if kept else "the allocator as it is"
    lines = [
        "# Where a stage-1 step's time goes on LeNet-5 (issue 43: VON <= 1.3x)",
        "",
        f"`{command}`: minibatches of {BATCH} of {images}, medians over "
        f"{args.repeats} interleaved rounds, ms; {allocator} (module docstring).",
        "",
        "| part | deterministic SGD | mean-field VON | extra | VON, fused_kl | extra |",
        "|---|---|---|---|---|---|",
    ]
    von, fused = ms["mean-field VON"], ms["mean-field VON, fused_kl"]
    for part in PARTS:
        d = det.get(part, 0.0)
        lines.append(
            f"| {part} | {d:.2f} | {von[part]:.2f} | {von[part] - d:+.2f} | {fused[part]:.2f} "
            f"| {fused[part] - d:+.2f} |"
        )
    totals = [sum(m.get(part, 0.0) for part in PARTS) for m in (det, von, fused)]
    lines += [
        f"| **sum of the parts** | {totals[0]:.2f} | {totals[1]:.2f} | "
        f"{totals[1] - totals[0]:+.2f} ({totals[1] / totals[0]:.2f}x) | {totals[2]:.2f} | "
        f"{totals[2] - totals[0]:+.2f} ({totals[2] / totals[0]:.2f}x) |",
        "",
        "The guide's scale map over all the weights at once (the default VON step computes "
        "softplus twice and its inverse once; the fused one, which shares its sigma between "
        "the draw and the update, only the inverse):",
        "",
        "| map | ms |",
        "|---|---|",
        *(f"| {k} | {ms[k]['all weights']:.3f} |" for k in maps),
        "",
    ]
    payload = {"command": command, "images": images, "freed_memory_kept": kept, "ms": ms}
    record("bench_von_parts", payload, "\n".join(lines))


if __name__ == "__main__":
    main()
