"""Compact model files against the full model file and the INT8 mean-field baseline,
bytes on disk, for three networks trained here on scikit-learn's digits.

Per network: the pipeline trains the mean-field BNN (stage 1) and the 2DG BNN (stages
2-3, representative tying); the 2DG BNN is written as the full model file
(``save_2dg``, ``model_2dg.pt``) and as the compact file (``export_compact``, default
options: float16 centres, outliers 16-bit mu + 16-bit log-sigma codes, 8-bit alphas,
``auto`` index coding); the mean-field BNN as INT8 files with 4-, 2- and 1-bit sigma
(``export_int8_mean_field``, same container).  Every file is then read back and
evaluated the way ``twodg-pyro evaluate`` does (30 samples, prediction seed 0, the test
split), and the compact file's load time is timed (median of 5 loads).

Networks (all on the 8x8 digits: 1,437 training / 359 test images; a short run, not the
paper's MNIST/CIFAR training):

* ``digits-mlp``: the main job's settings (``preset("digits")``: 64-128-10 MLP, 150 + 60
  epochs, K = 32);
* ``lenet5``: LeNet-5 on 1x8x8 images, N(0, 1) prior, 100 + 60 epochs, K = 64;
* ``resnet20``: ResNet-20 (option A shortcuts) on 1x8x8 images, the layer-wise Normal
  prior (scale ``1 / sqrt(fan_in)``), 30 + 30 epochs, K = 256 initial components;
* ``resnet20-normal-prior``: the same with N(0, 1).

The mean-field BNN is copied before stage 3: stage 3 trains the same network's
deterministic parts (BatchNorm), so the run's mean-field model would otherwise predict
with the 2DG BNN's BatchNorm state.  Besides the default export, every network is
exported with INT8 outlier means and 8- or 4-bit sigmas (the quantised baseline's
precision) and with ``FAITHFUL_OPTIONS`` (float32 centres, 16-bit outlier means and
sigmas, 16-bit alphas), to show what rounding costs in bytes and in predictions; and
the full model's accuracy is measured under prediction seeds 0-4, to show how noisy its
30-sample predictions are (the noisier, the more test images a small change of the
parameters can flip).

Targets (issue 18): every compact file smaller than the INT8 mean-field file with 1-bit
sigma; the index within 5% of the empirical entropy of the assignment; accuracy, NLL and
ECE within 0.1 pp / 0.01 / 0.005 of the full model; loading ResNet-20 under a second.

Run: python benchmarks/bench_compact_export.py [--networks digits-mlp lenet5 ...]
(about 3 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import record

from twodg_pyro.accounting import compression_report
from twodg_pyro.io import save_2dg
from twodg_pyro.io.compact import (
    FAITHFUL_OPTIONS,
    export_compact,
    export_int8_mean_field,
    load_compact,
)
from twodg_pyro.io.model_file import load_model_file
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.pipeline import config_from_dict
from twodg_pyro.pipeline.methods.algorithm1 import run_2dg, stage1_mean_field
from twodg_pyro.pipeline.outputs.artifacts import network_spec
from twodg_pyro.pipeline.outputs.saved_models import evaluate_model_file
from twodg_pyro.pipeline.runtime.context import RunContext
from twodg_pyro.pipeline.runtime.trained import RunArtifacts
from twodg_pyro.pipeline.settings.build import build_net, load_data, seed_everything
from twodg_pyro.pipeline.settings.config import merge_settings
from twodg_pyro.pipeline.settings.presets import preset
from twodg_pyro.prediction import predict

TOL = {"accuracy": 0.001, "nll": 0.01, "ece": 0.005}
_IMAGE = {
    "methods": ["mean_field", "2dg"],
    "data": {"name": "digits", "batch_size": 128},
    "prior": {"kind": "normal", "scale": 1.0},
    "sharing": {
        "outlier_rule": "quantile",
        "mu_quantile": 0.995,
        "grad_percentile": 0.005,
        "n_min": 20,
        "tau_d": 0.01,
    },
}
_RESNET = {
    "network": {"arch": "resnet20"},
    "stage1": {"epochs": 30, "lr_loc": 1e-2, "lr_scale": 1e-2},
    "sharing": {"n_components": 256},
    "stage3": {"epochs": 30, "lr_centre": 1e-2, "lr_outlier": 1e-2},
}
SETTINGS = {
    "digits-mlp": merge_settings(preset("digits"), {"methods": ["mean_field", "2dg"]}),
    "lenet5": merge_settings(
        _IMAGE,
        {
            "network": {"arch": "lenet5"},
            "stage1": {"epochs": 100, "lr_loc": 1e-2, "lr_scale": 1e-2},
            "sharing": {"n_components": 64},
            "stage3": {"epochs": 60, "lr_centre": 1e-2, "lr_outlier": 1e-2},
        },
    ),
    "resnet20": merge_settings(
        merge_settings(_IMAGE, _RESNET), {"prior": {"kind": "layerwise", "scale": 1.0}}
    ),
    "resnet20-normal-prior": merge_settings(_IMAGE, _RESNET),
}
PARTS = ("centres", "covariances", "index", "outliers", "ellipses", "net", "header")


VARIANTS = {
    "default": {},
    "INT8 outliers, 8-bit sigma": {"outlier_mu_bits": 8, "outlier_sigma_bits": 8},
    "INT8 outliers, 4-bit sigma": {"outlier_mu_bits": 8, "outlier_sigma_bits": 4},
    "faithful": FAITHFUL_OPTIONS,
}


def _probs(model, guide, split) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``twodg-pyro evaluate`` computes: 30 samples, prediction seed 0, test split."""
    x, y = split.test.tensors
    seed_everything(0)
    pred = predict(model, guide, (x, y), 30)
    return pred.mean, pred.targets


