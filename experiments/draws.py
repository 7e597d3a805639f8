"""How many posterior draws does a prediction need?  NLL and OOD AUROC against 1-30 draws.

A Bayesian prediction of ``num_samples`` draws costs that many forward passes (the
library's default is 30).  This script trains a preset's methods once per seed (the
``digits`` preset by default: the main job's recipe with every Bayesian method of the
registry), draws a pool of ``--pool`` seeded posterior draws of each Bayesian method on
the test images and on the built-in OOD sets, and measures the NLL and the mean entropy
AUROC over the OOD sets of predictions of 1 to 30 draws
(:func:`twodg_pyro.uncertainty.draws_curve`: the mean over disjoint blocks of the pool,
and their spread); the fewest draws that keep both within 1 % of the 30-draw figures is
:func:`twodg_pyro.uncertainty.sufficient_draws`.  An ensemble's draws are its members
(1 to M, against all M).  The records' ``forwards_per_prediction`` and
``relative_predict_seconds`` (the run's prediction time over the deterministic network's) are
reported beside them.

    python experiments/draws.py                       # digits, seeds 0-2: results/draws.*
    python experiments/draws.py --preset mnist-lenet5-bayes --root data/mnist_subset \\
        --seeds 0 --name draws_lenet5                 # LeNet-5 on the MNIST subset
    python experiments/draws.py --recipe 'natural gradient' --arch resnet20 \\
        --root data/mnist_subset --seeds 0 --methods deterministic mean_field 2dg \\
        --name draws_resnet20                 # ResNet-20, uncertainty.py's recipe
    python experiments/draws.py --from-json results/draws.json   # its .md and .png again
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
from common import command, setup
from uncertainty import recipe_settings

from twodg_pyro.files import atomic_write_text
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.pipeline.outputs.uncertainty_step import UncertaintySets
from twodg_pyro.pipeline.settings.config import merge_settings
from twodg_pyro.pipeline.settings.presets import preset
from twodg_pyro.uncertainty import draws_curve, sufficient_draws

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ["deterministic", "mean_field", "2dg", "rank1", "ssvi", "ensemble", "laplace"]
REFERENCE, TOLERANCE = 30, 0.01
SHOWN = (1, 2, 3, 5, 8, 10, 15, 20, 25, 30)
#: the fields of each method's record kept beside its curve
RECORD_KEYS = (
    "accuracy",
    "nll",
    "file",
    "file_bytes",
    "file_bytes_int8",
    "float32_ratio",
    "forwards_per_prediction",
    "predict_seconds",
    "relative_predict_seconds",
)


def pool_probs(trained, x: torch.Tensor, pool: int, seed: int) -> torch.Tensor:
    """``(pool, N, C)`` per-draw probabilities (a rank-1 BNN's ``K`` components of one
    draw averaged: one draw is one prediction of its ``K`` members)."""
    probs = trained.sample_probs(x, pool, seed)
    if probs.shape[0] != pool and probs.shape[0] % pool == 0:  # (S K, N, C), sample-major
        probs = probs.reshape(pool, -1, *probs.shape[1:]).mean(1)
    return probs


def one_seed(args, seed: int) -> dict:
    over = {
        "seed": seed,
        "progress": False,
        "methods": args.methods,
        "diagnostics": {"enabled": False},
    }
    if args.root is not None:
        over["data"] = {"root": args.root}
    if args.recipe is not None:  # a recipe of experiments/uncertainty.py
        base, _ = recipe_settings(args.recipe, args.root, seed, arch=args.arch)
    else:
        base = preset(args.preset)
    cfg = config_from_dict(merge_settings(base, over))
    uncertainty = dataclasses.replace(cfg.uncertainty, enabled=True, corruptions=[])
    cfg = dataclasses.replace(cfg, uncertainty=dataclasses.replace(cfg.uncertainty, enabled=False))
    t0 = time.perf_counter()
    art = run(cfg)
    train_seconds = time.perf_counter() - t0
    sets = UncertaintySets(art.split, art.eval_data, uncertainty, seed)
    records = {r["method"]: r for r in art.records}
    out = {
        "train_seconds": train_seconds,
        "ood_sets": sorted(sets.ood),
        "records": {m: {k: r.get(k) for k in RECORD_KEYS} for m, r in records.items()},
        "methods": {},
    }
    for method in args.methods:
        trained = art.trained[method]
        if not trained.bayesian:
            continue
        fixed = trained.num_draws(args.pool) != args.pool  # an ensemble's members
        pool = trained.num_draws(args.pool)
        reference = pool if fixed else REFERENCE
        probs_in = pool_probs(trained, sets.x, pool, seed)
        probs_out = {k: pool_probs(trained, v, pool, seed) for k, v in sets.ood.items()}
        curve = draws_curve(probs_in, sets.y, probs_out, range(1, reference + 1), args.max_blocks)
        r = records[method]
        out["methods"][method] = {
            "pool": pool,
            "reference": reference,
            "sufficient_draws": sufficient_draws(curve, reference, TOLERANCE),
            "record": {k: r.get(k) for k in RECORD_KEYS},
            "curve": {str(n): row for n, row in curve.items()},
        }
    return out


def summarise(per_seed: dict) -> dict:
    """Per method: the curve's mean over seeds, the fewest draws per seed and overall."""
    methods = {m for s in per_seed.values() for m in s["methods"]}
    out = {}
    for m in sorted(methods, key=METHODS.index):
        runs = [s["methods"][m] for s in per_seed.values() if m in s["methods"]]
        ns = sorted(int(n) for n in runs[0]["curve"])
        curve = {}
        for n in ns:
            rows = [r["curve"][str(n)] for r in runs]
            curve[n] = {k: sum(row[k] for row in rows) / len(rows) for k in ("nll", "mean_auroc")}
        reference = runs[0]["reference"]
        out[m] = {
            "reference": reference,
            "sufficient_draws_per_seed": [r["sufficient_draws"] for r in runs],
            "sufficient_draws_of_mean": sufficient_draws(curve, reference, TOLERANCE),
            "curve": {str(n): row for n, row in curve.items()},
            "forwards_per_prediction": runs[0]["record"]["forwards_per_prediction"],
            "relative_predict_seconds": sum(r["record"]["relative_predict_seconds"] for r in runs)
            / len(runs),
        }
    return out


