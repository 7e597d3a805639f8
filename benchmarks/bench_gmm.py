"""Gaussian-mixture machinery on BNN-shaped (mu, sigma) points, side by side in one run.

(a) 1e6 points, K = 64: our GaussianMixture2D (mini-batch EM plus a short full-data
    polish) against scikit-learn's GaussianMixture (full covariances, k-means init),
    fit time as a ratio at equal or better held-out log-likelihood. Target >= 50x.
(b) 1e6 points, K = 2000: our fit time and peak memory. Target < 60 s on 2 cores.
(c) merging 6000 components (K-means clusters with their covariances, as the paper's
    code builds them): time, rounds, components before/after, for both merge rules.

Each part runs in its own subprocess so that its peak RSS (``ru_maxrss``) is its own;
``tracemalloc`` cannot see torch's allocator, so RSS is the memory figure.

Run: python benchmarks/bench_gmm.py            (all parts, writes results/gmm.{json,md})
     python benchmarks/bench_gmm.py --parts b  (a subset; other parts kept from the last run)
     python benchmarks/bench_gmm.py --threads 1 --name gmm_1thread  (one thread each)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _common import RESULTS, machine

from twodg_pyro.gmm import GaussianMixture2D, merge_components

N_TRAIN, N_TEST = 1_000_000, 200_000
OURS_A = dict(batch_size=65_536, n_epochs=2, max_iter=2, random_state=0)
OURS_B = dict(batch_size=65_536, n_epochs=3, max_iter=2, random_state=0)


def bnn_weight_points(n: int, seed: int, n_layers: int = 6) -> np.ndarray:
    """``(n, 2)`` float32 points ``(mu, sigma)`` shaped like a trained mean-field BNN.

    Six "layers" of different sizes; in each, ``mu`` is a scale mixture of normals
    around a small shift (20% of weights 2.5x wider), and ``sigma`` is log-normal
    around a layer scale between 1e-3 and 2e-2 that grows with ``|mu|`` (so the two
    coordinates are correlated, and the cloud is curved and heavy-tailed, not a GMM).
    """
    rng = np.random.default_rng(1234)  # the network is fixed; `seed` draws weights
    sizes = rng.dirichlet(np.full(n_layers, 2.0))
    s_mu = rng.uniform(0.02, 0.2, n_layers)
    s0 = np.exp(rng.uniform(np.log(1e-3), np.log(2e-2), n_layers))
    shift = rng.normal(0, 0.02, n_layers)
    rng = np.random.default_rng(seed)
    lab = rng.choice(n_layers, size=n, p=sizes)
    wide = rng.random(n) < 0.2
    mu = shift[lab] + rng.normal(0, 1, n) * s_mu[lab] * np.where(wide, 2.5, 1.0)
    sig = (
        s0[lab]
        * np.exp(0.35 * rng.normal(0, 1, n))
        * (1.0 + 1.5 * np.abs(mu - shift[lab]) / s_mu[lab])
    )
    return np.stack([mu, sig], 1).astype(np.float32)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def fit_ours(k: int, x: torch.Tensor, xt: torch.Tensor, **kw) -> dict:
    t0 = time.perf_counter()
    g = GaussianMixture2D(k, **kw).fit(x)
    sec = time.perf_counter() - t0
    return {
        "config": {k2: v for k2, v in kw.items()},
        "fit_s": sec,
        "train_ll": g.lower_bound_,
        "heldout_ll": g.score(xt),
        "n_epochs": g.n_epochs_,
        "n_steps": g.n_steps_,
        "n_iter": g.n_iter_,
        "n_reseeded": g.n_reseeded_,
        "empty_components": int((g.counts_ == 0).sum()),
    }


def part_a() -> dict:
    from sklearn.mixture import GaussianMixture
    from threadpoolctl import threadpool_limits

    x = torch.from_numpy(bnn_weight_points(N_TRAIN, 0))
    xt = torch.from_numpy(bnn_weight_points(N_TEST, 1))
    out = {"load_start": load(), "ours": [], "ours_full_batch": None}
    out["ours"].append(fit_ours(64, x, xt, **OURS_A))
    out["ours_full_batch"] = fit_ours(64, x, xt, random_state=0)
    out["ours"].append(fit_ours(64, x, xt, **OURS_A))
    t0 = time.perf_counter()
    sk = GaussianMixture(64, covariance_type="full", init_params="kmeans", random_state=0)
    with threadpool_limits(limits=torch.get_num_threads()):  # same threads as torch
        sk.fit(x.double().numpy())
    sk_s = time.perf_counter() - t0
    out["sklearn"] = {
        "config": "GaussianMixture(64, covariance_type='full', init_params='kmeans', "
        "random_state=0), float64, default tol=1e-3, max_iter=100",
        "fit_s": sk_s,
        "train_ll": float(sk.lower_bound_),
        "heldout_ll": float(sk.score(xt.double().numpy())),
        "n_iter": int(sk.n_iter_),
        "converged": bool(sk.converged_),
    }
    out["ours"].append(fit_ours(64, x, xt, **OURS_A))
    ours_s = float(np.median([r["fit_s"] for r in out["ours"]]))
    out["ours_median_fit_s"] = ours_s
    out["speedup"] = sk_s / ours_s
    out["speedup_full_batch"] = sk_s / out["ours_full_batch"]["fit_s"]
    out["ours_heldout_minus_sklearn"] = (
        min(r["heldout_ll"] for r in out["ours"]) - out["sklearn"]["heldout_ll"]
    )
    out["load_end"] = load()
    out["peak_rss_mib"] = rss_mib()
    return out


def part_b() -> dict:
    x = torch.from_numpy(bnn_weight_points(N_TRAIN, 0))
    xt = torch.from_numpy(bnn_weight_points(N_TEST, 1))
    base = rss_mib()
    out = {"load_start": load(), "rss_before_fit_mib": base}
    out["ours"] = fit_ours(2000, x, xt, **OURS_B)
    out["peak_rss_mib"] = rss_mib()
    # reference: plain full-batch EM, 20 iterations, from the same initialisation
    out["ours_full_batch_20"] = fit_ours(2000, x, xt, max_iter=20, random_state=0)
    out["load_end"] = load()
    return out


def part_c() -> dict:
    x = torch.from_numpy(bnn_weight_points(N_TRAIN, 0))
    out = {"load_start": load()}
    t0 = time.perf_counter()
    # components as the paper's code builds them: K-means clusters and their covariances
    g = GaussianMixture2D(6000, max_iter=0, random_state=0).fit(x)
    out["components_s"] = time.perf_counter() - t0
    keep = g.counts_ > 0
    means, covs = g.means_[keep].double(), g.covariances_[keep].double()
    counts = g.counts_[keep].double()
    out["k_before"] = int(means.shape[0])
    w2_nn = []
    runs = []
    for tau_d, tau_v, label in (
        (math.sqrt(1.5e-7), 1e-3, "public-code threshold: W2^2 < 1.5e-7, tr S < 1e-3"),
        (1e-3, math.inf, "W2 < 1e-3"),
        (1e-2, math.inf, "paper Table 14: W2 < 1e-2"),
    ):
        for rule in ("paper", "moment"):
            t0 = time.perf_counter()
            r = merge_components(means, covs, counts, tau_d=tau_d, tau_v=tau_v, rule=rule)
            sec = time.perf_counter() - t0
            again = merge_components(r.means, r.covs, r.counts, tau_d=tau_d, tau_v=tau_v, rule=rule)
            runs.append(
                {
                    "tau_d": tau_d,
                    "tau_v": tau_v,
                    "label": label,
                    "rule": rule,
                    "seconds": sec,
                    "rounds": r.n_rounds,
                    "k_after": int(r.means.shape[0]),
                    "fixed_point": bool(r.converged and again.n_merged == 0),
                }
            )
    from twodg_pyro.gmm import pairwise_w2_squared

    d = pairwise_w2_squared(means, covs)
    d.fill_diagonal_(math.inf)
    nn = d.min(dim=1).values.sqrt()
    w2_nn = [float(q) for q in torch.quantile(nn, torch.tensor([0.1, 0.5, 0.9]).double())]
    out["nearest_w2_quantiles_10_50_90"] = w2_nn
    out["runs"] = runs
    out["load_end"] = load()
    out["peak_rss_mib"] = rss_mib()
    return out


PARTS = {"a": part_a, "b": part_b, "c": part_c}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def markdown(res: dict, command: str) -> str:
    m = res["machine"]
    lines = [
        "# Gaussian mixture benchmarks (twodg_pyro.gmm)",
        "",
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, torch {m['torch']} "
        f"({m['threads']} threads), scikit-learn {m['sklearn']}, {m['date']}. "
        "Load averages (1/5/15 min) at the start and end of each part are recorded: "
        "other jobs shared this machine, so absolute times drift; part (a) ratios are "
        "measured side by side in one process.",
        "",
        f"Command: `{command}`",
        "",
        "Data: BNN-shaped (mu, sigma) points (`bnn_weight_points`: six layers, scale-mixture "
        "means, log-normal sigma growing with |mu|), 1e6 for fitting, 2e5 held out.",
        "",
    ]
    if "a" in res:
        a = res["a"]
        sk = a["sklearn"]
        lines += [
            "## (a) 1e6 points, K = 64: ours vs scikit-learn",
            "",
            "| fit | seconds | held-out log-lik / point | train log-lik | iterations |",
            "|---|---|---|---|---|",
        ]
        for i, r in enumerate(a["ours"]):
            lines.append(
                f"| ours, mini-batch (run {i + 1}) | {r['fit_s']:.2f} | {r['heldout_ll']:.4f} | "
                f"{r['train_ll']:.4f} | {r['n_epochs']} epochs ({r['n_steps']} steps) + "
                f"{r['n_iter']} full |"
            )
        fb = a["ours_full_batch"]
        lines += [
            f"| ours, full batch to tol 1e-4 | {fb['fit_s']:.2f} | {fb['heldout_ll']:.4f} | "
            f"{fb['train_ll']:.4f} | {fb['n_iter']} |",
            f"| scikit-learn | {sk['fit_s']:.1f} | {sk['heldout_ll']:.4f} | "
            f"{sk['train_ll']:.4f} | {sk['n_iter']} |",
            "",
            f"Speed-up (scikit-learn / median of our mini-batch runs): **{a['speedup']:.0f}x** "
            f"(target >= 50x); full-batch: {a['speedup_full_batch']:.0f}x. Held-out "
            f"log-likelihood, our worst run minus scikit-learn: "
            f"{a['ours_heldout_minus_sklearn']:+.4f} nats/point. Ours: "
            f"`{a['ours'][0]['config']}`. Load {a['load_start']} -> {a['load_end']}.",
            "",
        ]
    if "b" in res:
        b = res["b"]
        r = b["ours"]
        lines += [
            "## (b) 1e6 points, K = 2000",
            "",
            "| seconds | held-out log-lik | train log-lik | schedule | re-seeded | "
            "peak RSS (MiB) | RSS before fit |",
            "|---|---|---|---|---|---|---|",
            f"| {r['fit_s']:.1f} | {r['heldout_ll']:.4f} | {r['train_ll']:.4f} | "
            f"{r['n_epochs']} epochs ({r['n_steps']} steps) + {r['n_iter']} full | "
            f"{r['n_reseeded']} | {b['peak_rss_mib']:.0f} | {b['rss_before_fit_mib']:.0f} |",
            "",
            f"Target < 60 s: **{'met' if r['fit_s'] < 60 else 'MISSED'}**. Config "
            f"`{r['config']}`. Load {b['load_start']} -> {b['load_end']}.",
            "",
        ]
        fb = b.get("ours_full_batch_20")
        if fb:
            lines += [
                f"Reference, full-batch EM (20 iterations, same init): {fb['fit_s']:.1f} s, "
                f"held-out {fb['heldout_ll']:.4f}, train {fb['train_ll']:.4f}.",
                "",
            ]
    if "c" in res:
        c = res["c"]
        q = c["nearest_w2_quantiles_10_50_90"]
        lines += [
            f"## (c) merging {c['k_before']} components",
            "",
            f"Components: K-means (K = 6000) clusters of the 1e6 points with their "
            f"covariances, built in {c['components_s']:.1f} s. Nearest-neighbour W2 "
            f"quantiles (10/50/90%): {q[0]:.2e} / {q[1]:.2e} / {q[2]:.2e}.",
            "",
            "| threshold | rule | seconds | rounds | K before | K after | fixed point |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in c["runs"]:
            lines.append(
                f"| {r['label']} | {r['rule']} | {r['seconds']:.2f} | {r['rounds']} | "
                f"{c['k_before']} | {r['k_after']} | {r['fixed_point']} |"
            )
        lines += ["", f"Load {c['load_start']} -> {c['load_end']}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="abc", help="which parts to run, e.g. 'ab'")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch (and, for scikit-learn, BLAS) threads; default: torch's default",
    )
    ap.add_argument("--name", default="gmm", help="results/<name>.json and .md (default gmm)")
    ap.add_argument("--child", choices=sorted(PARTS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(PARTS[args.child]()))
        return
    command = "python benchmarks/bench_gmm.py" + (
        f" --parts {args.parts}" if args.parts != "abc" else ""
    )
    if args.threads:
        command += f" --threads {args.threads}"
    if args.name != "gmm":
        command += f" --name {args.name}"
    import sklearn

    res: dict = {
        "machine": {
            **machine(),
            "cpu_model": cpu_model(),
            "sklearn": sklearn.__version__,
        },
        "command": command,
    }
    previous = RESULTS / f"{args.name}.json"
    if previous.exists() and args.parts != "abc":
        old = json.loads(previous.read_text())
        res.update({k: v for k, v in old.items() if k in PARTS})
    for p in args.parts:
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "--child", p]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"part {p} failed")
        res[p] = json.loads(proc.stdout.strip().splitlines()[-1])
        res[p]["wall_s"] = time.perf_counter() - t0
        print(f"part {p} done in {res[p]['wall_s']:.0f} s", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(res, indent=2))
    md = markdown(res, command)
    (RESULTS / f"{args.name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