def _metrics(probs, targets) -> dict:
    m = classification_metrics(probs, targets)
    return {k: m[k] for k in ("accuracy", "nll", "ece")}


def train(cfg):
    """Stages 1-3 as :func:`~twodg_pyro.pipeline.runtime.runner.run` does them, keeping a copy of
    the mean-field BNN from before stage 3 (stage 3 goes on training the same network's
    deterministic parts, e.g. BatchNorm, so afterwards the mean-field model in the run's
    artifacts carries the 2DG BNN's BatchNorm state)."""
    art = RunArtifacts()
    seed_everything(cfg.seed)
    art.split = split = load_data(cfg.data, image=cfg.network.arch != "mlp")
    x, y = split.test.tensors
    seed_everything(cfg.seed)
    net = build_net(cfg.network, split)
    seed_everything(cfg.seed)
    stage1 = stage1_mean_field(RunContext(cfg=cfg), split, copy.deepcopy(net))
    art.trained["mean_field"] = stage1
    mean_field = copy.deepcopy((stage1.model, stage1.guide))
    predict(stage1.model, stage1.guide, (x, y), cfg.num_samples)  # as run() does (same RNG)
    record = run_2dg(RunContext(cfg=cfg), split, stage1, art, (x, y))
    return art, mean_field, record


