"""Multi-process scaling on CPU: 1 vs 2 processes (gloo, loopback).

* stage-3 SVI epoch (shared-GMM guide, ``representative`` tying) over ResNet-20 on
  CIFAR-sized random data (``N_DATA`` examples 3x32x32, global batch ``BATCH``), timed
  with :func:`~twodg_pyro.distributed.fit_distributed`;
* the 2-D mixture fit (:class:`~twodg_pyro.distributed.DistributedGaussianMixture2D`,
  full-batch EM, ``GMM_K`` components, exactly ``GMM_ITERS`` iterations) on ``GMM_N``
  points.

Configurations: 1 process x 1 thread, 1 process x 2 threads, 2 processes x 1 thread,
each run ``ROUNDS`` times, the rounds interleaved so that drifts of the machine's load
hit every configuration alike; the table shows the best round (least disturbed), the
JSON every round.  Every run uses fresh processes started like ``torchrun`` does
(:func:`~twodg_pyro.distributed.launch.run_local`); the rank-0 time is recorded (the
ranks finish together).  The machine's load average is recorded with the numbers:
the cores may be shared.

Run: python benchmarks/bench_distributed.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import record

N_DATA, BATCH, EPOCHS = 256, 64, 3
GMM_N, GMM_K, GMM_ITERS = 2_000_000, 256, 10
CONFIGS = [(1, 1), (1, 2), (2, 1)]  # (processes, threads per process)
ROUNDS = 2  # every configuration runs once per round, rounds interleaved


# ---------------------------------------------------------------------- inputs
def _cifar_like(n: int):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(10, (n,), generator=g)


def _prepare(tmp: Path) -> dict:
    """ResNet-20 and a sharing structure over it (untrained mean-field means and scales)."""
    from twodg_pyro.bnn import BNNModel
    from twodg_pyro.guides import MeanFieldGuide
    from twodg_pyro.likelihoods import Categorical
    from twodg_pyro.models import resnet20
    from twodg_pyro.pipeline import SharingConfig
    from twodg_pyro.sharing import build_sharing

    torch.manual_seed(0)
    net = resnet20()
    model = BNNModel(net, prior=1.0, likelihood=Categorical(N_DATA))
    mf = MeanFieldGuide(model, seed=0)
    cfg = SharingConfig(
        outlier_rule="quantile", grad_percentile=0.0, n_components=64, n_min=5, gmm_max_iter=20
    )
    structure, report = build_sharing(model, mf, None, cfg)
    torch.save({"net": net.state_dict(), "structure": structure}, tmp / "resnet20.pt")
    g = torch.Generator().manual_seed(1)
    centres = torch.randn(400, 2, generator=g) * torch.tensor([0.05, 0.01])
    pts = centres[torch.randint(400, (GMM_N,), generator=g)]
    pts = pts + torch.randn(GMM_N, 2, generator=g) * torch.tensor([0.004, 0.0008])
    torch.save(pts, tmp / "points.pt")
    return {"n_weights": model.num_weights, "n_gaussians": structure.n_gaussians}


# ---------------------------------------------------------------------- worker
def _worker(tmp: Path, what: str) -> None:
    from torch.utils.data import TensorDataset

    from twodg_pyro.bnn import BNNModel
    from twodg_pyro.distributed import DistributedGaussianMixture2D, env, fit_distributed
    from twodg_pyro.guides import SharedGMMGuide
    from twodg_pyro.likelihoods import Categorical
    from twodg_pyro.models import resnet20

    info = env.setup("gloo", timeout_s=1200)
    out = {"world_size": info.world_size, "threads": torch.get_num_threads()}
    if what == "stage3":
        d = torch.load(tmp / "resnet20.pt", weights_only=False)
        net = resnet20()
        net.load_state_dict(d["net"])
        model = BNNModel(net, prior=1.0, likelihood=Categorical(N_DATA))
        guide = SharedGMMGuide(model, d["structure"], tying="representative")
        data = TensorDataset(*_cifar_like(N_DATA))
        times = []

        class Clock:
            def on_train_begin(self, state):
                self.t = time.perf_counter()

            def on_epoch_begin(self, state):
                env.barrier()
                self.t = time.perf_counter()

            def on_epoch_end(self, state):
                times.append(time.perf_counter() - self.t)

            def on_train_end(self, state):
                pass

        fit_distributed(
            model,
            guide,
            data,
            EPOCHS,
            batch_size=BATCH,
            lr=1e-3,
            callbacks=[Clock()],
            progress=False,
        )
        out["epoch_seconds"] = times  # the first epoch includes DDP's first-step set-up
    else:
        pts = torch.load(tmp / "points.pt")
        env.barrier()
        t0 = time.perf_counter()
        g = DistributedGaussianMixture2D(GMM_K, max_iter=GMM_ITERS, tol=1e-12, random_state=0)
        g.fit(pts)
        out["fit_seconds"] = time.perf_counter() - t0
        out["n_iter"] = g.n_iter_
        out["lower_bound"] = g.lower_bound_
        out["n_reseeded"] = g.n_reseeded_
    if info.rank == 0:
        (tmp / f"{what}.json").write_text(json.dumps(out))
    env.cleanup()


# ---------------------------------------------------------------------- driver
def _launch(tmp: Path, what: str, procs: int, threads: int, quick: bool) -> dict:
    from twodg_pyro.distributed.launch import run_local

    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    argv = [str(Path(__file__).resolve()), "--worker", what, str(tmp)]
    res = run_local(argv + (["--quick"] if quick else []), procs, 1800.0, env=env)
    for r in res:
        if r.returncode != 0:
            raise RuntimeError(f"{what} rank {r.rank} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads((tmp / f"{what}.json").read_text())


def main() -> None:
    global N_DATA, GMM_N, EPOCHS
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument("--worker", nargs=2, metavar=("WHAT", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        N_DATA, GMM_N, EPOCHS = 64, 100_000, 2
    if args.worker:
        _worker(Path(args.worker[1]), args.worker[0])
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        meta = _prepare(tmp)
        runs = []
        for rnd in range(ROUNDS):
            for procs, threads in CONFIGS:
                s3 = _launch(tmp, "stage3", procs, threads, args.quick)
                gm = _launch(tmp, "gmm", procs, threads, args.quick)
                ep = s3["epoch_seconds"][1:] or s3["epoch_seconds"]
                runs.append(
                    {
                        "round": rnd,
                        "processes": procs,
                        "threads_per_process": threads,
                        "stage3_epoch_s": statistics.median(ep),
                        "stage3_epoch_s_all": s3["epoch_seconds"],
                        "gmm_fit_s": gm["fit_seconds"],
                        "gmm_iters": gm["n_iter"],
                        "gmm_lower_bound": gm["lower_bound"],
                        "gmm_reseeded": gm["n_reseeded"],
                        "load_avg_1min_after": os.getloadavg()[0],
                    }
                )
                print(runs[-1], flush=True)
    rows = []
    for procs, threads in CONFIGS:
        mine = [r for r in runs if (r["processes"], r["threads_per_process"]) == (procs, threads)]
        rows.append(
            {
                "processes": procs,
                "threads_per_process": threads,
                "stage3_epoch_s": min(r["stage3_epoch_s"] for r in mine),
                "gmm_fit_s": min(r["gmm_fit_s"] for r in mine),
                "gmm_lower_bound": mine[0]["gmm_lower_bound"],
                "load_avg_1min_after": [r["load_avg_1min_after"] for r in mine],
            }
        )
    base = rows[0]
    lines = [
        "# Distributed training on CPU: 1 vs 2 processes (gloo, loopback)",
        "",
        f"Stage-3 epoch: ResNet-20 ({meta['n_weights']:,} Bayesian weights, "
        f"{meta['n_gaussians']} Gaussians, representative tying), {N_DATA} random 3x32x32 "
        f"examples, global batch {BATCH} (median of epochs 2-{EPOCHS}).  GMM: "
        f"{GMM_N:,} points, K = {GMM_K}, {GMM_ITERS} full-batch EM iterations.",
        "",
        f"Best of {ROUNDS} interleaved rounds.",
        "",
        "| processes x threads | stage-3 epoch s | speed-up | GMM fit s | speed-up "
        "| GMM mean log-lik |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['processes']} x {r['threads_per_process']} | {r['stage3_epoch_s']:.2f} | "
            f"{base['stage3_epoch_s'] / r['stage3_epoch_s']:.2f}x | {r['gmm_fit_s']:.2f} | "
            f"{base['gmm_fit_s'] / r['gmm_fit_s']:.2f}x | {r['gmm_lower_bound']:.9f} |"
        )
    loads = ", ".join(f"{r['load_avg_1min_after']:.1f}" for r in runs)
    lines += [
        "",
        f"Machine: {os.cpu_count()} CPU cores, shared with other jobs: 1-minute load average "
        f"{load_before[0]:.1f} before the run and {loads} after each run.  With more "
        "runnable jobs than cores, no configuration gets 2 dedicated cores: the numbers are "
        "a lower bound on what 2 free cores give, and 2 threads in one process suffer most "
        "(OpenMP threads wait for each other at every parallel region).",
        "",
        "Command: `python benchmarks/bench_distributed.py`",
        "",
    ]
    record(
        "bench_distributed",
        {
            "settings": {
                "n_data": N_DATA,
                "batch": BATCH,
                "epochs": EPOCHS,
                "gmm_n": GMM_N,
                "gmm_k": GMM_K,
                "gmm_iters": GMM_ITERS,
                "quick": args.quick,
            },
            "network": meta,
            "load_avg_before": load_before,
            "rows": rows,
            "runs": runs,
        },
        "\n".join(lines),
    )


if __name__ == "__main__":
    main()
