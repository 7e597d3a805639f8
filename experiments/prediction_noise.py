"""How much of a table's NLL/ECE is Monte Carlo noise of the 30-sample prediction?

The tables report the Bayesian model average of ``N_s = 30`` posterior samples (spec,
evaluation), as the paper does.  On digits (359 test images) that average is itself
noisy: this script trains the digits preset once (seed 0: mean-field and its INT8 /
4-bit-sigma quantisation, then 2DG with the ``representative`` and ``stochastic``
tyings on the same stage 1) and evaluates each
trained model with 10 prediction seeds at 30 samples, and once at 1000 samples.  The
spread over prediction seeds is the noise floor below which differences between rows
of the tables mean nothing; the 1000-sample figure is close to the model's own
predictive NLL (the 30-sample NLL is biased upwards: the log of an average of 30
probabilities underestimates the log of their expectation).

    python experiments/prediction_noise.py          # writes results/prediction_noise.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import command, setup

from twodg_pyro.baselines import quantize_mean_field
from twodg_pyro.files import atomic_write_text
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.pipeline import config_from_dict
from twodg_pyro.pipeline.runtime.variants import run_variants
from twodg_pyro.pipeline.settings.config import merge_settings
from twodg_pyro.pipeline.settings.presets import preset
from twodg_pyro.prediction import predict

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = ("accuracy", "nll", "ece")


def trained_models(seed: int) -> tuple[dict[str, tuple], object]:
    """``({name: (model, guide)}, eval_data)``: the digits preset's mean-field BNN, its
    INT8 quantisation and the 2DG BNNs of two tyings on top of it."""
    settings = merge_settings(
        preset("digits"), {"seed": seed, "progress": False, "methods": ["mean_field", "2dg"]}
    )
    tyings = ("representative", "stochastic")
    _, art = run_variants(config_from_dict(settings), {t: {"stage3": {"tying": t}} for t in tyings})
    mf = art.trained["mean_field"]
    models = {"mean_field": (mf.model, mf.guide)}
    model, guide = mf.model, mf.guide
    models["mean_field INT8 mu + 4-bit sigma"] = (model, quantize_mean_field(guide, 4))
    for t in tyings:
        two = art.variants[t]
        models[f"2dg ({t})"] = (two.model, two.guide)
    return models, art.eval_data


def evaluate(model, guide, eval_data, num_samples: int, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    pred = predict(model, guide, eval_data, num_samples)
    m = classification_metrics(pred.mean, pred.targets)
    return {k: float(m[k]) for k in KEYS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="training seed")
    p.add_argument("--prediction-seeds", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    setup(args.threads)
    t0 = time.perf_counter()
    models, eval_data = trained_models(args.seed)
    rows = {}
    for name, (model, guide) in models.items():
        runs = [evaluate(model, guide, eval_data, 30, s) for s in range(args.prediction_seeds)]
        summary = {
            k: {
                "mean": statistics.fmean(r[k] for r in runs),
                "std": statistics.stdev(r[k] for r in runs),
                "min": min(r[k] for r in runs),
                "max": max(r[k] for r in runs),
            }
            for k in KEYS
        }
        rows[name] = {
            "s30": summary,
            "runs": runs,
            "s1000": evaluate(model, guide, eval_data, 1000, 0),
        }
    payload = {
        "command": command("prediction_noise.py", argv),
        "seed": args.seed,
        "prediction_seeds": args.prediction_seeds,
        "threads": args.threads,
        "seconds": time.perf_counter() - t0,
        "rows": rows,
    }
    lines = [
        "# Prediction noise on digits (30 vs 1000 posterior samples)",
        "",
        f"`{payload['command'].strip()}`: one training run (seed {args.seed}); each model "
        f"evaluated with {args.prediction_seeds} prediction seeds at 30 samples "
        "(mean ± std, [min, max]) and once at 1000 samples.",
        "",
        "| model | acc (30) | NLL (30) | ECE (30) | acc (1000) | NLL (1000) | ECE (1000) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        cells = [
            f"{r['s30'][k]['mean']:.4f} ± {r['s30'][k]['std']:.4f} "
            f"[{r['s30'][k]['min']:.4f}, {r['s30'][k]['max']:.4f}]"
            for k in KEYS
        ]
        cells += [f"{r['s1000'][k]:.4f}" for k in KEYS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "prediction_noise.json", json.dumps(payload, indent=2) + "\n")
    atomic_write_text(args.out / "prediction_noise.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