def measure(name: str, folder: Path) -> dict:
    cfg = config_from_dict(merge_settings(SETTINGS[name], {"progress": False, "seed": 0}))
    t0 = time.perf_counter()
    art, (mf_model, mf_guide), _ = train(cfg)
    train_s = time.perf_counter() - t0
    entry = art.trained["2dg"]
    model, guide = entry.model, entry.guide
    split = art.split
    spec = network_spec(cfg.network, split)

    full = folder / f"{name}.pt"
    save_2dg(full, model, guide, network=spec)
    p_full, targets = _probs(*load_model_file(full), split)
    full_m = _metrics(p_full, targets)
    seeds_acc = [
        evaluate_model_file(full, data="digits", num_samples=30, seed=s)["accuracy"]
        for s in range(5)
    ]
    variants = {}
    for vname, options in VARIANTS.items():
        path = folder / f"{name}_{vname.replace(' ', '_')}.2dgz"
        t0 = time.perf_counter()
        rep = export_compact(path, model, guide, network=spec, **options)
        export_s = time.perf_counter() - t0
        loads = []
        for _ in range(5 if vname == "default" else 1):
            t0 = time.perf_counter()
            loaded = load_compact(path)
            loads.append(time.perf_counter() - t0)
        p, _ = _probs(*loaded, split)
        m = _metrics(p, targets)
        variants[vname] = {
            "options": options,
            "report": rep,
            "compact_bytes": path.stat().st_size,
            "bytes": {k: rep[k] for k in PARTS},
            "export_seconds": export_s,
            "load_seconds": statistics.median(loads),
            "metrics": m,
            "deltas": {k: m[k] - full_m[k] for k in TOL},
            "test_points_flipped": int((p.argmax(-1) != p_full.argmax(-1)).sum()),
            "max_prob_change": float((p - p_full).abs().max()),
            "median_prob_change": float((p - p_full).abs().max(-1).values.median()),
        }
    int8 = {}
    for bits in (4, 2, 1):
        path = folder / f"{name}_int8_{bits}bit.2dgz"
        export_int8_mean_field(path, mf_model, mf_guide, bits, network=spec)
        int8[bits] = path
    int8_m = {bits: _metrics(*_probs(*load_compact(int8[bits]), split)) for bits in (4, 1)}
    mf_m = _metrics(*_probs(mf_model, mf_guide, split))
    acct = compression_report(guide, model)
    d = variants["default"]
    rep = d["report"]
    chosen_h = (
        rep["index_entropy_bits_per_site"]
        if rep["index_coding"] == "per_site"
        else rep["index_entropy_bits"]
    )
    out = {
        "network": name,
        "data": "scikit-learn digits 8x8 (1,437 train / 359 test), trained here",
        "settings": {
            "prior": cfg.prior.kind,
            "stage1_epochs": cfg.stage1.epochs,
            "stage3_epochs": cfg.stage3.epochs,
            "initial_components": cfg.sharing.n_components,
            "tying": cfg.stage3.tying,
        },
        "train_seconds": train_s,
        "n_weights": rep["n_weights"],
        "n_components": rep["n_components"],
        "n_outliers": rep["n_outliers"],
        "n_ellipses": rep["n_ellipses"],
        "full_bytes": full.stat().st_size,
        "compact_bytes": d["compact_bytes"],
        "bytes": d["bytes"],
        "int8_mf_4bit_bytes": int8[4].stat().st_size,
        "int8_mf_2bit_bytes": int8[2].stat().st_size,
        "int8_mf_1bit_bytes": int8[1].stat().st_size,
        "accounting_bytes": {
            "size_mb": round(acct["size_mb"] * 1e6),
            "size_mb_with_index": round(acct["size_mb_with_index"] * 1e6),
            "size_mb_with_packed_index": round(acct["size_mb_with_packed_index"] * 1e6),
        },
        "index_coding": rep["index_coding"],
        "index_bytes_by_coding": rep["index_bytes_by_coding"],
        "index_bits_per_weight": rep["index_bits_per_weight"],
        "index_entropy_bits": rep["index_entropy_bits"],
        "index_entropy_bits_per_site": rep["index_entropy_bits_per_site"],
        "index_over_entropy": rep["index_bits_per_weight"] / chosen_h,
        "export_seconds": d["export_seconds"],
        "load_seconds": d["load_seconds"],
        "metrics_full": full_m,
        "metrics_compact": d["metrics"],
        "deltas": d["deltas"],
        "accuracy_full_prediction_seeds_0_4": seeds_acc,
        "metrics_mean_field": mf_m,
        "metrics_int8_mf_4bit": int8_m[4],
        "metrics_int8_mf_1bit": int8_m[1],
        "variants": {
            k: {kk: vv for kk, vv in v.items() if kk != "report"} for k, v in variants.items()
        },
        "meets": {
            "smaller_than_int8_1bit": d["compact_bytes"] < int8[1].stat().st_size,
            "index_within_5pct_of_entropy": rep["index_bits_per_weight"] <= 1.05 * chosen_h,
            "metrics_within_tolerance": all(abs(d["deltas"][k]) <= TOL[k] for k in TOL),
            "loads_under_1s": d["load_seconds"] < 1.0,
        },
    }
    print(name, out["compact_bytes"], out["int8_mf_1bit_bytes"], out["deltas"], flush=True)
    return out


def _fmt(m: dict) -> str:
    return f"{m['accuracy']:.4f} / {m['nll']:.3f} / {m['ece']:.3f}"


