"""How precisely the exported log-likelihood is computed, and what PSIS-LOO makes of it,
on the main job's models.

Trains the main job (the ``digits`` preset: mean-field and 2DG BNNs, seed 0, one torch
thread; diagnostics off) and, for each model, draws ``S`` = 30 and 300 weights with the
evaluation's seed (:mod:`twodg_pyro.evaluation`) and reports:

* the share of pointwise log-likelihoods that are exactly 0.0 when computed as float32
  ``log_softmax`` (what the export stored before), float64 ``log_softmax``, and the
  export's float64 ``-softplus(logsumexp_{j != y} f_j - f_y)`` before and after its
  2**-50 grid;
* the logit gap between the label's logit and the largest other one (percentiles);
* PSIS-LOO (``twodg_pyro.diagnostics.loo``, ``az.loo`` with ``reff = 1``) on the export:
  ``elpd_loo``, ``p_loo``, observations with k-hat above ArviZ's threshold, and those
  whose log-likelihood is the same in every draw.

Run: python benchmarks/loglik_precision.py [--out benchmarks/results]
Writes loglik_precision.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from twodg_pyro import diagnostics as D
from twodg_pyro.diagnostics._draws import categorical_log_prob
from twodg_pyro.diagnostics.arviz_export import _on_grid
from twodg_pyro.evaluation import SAMPLE_CHUNK, seeded
from twodg_pyro.files.atomic import atomic_write_text
from twodg_pyro.io import load_model
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.pipeline.settings.config import merge_settings
from twodg_pyro.pipeline.settings.presets import preset


@torch.no_grad()
def logits_of(model, guide, x, num_samples: int, seed: int) -> torch.Tensor:
    """``(S, N, C)`` logits of the evaluation's seeded draws."""
    outs = []
    with seeded(seed):
        done = 0
        while done < num_samples:
            s = min(SAMPLE_CHUNK, num_samples - done)
            w = guide.sample_weights(s)
            outs.append(torch.func.vmap(model.network_forward, in_dims=(0, None))(w, x))
            done += s
    return torch.cat(outs)


def measure(model, guide, x, y, num_samples: int, seed: int = 0) -> dict:
    f = logits_of(model, guide, x, num_samples, seed)
    idx = y[None, :, None].expand(f.shape[0], -1, 1)
    ll32 = f.float().log_softmax(-1).gather(-1, idx)[..., 0]
    ll64 = f.double().log_softmax(-1).gather(-1, idx)[..., 0]
    stable = categorical_log_prob(f, y)
    grid = _on_grid(stable)
    others = f.scatter(-1, idx, float("-inf"))
    gap = (f.gather(-1, idx)[..., 0] - others.max(-1).values).numpy()
    idata = D.to_inference_data(model, guide, (x, y), num_samples, seed)
    loo = D.loo(idata)
    return {
        "num_samples": num_samples,
        "zero_float32_log_softmax": float((ll32 == 0).double().mean()),
        "zero_float64_log_softmax": float((ll64 == 0).double().mean()),
        "zero_stable": float((stable == 0).double().mean()),
        "zero_stable_on_grid": float((grid == 0).double().mean()),
        "logit_gap_percentiles_10_50_90_max": [
            float(v) for v in np.percentile(gap, [10, 50, 90, 100])
        ],
        "min_log_likelihood": float(stable.min()),
        "elpd_loo": loo["elpd_loo"],
        "p_loo": loo["p_loo"],
        "n_bad_k": loo["n_bad_k"],
        "n_constant": loo["n_constant"],
        "n_data_points": loo["n_data_points"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    settings = merge_settings(
        preset("digits"),
        {"methods": ["mean_field", "2dg"], "progress": False, "diagnostics": {"enabled": False}},
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        art = run(config_from_dict(settings), tmp)
        x, y = art.split.test.tensors
        for method in ("mean_field", "2dg"):
            model, guide = load_model(Path(tmp) / f"model_{method}.pt")
            for s in (30, 300):
                rows.append({"method": method, **measure(model, guide, x, y, s)})
    payload = {
        "command": "python benchmarks/loglik_precision.py",
        "threads": 1,
        "seconds": time.perf_counter() - t0,
        "rows": rows,
    }
    out = Path(args.out)
    atomic_write_text(out / "loglik_precision.json", json.dumps(payload, indent=2) + "\n")
    lines = [
        "# Log-likelihood precision and PSIS-LOO on the main job (digits preset, seed 0)",
        "",
        "`python benchmarks/loglik_precision.py` (one torch thread). Shares of pointwise "
        "log-likelihoods that are exactly 0.0; logit gap = label's logit minus the largest "
        "other; PSIS-LOO of the export (`reff = 1`).",
        "",
        "| method | S | zeros f32 log_softmax | zeros f64 log_softmax | zeros export "
        "(stable, grid) | logit gap p10 / p50 / p90 / max | min log-lik | elpd_loo | p_loo "
        "| k-hat bad | constant obs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g = " / ".join(f"{v:.0f}" for v in r["logit_gap_percentiles_10_50_90_max"])
        lines.append(
            f"| {r['method']} | {r['num_samples']} | {r['zero_float32_log_softmax']:.3f} | "
            f"{r['zero_float64_log_softmax']:.3f} | {r['zero_stable']:.3f}, "
            f"{r['zero_stable_on_grid']:.3f} | {g} | {r['min_log_likelihood']:.0f} | "
            f"{r['elpd_loo']:.0f} | {r['p_loo']:.0f} | {r['n_bad_k']} of "
            f"{r['n_data_points']} | {r['n_constant']} |"
        )
    atomic_write_text(out / "loglik_precision.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
