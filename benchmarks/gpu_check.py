"""Device check: does everything run on the GPU, how fast, and how much memory does a step take.

On a GPU machine (``--device cuda``, the default when CUDA is available), in under five
minutes:

1. the digits pipeline (``twodg-pyro train`` on the ``digits`` preset, with checkpoints)
   with ``--device cuda``, then ``--resume`` of the finished run (loads its checkpoints
   onto the GPU and predicts again);
2. SVI step time on ResNet-18 (torchvision, 10 classes, CIFAR-sized random input
   3x32x32, batch 32): a mean-field step and a stage-3 step in each tying (synthetic
   sharing structure: K = 64, 1% outliers, 0.5% ellipse weights);
3. peak memory of one step of each (``torch.cuda.max_memory_allocated`` after
   ``reset_peak_memory_stats``), above the memory held before the step.

On CPU (``--device cpu``) the pipeline is skipped (the test suite covers it) and memory
is the peak resident set size (RSS, ``VmHWM`` of ``/proc/self/status``; ``tracemalloc``
does not see torch's allocations) of a fresh process per contender: ``first step`` is
the peak above the RSS before any step (it includes creating gradients and optimiser
state); ``later step`` is the peak of the next step above the RSS before it (the peak is
reset through ``/proc/self/clear_refs``).

Run: python benchmarks/gpu_check.py [--device cuda|cpu] [--steps N] [--skip-pipeline]
Writes benchmarks/results/gpu_check_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import record  # noqa: E402

CONTENDERS = ("mean_field", "stage3_representative", "stage3_stochastic", "stage3_tied")
BATCH, N_DATA = 32, 50000


# ---------------------------------------------------------------------- memory probes
def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------- one contender
def build_step(name: str, device: str):
    """``(step, info)``: one SVI step of ``name`` on ResNet-18 with CIFAR-sized input."""
    from bench_svi_step import make_structure

    from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
    from twodg_pyro.infer import DecomposedELBO
    from twodg_pyro.infer.trainer import build_optimizer
    from twodg_pyro.likelihoods import Categorical
    from twodg_pyro.model import BNNModel
    from twodg_pyro.models import resnet18

    torch.manual_seed(0)
    model = BNNModel(resnet18(num_classes=10), likelihood=Categorical(N_DATA)).to(device)
    if name == "mean_field":
        guide = MeanFieldGuide(model)
    else:
        guide = SharedGMMGuide(model, make_structure(model), name.split("_", 1)[1])
    guide = guide.to(device)
    opt = build_optimizer(model, guide, 1e-3)
    elbo = DecomposedELBO()
    x = torch.randn(BATCH, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (BATCH,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        elbo.combine(elbo.loss_terms(model, guide, x, y)).backward()
        opt.step()

    info = {"n_weights": model.num_weights, "guide_trainable": guide.num_trainable()}
    return step, info


def measure_one(name: str, device: str, steps: int) -> dict:
    """Time and memory of ``name``'s step in this process (call in a fresh process)."""
    cuda = device.startswith("cuda")
    rss0 = _status_kb("VmRSS")
    step, info = build_step(name, device)
    out = dict(info)
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        out["first_step_peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        out["later_step_peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        out["held_after_steps_mb"] = torch.cuda.memory_allocated() / 2**20
    else:
        before = _status_kb("VmRSS")
        out["setup_rss_mb"] = (before - rss0) / 1024
        out["peak_reset"] = _reset_peak_rss()  # else the first peak includes the setup's
        step()
        out["first_step_peak_mb"] = (_status_kb("VmHWM") - before) / 1024
        before = _status_kb("VmRSS")
        out["later_step_peak_mb"] = None
        if _reset_peak_rss():
            step()
            out["later_step_peak_mb"] = (_status_kb("VmHWM") - before) / 1024
        out["peak_rss_mb"] = _status_kb("VmHWM") / 1024
    times = []
    for _ in range(steps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    out["step_ms_median"] = times[len(times) // 2] * 1e3
    out["steps_timed"] = steps
    return out


def measure_all(device: str, steps: int) -> dict:
    """Each contender in its own process (fresh allocator and RSS)."""
    results = {}
    for name in CONTENDERS:
        cmd = [sys.executable, __file__, "--one", name, "--device", device, "--steps", str(steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            results[name] = {"error": proc.stderr[-2000:]}
            continue
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(name, results[name], flush=True)
    return results


# ---------------------------------------------------------------------- pipeline
def pipeline(device: str) -> dict:
    """The digits preset with checkpoints on ``device``, then a resume of the finished run."""
    from twodg_pyro.cli import main
    from twodg_pyro.pipeline.config import merge_settings
    from twodg_pyro.pipeline.presets import preset

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "digits.json"
        cfg.write_text(json.dumps(merge_settings(preset("digits"), {"checkpoint_every": 10})))
        run_dir = Path(tmp) / "run"
        t = time.perf_counter()
        rc = main(["train", "--config", str(cfg), "--out", str(run_dir), "--device", device,
                   "--no-progress"])  # fmt: skip
        out["pipeline_seconds"], out["pipeline_rc"] = time.perf_counter() - t, rc
        if rc == 0:
            records = json.loads((run_dir / "results.json").read_text())["records"]
            out["records"] = {
                r["method"]: {k: r[k] for k in ("accuracy", "nll", "ece") if k in r}
                for r in records
            }
            t = time.perf_counter()
            rc = main(["train", "--resume", str(run_dir), "--device", device, "--no-progress"])
            out["resume_seconds"], out["resume_rc"] = time.perf_counter() - t, rc
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per contender")
    ap.add_argument("--skip-pipeline", action="store_true")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    steps = args.steps or (20 if cuda else 3)
    if args.one:
        print(json.dumps(measure_one(args.one, args.device, steps)))
        return
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda but CUDA is not available")
    t0 = time.perf_counter()
    payload: dict = {"device": args.device, "batch": BATCH, "input": [3, 32, 32]}
    if cuda:
        payload["gpu"] = torch.cuda.get_device_name(0)
    if cuda and not args.skip_pipeline:
        payload["pipeline"] = pipeline(args.device)
        print("pipeline", payload["pipeline"], flush=True)
    payload["steps"] = measure_all(args.device, steps)
    payload["total_seconds"] = time.perf_counter() - t0
    unit = "CUDA max_memory_allocated" if cuda else "peak RSS (VmHWM)"
    lines = [
        f"# Device check on {args.device}" + (f" ({payload['gpu']})" if cuda else ""),
        "",
        f"ResNet-18 (torchvision, 10 classes), input {BATCH}x3x32x32, one SVI step; memory: "
        f"{unit} above what was held before the step, MB.",
        "",
        "| contender | step ms (median) | first-step peak MB | later-step peak MB |"
        " held before the steps MB | guide trainable |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in payload["steps"].items():
        if "error" in r:
            lines.append(f"| {name} | error | - | - | - | - |")
            continue
        later = r.get("later_step_peak_mb")
        held = r.get("setup_rss_mb", r.get("held_after_steps_mb"))
        lines.append(
            f"| {name} | {r['step_ms_median']:.1f} | {r['first_step_peak_mb']:.0f} | "
            + ("-" if later is None else f"{later:.0f}")
            + " | "
            + ("-" if held is None else f"{held:.0f}")
            + f" | {r['guide_trainable']:,} |"
        )
    if not cuda:
        lines += [
            "",
            "CPU step times come from one process per contender run one after another on a "
            "shared machine: compare them only roughly (benchmarks/bench_svi_step.py times "
            "steps side by side). Memory is what this table is for.",
        ]
    if "pipeline" in payload:
        p = payload["pipeline"]
        lines += ["", f"Digits pipeline on {args.device}: rc {p.get('pipeline_rc')}, "
                  f"{p.get('pipeline_seconds', 0):.0f} s; resume rc {p.get('resume_rc')}; "
                  f"records {p.get('records')}"]  # fmt: skip
    lines += ["", f"Command: `python benchmarks/gpu_check.py --device {args.device}`"]
    record(f"gpu_check_{args.device.split(':')[0]}", payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