def files_table(payload: dict) -> list[str]:
    """What each method deploys (the run's records, mean over seeds): its file, bytes,
    ratio to the float32 deterministic network, forwards and prediction time."""
    runs = [s["records"] for s in payload["per_seed"].values()]
    lines = [
        "What each method deploys (the runs' records, mean over seeds; prediction time "
        "over the deterministic network's one forward pass, same run, this machine):",
        "",
        "| method | file | file bytes | x smaller than the float32 deterministic network | "
        "forwards per prediction | predict time / det |",
        "|---|---|---|---|---|---|",
    ]
    for m in (m for m in METHODS if all(m in r for r in runs)):
        rows = [r[m] for r in runs]
        if rows[0].get("file_bytes") is None:
            continue

        def mean(key, rows=rows):
            return sum(r[key] for r in rows) / len(rows)

        lines.append(
            f"| {m} | {rows[0]['file']} | {mean('file_bytes'):,.0f} | "
            f"{mean('float32_ratio'):.2f}x | {rows[0]['forwards_per_prediction']} | "
            f"{mean('relative_predict_seconds'):.1f}x |"
        )
    return lines


def markdown(payload: dict) -> str:
    s = payload["summary"]
    sampled = [m for m in s if m != "ensemble"]
    lines = [
        f"# Posterior draws per prediction: NLL and OOD AUROC against 1-{REFERENCE} draws",
        "",
        f"`{payload['command']}`: preset `{payload['preset']}`, seeds {payload['seeds']}, "
        f"a pool of {payload['pool']} seeded draws per method on the test images and on "
        f"the OOD sets ({', '.join(payload['ood_sets'])}); the figure of n draws is the "
        "mean over disjoint blocks of n draws of the pool (at most "
        f"{payload['max_blocks']}), then over seeds.  Within 1 %: the NLL and the mean "
        f"entropy AUROC over the OOD sets within 1 % (relative) of the {REFERENCE}-draw "
        "figures, at that n and every n up to 30.  An ensemble's draws are its members "
        "(against all of them).",
        "",
        "| method | fewest draws within 1 % (per seed) | of the seeds' mean | "
        "forwards per prediction (at the run's draws) | predict time / det |",
        "|---|---|---|---|---|",
    ]
    for m, r in s.items():
        lines.append(
            f"| {m} | {', '.join(map(str, r['sufficient_draws_per_seed']))} | "
            f"{r['sufficient_draws_of_mean']} | {r['forwards_per_prediction']} | "
            f"{r['relative_predict_seconds']:.1f}x |"
        )
    lines += ["", *files_table(payload)]
    lines += [
        "",
        f"**Recommended default: {payload['recommended_draws']} draws** (the largest of the "
        f"per-seed figures over {', '.join(sampled)}); the library's default stays "
        f"{payload['library_default']} (`num_samples`), which every committed table "
        "uses.",
        "",
        "NLL (mean entropy AUROC) at n draws, mean over seeds; in brackets the change "
        f"relative to {REFERENCE} draws:",
        "",
    ]
    shown = [n for n in SHOWN if n <= REFERENCE]
    lines += ["| method | " + " | ".join(f"n = {n}" for n in shown) + " |"]
    lines += ["|---|" + "---|" * len(shown)]
    for m, r in s.items():
        ref = r["curve"][str(r["reference"])]
        cells = []
        for n in shown:
            row = r["curve"].get(str(n))
            if row is None:
                cells.append("-")
                continue
            dn = 100 * (row["nll"] / ref["nll"] - 1)
            da = 100 * (row["mean_auroc"] / ref["mean_auroc"] - 1)
            cells.append(f"{row['nll']:.3f} ({row['mean_auroc']:.3f}) [{dn:+.1f}%, {da:+.1f}%]")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure(payload: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for m, r in payload["summary"].items():
        ref = r["curve"][str(r["reference"])]
        ns = sorted(int(n) for n in r["curve"])
        for ax, key in zip(axes, ("nll", "mean_auroc"), strict=True):
            ax.plot(ns, [r["curve"][str(n)][key] / ref[key] for n in ns], marker=".", label=m)
    for ax, title in zip(axes, ("NLL", "mean entropy AUROC"), strict=True):
        ax.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="0.85", zorder=0)
        ax.set(xlabel="posterior draws per prediction", title=f"{title} / {REFERENCE}-draw")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{payload['preset']}: figures of n draws over those of {REFERENCE}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="digits")
    p.add_argument("--root", default=None, help="the data folder (real-image presets)")
    p.add_argument(
        "--recipe",
        default=None,
        help="a recipe of experiments/uncertainty.py (with --arch and --root) instead of "
        "--preset, e.g. 'natural gradient'",
    )
    p.add_argument("--arch", default="lenet5", help="with --recipe: lenet5 or resnet20")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--pool", type=int, default=120, help="seeded draws per method (>= 30)")
    p.add_argument("--max-blocks", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--name", default="draws", help="the results' file name")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="write the .md and .png of an existing results file again (no training)",
    )
    args = p.parse_args(argv)
    if args.from_json is not None:
        payload = json.loads(args.from_json.read_text())
        stem = args.from_json.with_suffix("")
        atomic_write_text(stem.with_suffix(".md"), markdown(payload))
        figure(payload, stem.with_suffix(".png"))
        return 0
    if args.pool < REFERENCE:
        p.error(f"--pool {args.pool}: must be at least {REFERENCE}")
    setup(args.threads)
    t0 = time.perf_counter()
    per_seed = {str(s): one_seed(args, s) for s in args.seeds}
    summary = summarise(per_seed)
    sampled = [m for m in summary if m != "ensemble"]
    payload = {
        "command": command("draws.py", argv),
        "preset": args.preset if args.recipe is None else f"{args.recipe} ({args.arch})",
        "seeds": args.seeds,
        "pool": args.pool,
        "max_blocks": args.max_blocks,
        "threads": args.threads,
        "tolerance": TOLERANCE,
        "reference": REFERENCE,
        "ood_sets": next(iter(per_seed.values()))["ood_sets"],
        "library_default": config_from_dict({}).num_samples,
        "recommended_draws": max(
            (n for m in sampled for n in summary[m]["sufficient_draws_per_seed"]), default=None
        ),
        "summary": summary,
        "per_seed": per_seed,
        "seconds": time.perf_counter() - t0,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(payload)
    atomic_write_text(args.out / f"{args.name}.json", json.dumps(payload, indent=2) + "\n")
    atomic_write_text(args.out / f"{args.name}.md", text)
    figure(payload, args.out / f"{args.name}.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
