"""Prediction time: 30 posterior samples, MLP 784-400-400-10, batch 512, against 30
deterministic forwards, side by side in one run (interleaved rounds).

Contenders: our vectorised :func:`twodg_pyro.prediction.predict` with the mean-field guide and
the shared-GMM guide in each tying (a synthetic sharing structure of realistic
proportions: K = 64, 1% outliers, 0.5% ellipse weights, as in ``bench_svi_step.py``), and
Pyro's ``Predictive`` with ``AutoNormal`` on the same model (one trace and replay per
sample).

Targets (issue 6): ratio to 30 deterministic forwards <= 2.0 for the mean-field BNN and
the per-weight tyings (representative, stochastic), <= 1.3 for ``tied``; every one of
ours >= 1.5x faster than Pyro's Predictive.

Run: python benchmarks/bench_predict.py [--threads N ...]   (default: torch's default,
then 1 thread; each setting is one interleaved table)
"""

from __future__ import annotations

import argparse
import sys

import pyro
import torch
from _common import interleaved, record
from bench_svi_step import make_structure
from pyro.infer import Predictive
from pyro.infer.autoguide import AutoNormal

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.guides.stochastic_draw import DRAW_BLOCK
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.prediction import predict

S, BATCH, CHUNK = 30, 512, 10
TARGETS = {
    "mean_field": 2.0,
    "2dg_representative": 2.0,
    "2dg_stochastic": 2.0,
    "2dg_tied": 1.3,
}


def contenders() -> dict:
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    net = MLP(784, (400, 400), 10).eval()
    x = torch.randn(BATCH, 784)
    model = BNNModel(net, likelihood=Categorical(60000))

    @torch.no_grad()
    def deterministic():
        for _ in range(S):
            net(x).softmax(-1)

    fns = {"deterministic_x30": deterministic}
    n_w = model.num_weights

    def normals(per_weight: int):
        """The standard normals a prediction draws and nothing else: ``per_weight`` per
        weight and sample, drawn block by block into a cache-sized buffer of the stochastic
        draw's block size (no memory traffic: the pure cost of the random numbers)."""
        buf = torch.empty(per_weight, DRAW_BLOCK)
        n_blocks = -(-S * n_w // DRAW_BLOCK)

        def draw():
            for _ in range(n_blocks):
                buf.normal_()

        return draw

    fns["normals_1_per_weight"] = normals(1)  # what mean-field / representative draw
    fns["normals_2_per_weight"] = normals(2)  # what the stochastic tying draws
    mf = MeanFieldGuide(model)
    fns["mean_field"] = lambda: predict(model, mf, x, S, batch_size=BATCH)
    for tying in ("representative", "stochastic", "tied"):
        g = SharedGMMGuide(model, make_structure(model), tying)
        fns[f"2dg_{tying}"] = lambda g=g: predict(model, g, x, S, batch_size=BATCH)
        if tying == "stochastic":  # its 30 draws without the forwards: the draw's share

            @torch.no_grad()
            def stochastic_draws(g=g):
                for _ in range(S // CHUNK):
                    g.sample_weights(CHUNK)

            fns["2dg_stochastic_draws_only"] = stochastic_draws
    auto = AutoNormal(model)
    auto(x, torch.zeros(BATCH, dtype=torch.long))  # initialise (labels observed)
    pred = Predictive(model, guide=auto, num_samples=S, return_sites=("_RETURN",))

    @torch.no_grad()
    def pyro_predictive():
        pred(x)["_RETURN"].softmax(-1).mean(0)

    fns["pyro_predictive_autonormal"] = pyro_predictive
    return fns


def measure(threads: int, repeats: int) -> dict:
    torch.set_num_threads(threads)
    t = interleaved(contenders(), repeats=repeats, inner=1, warmup=2)
    base, pyro_t = t["deterministic_x30"], t["pyro_predictive_autonormal"]
    rows = {}
    for k, v in t.items():
        row = {"ms": v * 1e3, "ratio_to_deterministic": v / base}
        if k in TARGETS:
            row["target_ratio"] = TARGETS[k]
            row["speedup_over_pyro_predictive"] = pyro_t / v
            row["meets_targets"] = bool(v / base <= TARGETS[k] and pyro_t / v >= 1.5)
        rows[k] = row
    return {"threads": threads, "repeats": repeats, "results": rows}


def table(m: dict) -> list[str]:
    lines = [
        f"## {m['threads']} thread(s), median of {m['repeats']} interleaved rounds",
        "",
        "| contender | ms | ratio to 30 det. forwards | target | x faster than Pyro Predictive |"
        " meets |",
        "|---|---|---|---|---|---|",
    ]
    for k, r in m["results"].items():
        tgt = f"<= {r['target_ratio']}" if "target_ratio" in r else "-"
        sp = f"{r['speedup_over_pyro_predictive']:.2f}" if "target_ratio" in r else "-"
        ok = ("yes" if r["meets_targets"] else "NO") if "meets_targets" in r else "-"
        lines.append(
            f"| {k} | {r['ms']:.1f} | {r['ratio_to_deterministic']:.2f} | {tgt} | {sp} | {ok} |"
        )
    res = m["results"]
    if "normals_2_per_weight" in res:
        r = {k: v["ratio_to_deterministic"] for k, v in res.items()}
        n1, n2 = r["normals_1_per_weight"], r["normals_2_per_weight"]
        draws = r["2dg_stochastic_draws_only"]
        rest = r["2dg_stochastic"] - draws
        lines += [
            "",
            f"Floors: the forwards plus the normals alone, 1 + {n1:.2f} = {1 + n1:.2f} with one "
            f"normal per weight (mean-field, representative), 1 + {n2:.2f} = {1 + n2:.2f} with "
            "two (stochastic: its law needs two independent normals per weight and sample). "
            f"The stochastic prediction, {r['2dg_stochastic']:.2f}, is its 30 draws alone, "
            f"{draws:.2f} (of which the normals {n2:.2f} and the arithmetic and gathers "
            f"{draws - n2:.2f}), plus {rest:.2f} for the forwards with per-sample weights and "
            "the average (1.00 for the 30 deterministic forwards).",
        ]
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads(), 1])
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    runs = [measure(n, args.repeats) for n in dict.fromkeys(args.threads)]
    lines = [
        f"# Prediction, {S} samples, MLP 784-400-400-10, batch {BATCH}",
        "",
        "Ratio: time of a full prediction (draws + forwards + softmax average) over the time",
        f"of {S} deterministic forwards, both measured in the same interleaved rounds.",
        "",
    ]
    for m in runs:
        lines += table(m)
    lines += [
        "Targets: <= 2.0 mean-field and per-weight tyings, <= 1.3 tied, >= 1.5x faster than",
        "Pyro's Predictive (AutoNormal). Shared-GMM guides: synthetic structure, K = 64,",
        "1% outliers, 0.5% ellipse weights.",
        "Command: `python " + " ".join(["benchmarks/bench_predict.py", *sys.argv[1:]]) + "`",
    ]
    record("bench_predict", {"runs": runs, "argv": sys.argv[1:]}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
