"""Device check: the whole library on one device, and how fast and big its steps are.

One short script for a GPU machine (``--device cuda``; sized to finish in under 8
minutes on one GPU, and ``--budget-s``, default 400, skips the sections still left after
that many seconds) that runs every user-facing path on the device, each section timed
and reported as ``ok`` or with its error (a failing section does not stop the others):

``surface``
    the pipeline (:func:`twodg_pyro.pipeline.run`) on the bundled digits with a few
    epochs: every method (``deterministic``, ``mean_field``, ``2dg``, ``rank1``,
    ``ssvi``) with checkpoints, the model file, InferenceData, k-hat, PSIS-LOO and
    figures; then the ``stochastic`` and ``tied`` tyings on the same stage 1
    (:func:`~twodg_pyro.pipeline.runtime.variants.run_variants`); then ``mean_field`` and
    ``2dg`` on a convolutional network with BatchNorm (ResNet-20 on 1x8x8 digits).
``float64``
    the same five methods with ``network.dtype = "float64"``: everything must come out
    in float64.
``resume``
    a run interrupted right after a stage-3 checkpoint and resumed, compared with the
    uninterrupted run (on CUDA the results may differ in the last digits:
    non-deterministic kernels); and a run interrupted on the CPU resumed on the device
    (checkpoints move between devices).
``evaluate``
    ``twodg-pyro evaluate`` of the device-trained model file on the device and on the
    CPU (the metrics must agree closely) and ``twodg-pyro diagnose`` on the device.
``ddp``
    a 2-process ``train`` (NCCL on two GPUs; gloo on the CPU); skipped with one GPU.
``steps``
    median step time and peak memory of one training step: the deterministic network
    (cross-entropy, Adam) beside the mean-field SVI step and the stage-3 step in each
    tying (``fit``'s step, with the fast step of :mod:`twodg_pyro.infer.fast_step`;
    synthetic sharing structure: K = 64, 1% outliers, 0.5% ellipse weights), and the
    mean-field step traced by Pyro (``mean_field_traced``, ``fast_step=False``), for
    ResNet-18 on 3x32x32 at batch 32 (10 classes), and on CUDA ResNet-18 at batch 128
    and ResNet-50 at batch 64 on 3x224x224 (1000 classes), with each step's ratio to
    the deterministic and to the mean-field step and the targets of issue 16 (mean-field
    <= 2x deterministic, each stage-3 tying <= 1.1x mean-field in time, and at most the
    mean-field step's peak memory).  Memory: CUDA ``max_memory_allocated`` above what was
    held before the step; on the CPU the peak resident set size (``VmHWM``) above the RSS
    before the step, one process per contender.  ``--smoke`` runs the two ImageNet-size
    configurations with the same networks and contenders at a tiny size (3x32x32, batch
    2, 10 classes, one timed step, one process per configuration): the section's code on
    the CPU in about a minute, not a measurement.

Run on a GPU machine (see ``../shared/device/``: ``prepare.sh`` here, then on the
machine ``bash .whl/on-device.sh python3 benchmarks/gpu_check.py --device cuda --out
$OUT``); writes ``OUT/gpu_check_<device>.{json,md}`` and, on CUDA,
``benchmarks/results/gpu_check_cuda.{json,md}``.  On the CPU: ``python
benchmarks/gpu_check.py --device cpu --quick --out DIR`` runs every section at small
sizes (an MLP instead of the ResNets; minutes on 2 cores); ``--record`` also writes
``benchmarks/results/gpu_check_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from _common import RESULTS, machine, record

CONTENDERS = (
    "deterministic",
    "mean_field",
    "stage3_representative",
    "stage3_stochastic",
    "stage3_tied",
    "mean_field_traced",
)
#: issue 16's targets for the ImageNet-size steps on a GPU
STEP_TARGETS = {"mean_field_to_deterministic": 2.0, "stage3_to_mean_field": 1.1}
#: step configurations: network, classes, input side, batch
STEP_CONFIGS = {
    "resnet18_32_b32": ("resnet18", 10, 32, 32),
    "resnet18_224_b128": ("resnet18", 1000, 224, 128),
    "resnet50_224_b64": ("resnet50", 1000, 224, 64),
    "mlp_b32": ("mlp", 10, 28, 32),  # --quick: MLP 784-400-400-10
    # --smoke: the ImageNet-size configurations' networks at a tiny size
    "resnet18_224_b128_smoke": ("resnet18", 10, 32, 2),
    "resnet50_224_b64_smoke": ("resnet50", 10, 32, 2),
}
N_DATA = 50000
METHODS = ["deterministic", "mean_field", "2dg", "rank1", "ssvi"]

#: a few epochs of every method on digits: the paths, not the accuracy
TINY = {
    "methods": METHODS,
    "seed": 0,
    "num_samples": 10,
    "progress": False,
    "checkpoint_every": 2,
    "network": {"arch": "mlp", "hidden": [64]},
    "stage1": {"epochs": 8, "deterministic_epochs": 4},
    "sharing": {
        "outlier_rule": "quantile",
        "mu_quantile": 0.99,
        "grad_percentile": 0.005,
        "n_components": 16,
        "n_min": 5,
    },
    "stage3": {
        "epochs": 6,
        "lr_centre": 1e-2,
        "lr_outlier": 1e-2,
        "lr_cov": 1e-2,
        "merge_every": 2,
        "reassign_every": 3,
    },
    "rank1": {"epochs": 4, "components": 2},
    "ssvi": {"epochs": 4, "update_every": 2},
    "diagnostics": {"khat_samples": 30, "max_examples": 400},
}


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


# ---------------------------------------------------------------------- one step
def _net(arch: str, classes: int):
    from twodg_pyro.models import MLP, resnet18, resnet50

    if arch == "mlp":
        return MLP(784, (400, 400), classes)
    return {"resnet18": resnet18, "resnet50": resnet50}[arch](num_classes=classes)


def build_step(config: str, name: str, device: str):
    """``(step, info)``: one training step of contender ``name`` in step configuration
    ``config`` (:data:`STEP_CONFIGS`) on ``device``."""
    from bench_svi_step import make_structure

    from twodg_pyro.bnn import BNNModel
    from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
    from twodg_pyro.infer import DecomposedELBO
    from twodg_pyro.infer.optim import build_optimizer
    from twodg_pyro.likelihoods import Categorical

    arch, classes, side, batch = STEP_CONFIGS[config]
    torch.manual_seed(0)
    net = _net(arch, classes).to(device)
    shape = (batch, 784) if arch == "mlp" else (batch, 3, side, side)
    x = torch.randn(shape, device=device)
    y = torch.randint(0, classes, (batch,), device=device)
    if name == "deterministic":
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        net.train()

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

        return step, {"trainable": sum(p.numel() for p in net.parameters())}
    model = BNNModel(net, likelihood=Categorical(N_DATA))
    traced = name.endswith("_traced")
    name = name.removesuffix("_traced")
    if name == "mean_field":
        guide = MeanFieldGuide(model)
    else:
        guide = SharedGMMGuide(model, make_structure(model), name.split("_", 1)[1])
    opt = build_optimizer(model, guide, 1e-3)
    elbo = DecomposedELBO(fast_step=not traced)
    model.train()

    def step():
        opt.zero_grad(set_to_none=True)
        elbo.combine(elbo.loss_terms(model, guide, x, y)).backward()
        opt.step()

    info = {"n_weights": model.num_weights, "trainable": guide.num_trainable()}

    def first_step():  # records which path the step took
        step()
        info["step_path"] = elbo.step_path

    return first_step, info


def measure_one(config: str, name: str, device: str, steps: int) -> dict:
    """Time and memory of one contender's step in this process."""
    cuda = device.startswith("cuda")
    out: dict = {}
    rss0 = _status_kb("VmRSS")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        held0 = torch.cuda.memory_allocated()
    t = time.perf_counter()
    step, info = build_step(config, name, device)
    out.update(info)
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        out["held_before_steps_mb"] = (base - held0) / 2**20
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        out["first_step_peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        out["later_step_peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        before = _status_kb("VmRSS")
        out["held_before_steps_mb"] = (before - rss0) / 1024
        reset = _reset_peak_rss()  # else the first peak includes the setup's
        step()
        out["first_step_peak_mb"] = (_status_kb("VmHWM") - before) / 1024 if reset else None
        before = _status_kb("VmRSS")
        out["later_step_peak_mb"] = None
        if _reset_peak_rss():
            step()
            out["later_step_peak_mb"] = (_status_kb("VmHWM") - before) / 1024
    out["setup_and_first_steps_s"] = time.perf_counter() - t
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
    out.update(info)  # with the path the step took (fast or traced)
    return out


def _one_process(config: str, names: list[str], device: str, steps: int) -> dict:
    """Contenders ``names`` of ``config`` in this process, one after another (CUDA: the
    allocator's statistics are exact per contender; an error is kept per contender)."""
    results = {}
    for name in names:
        try:
            results[name] = measure_one(config, name, device, steps)
        except Exception as e:  # noqa: BLE001 - reported (e.g. out of memory)
            results[name] = {"error": f"{type(e).__name__}: {e}"[-1500:]}
        gc.collect()  # the contender's model, guide and optimiser go before the next
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return results


def measure_config(
    config: str, device: str, steps: int, timeout_s: float, one_process: bool = False
) -> dict:
    """Every contender of ``config``: in one fresh process on CUDA (or ``one_process``),
    one process each on the CPU (a fresh resident set per contender)."""
    together = one_process or device.startswith("cuda")
    groups = [list(CONTENDERS)] if together else [[n] for n in CONTENDERS]
    results: dict = {}
    for names in groups:
        cmd = [sys.executable, __file__, "--one", f"{config}:{','.join(names)}"]
        cmd += ["--device", device, "--steps", str(steps)]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, check=False, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            results.update({n: {"error": f"timed out after {timeout_s:.0f} s"} for n in names})
            continue
        if proc.returncode != 0:
            results.update({n: {"error": proc.stderr[-2000:]} for n in names})
            continue
        results.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    for name, r in results.items():
        print(config, name, r, flush=True)
    return results


def step_ratios(results: dict) -> dict:
    """Each contender's step time over the deterministic and the mean-field step's, its
    peak memory over the mean-field step's, and issue 16's targets (:data:`STEP_TARGETS`)
    met or not (``None`` where a time is missing)."""

    def get(name, key):
        r = results.get(name) or {}
        return r.get(key) if "error" not in r else None

    det, mf = get("deterministic", "step_ms_median"), get("mean_field", "step_ms_median")
    mf_peak = get("mean_field", "later_step_peak_mb")
    out: dict = {"to_deterministic": {}, "to_mean_field": {}, "peak_to_mean_field": {}}
    for name in results:
        ms, peak = get(name, "step_ms_median"), get(name, "later_step_peak_mb")
        if ms is not None and det:
            out["to_deterministic"][name] = ms / det
        if ms is not None and mf and name.startswith("stage3"):
            out["to_mean_field"][name] = ms / mf
        if peak is not None and mf_peak and name.startswith("stage3"):
            out["peak_to_mean_field"][name] = peak / mf_peak
    mf_ratio = out["to_deterministic"].get("mean_field")
    out["targets_met"] = {
        "mean_field_to_deterministic": None
        if mf_ratio is None
        else mf_ratio <= STEP_TARGETS["mean_field_to_deterministic"],
        **{
            f"{k}_time": v <= STEP_TARGETS["stage3_to_mean_field"]
            for k, v in out["to_mean_field"].items()
        },
        **{f"{k}_memory": v <= 1.0 for k, v in out["peak_to_mean_field"].items()},
    }
    return out


# ---------------------------------------------------------------------- sections
def _section(payload: dict, name: str, fn, deadline: float) -> None:
    """Run ``fn()`` as section ``name``: its result, ``ok``/error and seconds."""
    if time.perf_counter() > deadline:
        payload["sections"][name] = {"status": "skipped (time budget spent)"}
        print(f"[{name}] skipped: time budget spent", flush=True)
        return
    print(f"[{name}] ...", flush=True)
    t = time.perf_counter()
    try:
        result = fn()
        status = "ok"
        problems = result.pop("problems", []) if isinstance(result, dict) else []
        if problems:
            status = "failed: " + "; ".join(problems)
    except Exception as e:  # noqa: BLE001 - reported, the other sections still run
        result = {"traceback": traceback.format_exc()[-4000:]}
        status = f"error: {type(e).__name__}: {e}"[:500]
    result = result if isinstance(result, dict) else {"result": result}
    payload["sections"][name] = {"status": status, "seconds": time.perf_counter() - t, **result}
    print(f"[{name}] {status} ({payload['sections'][name]['seconds']:.1f} s)", flush=True)


def _metrics(records: list[dict]) -> dict:
    return {
        r["method"] + (f" ({r['variant']})" if "variant" in r else ""): {
            k: r[k] for k in ("accuracy", "nll", "ece") if k in r
        }
        for r in records
    }


def _tiny(device: str, **over) -> dict:
    from twodg_pyro.pipeline.settings.config import merge_settings

    return merge_settings(copy.deepcopy(TINY), {"device": device, **over})


def section_surface(device: str, work: Path, quick: bool) -> dict:
    from twodg_pyro.pipeline import config_from_dict, run
    from twodg_pyro.pipeline.runtime.variants import run_variants

    out: dict = {"problems": []}
    run_dir = work / "surface"
    art = run(config_from_dict(_tiny(device)), run_dir)
    out["records"] = _metrics(art.records)
    written = sorted(p.name for p in run_dir.iterdir())
    out["files"] = written
    methods = [r["method"] for r in art.records if r["method"] != "deterministic"]
    expected = ["results.json", "diagnostics.json"]
    expected += [f"model_{m}.pt" for m in methods] + [f"inference_data_{m}.nc" for m in methods]
    for name in expected:
        if name not in written:
            out["problems"].append(f"{name} not written")
    diag = json.loads((run_dir / "diagnostics.json").read_text())
    out["diagnostics_errors"] = sorted(diag.get("errors", {}))
    out["khat"] = (diag.get("vi") or {}).get("khat")
    if diag.get("errors"):
        out["problems"].append(f"diagnostics errors: {sorted(diag['errors'])}")
    guide = art.trained["2dg"].guide
    out["guide_device"] = str(guide.centre_mu.device)
    if guide.centre_mu.device.type != torch.device(device).type:
        out["problems"].append(f"the 2DG guide is on {guide.centre_mu.device}")
    base = config_from_dict(_tiny(device, methods=["mean_field", "2dg"], checkpoint_every=0))
    tyings = {t: {"stage3": {"tying": t}} for t in ("stochastic", "tied")}
    records, _ = run_variants(base, tyings)
    out["tyings"] = _metrics(records)
    if not quick:  # a conv net with BatchNorm: deterministic parameters beside the sites
        conv = _tiny(
            device,
            methods=["mean_field", "2dg"],
            checkpoint_every=0,
            network={"arch": "resnet20"},
            stage1={"epochs": 2},
            stage3={"epochs": 2},
        )
        conv_art = run(config_from_dict(conv), work / "surface_conv")
        out["resnet20"] = _metrics(conv_art.records)
    return out


def section_float64(device: str, work: Path) -> dict:
    from twodg_pyro.pipeline import config_from_dict, run

    art = run(config_from_dict(_tiny(device, network={"dtype": "float64"})), work / "f64")
    model, guide = art.trained["2dg"].model, art.trained["2dg"].guide
    mf_guide = art.trained["mean_field"].guide
    dtypes = {
        "network": str(model.dtype),
        "prior": str(model.prior_distribution(model.sites[0]).base_dist.loc.dtype),
        "mean_field_guide": str(next(iter(mf_guide.locs.values())).dtype),
        "shared_gmm_guide": str(guide.centre_mu.dtype),
        "draws": str(next(iter(guide.sample_weights(2).values())).dtype),
        "structure": str(art.trained["2dg"].structure.means.dtype),
    }
    problems = [f"{k} is {v}" for k, v in dtypes.items() if v != "torch.float64"]
    return {"dtypes": dtypes, "records": _metrics(art.records), "problems": problems}


def interrupting_save(real, stage: str, epoch: int):
    """``Checkpoint.save`` (``real``) raising ``KeyboardInterrupt`` right after it writes
    the checkpoint of ``stage`` at ``epoch`` (the tests' ``interrupt_after`` uses it too)."""

    def save_then_die(self, state):
        path = real(self, state)
        if self.stage == stage and state.epoch == epoch:
            raise KeyboardInterrupt
        return path

    return save_then_die


def _interrupt_after(stage: str, epoch: int):
    """A patch of ``Checkpoint.save`` (:func:`interrupting_save`); returns ``(install,
    remove)``."""
    from twodg_pyro.infer import checkpoint as ckpt_mod

    real = ckpt_mod.Checkpoint.save

    def install():
        ckpt_mod.Checkpoint.save = interrupting_save(real, stage, epoch)

    def remove():
        ckpt_mod.Checkpoint.save = real

    return install, remove


def _interrupted_then_resumed(cfg_dict: dict, run_dir: Path, resume_device: str) -> dict:
    from twodg_pyro.pipeline import config_from_dict, run

    install, remove = _interrupt_after("stage3", 2)
    install()
    try:
        run(config_from_dict(cfg_dict), run_dir)
        raise RuntimeError("the run was not interrupted")
    except KeyboardInterrupt:
        pass
    finally:
        remove()
    resumed = run(config_from_dict({**cfg_dict, "device": resume_device}), run_dir, resume=True)
    return {r["method"]: r for r in resumed.records}


def section_resume(device: str, work: Path) -> dict:
    from twodg_pyro.pipeline import config_from_dict, run

    cfg = _tiny(device, methods=["mean_field", "2dg"])
    ref = {r["method"]: r for r in run(config_from_dict(cfg), work / "ref").records}
    out: dict = {"problems": []}
    got = _interrupted_then_resumed(cfg, work / "resumed", device)
    diffs = {m: max(abs(got[m][k] - ref[m][k]) for k in ("accuracy", "nll", "ece")) for m in ref}
    out["same_device_max_abs_diff"] = diffs
    out["same_device_identical"] = all(v == 0 for v in diffs.values())
    if set(got) != set(ref):
        out["problems"].append(f"resumed methods {sorted(got)} != {sorted(ref)}")
    if device != "cpu":  # written on the CPU, resumed on the device
        cpu_cfg = _tiny("cpu", methods=["mean_field", "2dg"])
        got = _interrupted_then_resumed(cpu_cfg, work / "cpu_to_device", device)
        out["cpu_to_device"] = _metrics(list(got.values()))
    return out


def _cli(args: list[str]) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "twodg_pyro.cli", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def section_evaluate(device: str, work: Path) -> dict:
    model_file = work / "surface" / "model_2dg.pt"
    if not model_file.is_file():
        raise FileNotFoundError(f"{model_file} (the surface section writes it)")
    out: dict = {"problems": []}
    metrics = {}
    for dev in dict.fromkeys([device, "cpu"]):
        path = work / f"metrics_{dev.replace(':', '_')}.json"
        rc, log = _cli(["evaluate", str(model_file), "--device", dev, "--out", str(path)])
        if rc != 0:
            out["problems"].append(f"evaluate --device {dev}: rc {rc}: {log[-500:]}")
            continue
        metrics[dev] = json.loads(path.read_text())
    out["metrics"] = {d: {k: m[k] for k in ("accuracy", "nll", "ece")} for d, m in metrics.items()}
    if len(metrics) == 2:
        a, b = metrics.values()
        out["device_vs_cpu_max_abs_diff"] = max(
            abs(a[k] - b[k]) for k in ("accuracy", "nll", "ece")
        )
    diag = work / "diagnose"
    args = ["diagnose", str(model_file), "--device", device, "--out", str(diag), "--no-progress"]
    rc, log = _cli(args + ["--khat-samples", "30", "--max-examples", "300", "--num-samples", "10"])
    out["diagnose_rc"] = rc
    if rc != 0:
        out["problems"].append(f"diagnose: rc {rc}: {log[-500:]}")
    else:
        report = json.loads((diag / "diagnostics.json").read_text())
        out["diagnose_khat"] = (report.get("vi") or {}).get("khat")
    return out


def section_ddp(device: str, work: Path) -> dict:
    from twodg_pyro.distributed.launch import run_local

    cuda = device.startswith("cuda")
    if cuda and torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count()} GPU: a 2-process run needs two"}
    cfg = _tiny(device, methods=["deterministic", "mean_field", "2dg"], checkpoint_every=0)
    cfg["diagnostics"] = {"enabled": False}
    path = work / "ddp.json"
    path.write_text(json.dumps(cfg))
    out_dir = work / "ddp"
    argv = ["-m", "twodg_pyro.cli", "train", "--config", str(path), "--out", str(out_dir)]
    env = {"NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    ranks = run_local(argv, 2, timeout_s=300, env=env)
    problems = [
        f"rank {r.rank}: rc {r.returncode}: {r.stderr[-800:]}" for r in ranks if r.returncode != 0
    ]
    out: dict = {"backend": "nccl" if cuda else "gloo", "problems": problems}
    if not problems:
        records = json.loads((out_dir / "results.json").read_text())["records"]
        out["records"] = _metrics(records)
        out["world_size"] = sorted({r.get("world_size") for r in records})
    return out


def section_recipe(device: str, work: Path, mnist_root: str) -> dict:
    """Issue 13's full-recipe table: ResNet-20 on the MNIST subset with the paper's epochs
    (``experiments/mnist_subset.py --arch resnet20 --full``); needs the subset folder
    (``experiments/mnist_subset_data.py``) carried to the machine."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "mnist_subset.py"
    cmd = [sys.executable, str(script), "--arch", "resnet20", "--full", "--device", device]
    cmd += ["--root", mnist_root, "--out", str(work / "recipe")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"problems": [f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}"]}
    payload = json.loads((work / "recipe" / "mnist_subset_resnet20_full.json").read_text())
    return {"table": (work / "recipe" / "mnist_subset_resnet20_full.md").read_text(), **payload}


def section_uncertainty(device: str, work: Path, mnist_root: str) -> dict:
    """Issue 21's full-size run: the recommended recipe's changes on ResNet-20 with the
    paper's epochs, clean + OOD + shift (``experiments/uncertainty.py --arch resnet20
    --full``); needs the subset folder carried to the machine."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "uncertainty.py"
    cmd = [sys.executable, str(script), "--arch", "resnet20", "--full", "--device", device]
    cmd += ["--seeds", "0", "--root", mnist_root, "--out", str(work / "uq"), "--stem", "uq"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"problems": [f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}"]}
    payload = json.loads((work / "uq" / "uq.json").read_text())
    return {"table": (work / "uq" / "uq.md").read_text(), "summary": payload["summary"]}


def section_steps(device: str, quick: bool, deadline: float, smoke: bool = False) -> dict:
    cuda = device.startswith("cuda")
    if smoke:
        configs = ["resnet18_224_b128_smoke", "resnet50_224_b64_smoke"]
    elif quick:
        configs = ["mlp_b32"]
    elif cuda:
        configs = ["resnet18_32_b32", "resnet18_224_b128", "resnet50_224_b64"]
    else:
        configs = ["resnet18_32_b32"]
    steps = 1 if smoke else (10 if cuda else (2 if quick else 3))
    out: dict = {}
    for config in configs:
        left = deadline - time.perf_counter()
        if left < 30:
            out[config] = {"skipped": "time budget spent"}
            continue
        results = measure_config(config, device, steps, max(left, 30), one_process=smoke)
        out[config] = {**results, "ratios": step_ratios(results)}
    return out


# ---------------------------------------------------------------------- report
def _markdown(payload: dict) -> str:
    dev = payload["device"]
    gpu = f" ({payload['gpu']})" if payload.get("gpu") else ""
    lines = [f"# Device check on {dev}{gpu}", "", "| section | status | seconds |", "|---|---|---|"]
    for name, sec in payload["sections"].items():
        sec_s = sec.get("seconds")
        lines.append(f"| {name} | {sec['status']} | {'-' if sec_s is None else f'{sec_s:.1f}'} |")
    steps = payload["sections"].get("steps", {})
    for config, results in steps.items():
        if not isinstance(results, dict) or config in ("status", "seconds"):
            continue
        arch, classes, side, batch = STEP_CONFIGS[config]
        lines += ["", f"**{arch}, {classes} classes, batch {batch}x3x{side}x{side}**", ""]
        if arch == "mlp":
            lines[-2] = f"**MLP 784-400-400-10, batch {batch}**"
        if "skipped" in results:
            lines.append(f"skipped: {results['skipped']}")
            continue
        lines += [
            "| contender | step ms (median) | x deterministic | x mean-field | first-step peak MB |"
            " later-step peak MB | held before the steps MB | trainable |",
            "|---|---|---|---|---|---|---|---|",
        ]
        ratios = results.get("ratios") or step_ratios(results)
        for name, r in results.items():
            if name == "ratios":
                continue
            if "error" in r:
                lines.append(f"| {name} | error: {r['error'][-120:]!r} | - | - | - | - | - | - |")
                continue

            def mb(v):
                return "-" if v is None else f"{v:.0f}"

            def x(v):
                return "-" if v is None else f"{v:.2f}"

            lines.append(
                f"| {name} | {r['step_ms_median']:.1f} | "
                f"{x(ratios['to_deterministic'].get(name))} | "
                f"{x(ratios['to_mean_field'].get(name))} | {mb(r['first_step_peak_mb'])}"
                f" | {mb(r['later_step_peak_mb'])} | {mb(r['held_before_steps_mb'])} |"
                f" {r['trainable']:,} |"
            )
        met = ratios.get("targets_met") or {}
        if met:
            lines += ["", "targets met: " + ", ".join(f"{k} {v}" for k, v in met.items())]
    for key in ("recipe", "uncertainty"):  # issues 13 and 21: the experiments' own tables
        section = payload["sections"].get(key, {})
        if "table" in section:
            lines += ["", section["table"].strip()]
    unit = "CUDA max_memory_allocated" if dev.startswith("cuda") else "peak RSS (VmHWM)"
    lines += [
        "",
        f"Memory: {unit} above what was held before the step. Sections: see "
        "benchmarks/gpu_check.py; details (records, dtypes, errors) in the JSON.",
        "",
        f"Command: `{payload['command']}`",
    ]
    if not dev.startswith("cuda"):
        lines.insert(
            -2,
            "CPU step times come from processes run one after another on a shared machine: "
            "compare them only roughly (benchmarks/bench_svi_step.py times steps side by side).",
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="folder for gpu_check_<device>.{json,md}")
    ap.add_argument("--quick", action="store_true", help="small sizes (an MLP for the steps)")
    ap.add_argument("--record", action="store_true", help="also write benchmarks/results/")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="steps: the ImageNet-size configurations at a tiny size (the code, not a timing)",
    )
    ap.add_argument("--budget-s", type=float, default=400.0, help="skip sections after this")
    ap.add_argument(
        "--sections",
        nargs="+",
        default=["surface", "float64", "resume", "evaluate", "ddp", "steps"],
    )
    ap.add_argument(
        "--mnist-root",
        default="data/mnist_subset",
        help="the MNIST subset folder for --sections recipe / uncertainty (not in the default "
        "sections: the full ResNet-20 recipe, 250 + 200 + 200 epochs)",
    )
    ap.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # a child process: CONFIG:CONTENDER[,CONTENDER...]
        config, names = args.one.split(":")
        print(json.dumps(_one_process(config, names.split(","), args.device, args.steps or 3)))
        return
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda but CUDA is not available")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    tag = args.device.split(":")[0]
    payload: dict = {
        "device": args.device,
        "quick": args.quick,
        "smoke": args.smoke,
        "command": "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:]),
        "sections": {},
    }
    if cuda:
        payload["gpu"] = torch.cuda.get_device_name(0)
        payload["gpus"] = torch.cuda.device_count()
    import pyro

    payload["versions"] = {"torch": torch.__version__, "pyro": pyro.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs = {
            "surface": lambda: section_surface(args.device, work, args.quick),
            "float64": lambda: section_float64(args.device, work),
            "resume": lambda: section_resume(args.device, work),
            "evaluate": lambda: section_evaluate(args.device, work),
            "ddp": lambda: section_ddp(args.device, work),
            "steps": lambda: section_steps(args.device, args.quick, deadline, args.smoke),
            "recipe": lambda: section_recipe(args.device, work, args.mnist_root),
            "uncertainty": lambda: section_uncertainty(args.device, work, args.mnist_root),
        }
        for name in args.sections:
            _section(payload, name, runs[name], deadline)
    payload["total_seconds"] = time.perf_counter() - t0
    markdown = _markdown(payload)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        full = {"machine": machine(), **payload}
        (out / f"gpu_check_{tag}.json").write_text(json.dumps(full, indent=2, default=str))
        (out / f"gpu_check_{tag}.md").write_text(markdown)
    if (cuda and not args.smoke) or args.record:
        record(f"gpu_check_{tag}", payload, markdown)
    else:
        print(markdown)
    print(f"total {payload['total_seconds']:.0f} s; results in {args.out or RESULTS}")


if __name__ == "__main__":
    main()