def markdown(records: list[dict]) -> str:
    lines = [
        "# Compact model files (`.2dgz`) against the full file and INT8 mean-field files",
        "",
        "Bytes on disk.  `full`: `save_2dg` (`model_2dg.pt`); `compact`: `export_compact`",
        "defaults (float16 centres, outliers 16-bit mu and sigma, 8-bit alphas, `auto` index",
        "coding); INT8 MF: the mean-field BNN of the same run, INT8 mu + b-bit sigma, same",
        "container.  All networks trained here on scikit-learn's 8x8 digits (short runs,",
        "representative tying; settings in the JSON and the script's docstring).",
        "",
        "| network | n_w | K | outliers | ellipses | full | compact | full / compact "
        "| INT8 MF 4-bit | 2-bit | 1-bit | compact < 1-bit | load s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['network']} | {r['n_weights']:,} | {r['n_components']} | {r['n_outliers']:,} "
            f"| {r['n_ellipses']:,} | {r['full_bytes']:,} | {r['compact_bytes']:,} "
            f"| {r['full_bytes'] / r['compact_bytes']:.0f}x | {r['int8_mf_4bit_bytes']:,} "
            f"| {r['int8_mf_2bit_bytes']:,} | {r['int8_mf_1bit_bytes']:,} "
            f"| {'yes' if r['meets']['smaller_than_int8_1bit'] else 'NO'} "
            f"| {r['load_seconds']:.3f} |"
        )
    lines += [
        "",
        "**Parts of the compact file (bytes)** and the accounting's sizes "
        "(`compression_report`: float32 parameters, + uint8/16 index, + bit-packed index)",
        "",
        "| network | centres | covariances | index | outliers | ellipses | net | header "
        "| accounting: params / + index / + packed index |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        b, a = r["bytes"], r["accounting_bytes"]
        lines.append(
            f"| {r['network']} | "
            + " | ".join(f"{b[k]:,}" for k in PARTS)
            + f" | {a['size_mb']:,} / {a['size_mb_with_index']:,} / "
            f"{a['size_mb_with_packed_index']:,} |"
        )
    lines += [
        "",
        "**The index** (one symbol per weight: component, outlier or ellipse), bits per "
        "weight, tables and lane states included, against the zeroth-order empirical "
        "entropy of the assignment (global, and given the layer)",
        "",
        "| network | coding | index bits / weight | entropy | entropy given layer "
        "| bits / entropy of the coding's model | bytes global / per layer |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        by = r["index_bytes_by_coding"]
        lines.append(
            f"| {r['network']} | {r['index_coding']} | {r['index_bits_per_weight']:.3f} "
            f"| {r['index_entropy_bits']:.3f} | {r['index_entropy_bits_per_site']:.3f} "
            f"| {r['index_over_entropy']:.3f} | {by.get('global', 0):,} / "
            f"{by.get('per_site', 0):,} |"
        )
    lines += [
        "",
        "**Predictions** (acc / NLL / ECE; 30 samples, prediction seed 0, test split, as "
        "`twodg-pyro evaluate`): the 2DG BNN from the full file (and its accuracy under "
        "prediction seeds 0-4, to show how noisy it is) and from the compact file; the "
        "mean-field BNN of the same run, unquantised and from its INT8 files",
        "",
        "| network | 2DG full | acc, seeds 0-4 | 2DG compact "
        "| within 0.1 pp / 0.01 / 0.005 | mean-field | INT8 MF 4-bit | INT8 MF 1-bit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        seeds = r["accuracy_full_prediction_seeds_0_4"]
        lines.append(
            f"| {r['network']} | {_fmt(r['metrics_full'])} | {min(seeds):.3f}-{max(seeds):.3f} "
            f"| {_fmt(r['metrics_compact'])} "
            f"| {'yes' if r['meets']['metrics_within_tolerance'] else 'NO'} "
            f"| {_fmt(r['metrics_mean_field'])} | {_fmt(r['metrics_int8_mf_4bit'])} "
            f"| {_fmt(r['metrics_int8_mf_1bit'])} |"
        )
    lines += [
        "",
        "**What the rounding costs**: the compact file with the defaults (16-bit outlier mu "
        "and sigma), with the outliers as the INT8 baseline stores its weights (INT8 mu, "
        "8- or 4-bit sigma; the rest as the defaults), and with `FAITHFUL_OPTIONS` "
        "(`--faithful`: float32 centres, 16-bit outlier mu and sigma, 16-bit alphas): bytes, "
        "test points whose predicted class changes against the full file (same seed), the "
        "largest and the median (over test points) change of a predicted probability",
        "",
        "| network | variant | bytes | acc / NLL / ECE | points flipped | max / median "
        "prob change |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        for vname, v in r["variants"].items():
            lines.append(
                f"| {r['network']} | {vname} | {v['compact_bytes']:,} | {_fmt(v['metrics'])} "
                f"| {v['test_points_flipped']} | {v['max_prob_change']:.1e} / "
                f"{v['median_prob_change']:.1e} |"
            )
    lines += ["", "Command: `python benchmarks/bench_compact_export.py`", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        records = [measure(n, Path(tmp)) for n in args.networks]
    total = time.perf_counter() - t0
    record(
        "compact_export",
        {"records": records, "total_seconds": total},
        markdown(records),
    )


if __name__ == "__main__":
    main()
