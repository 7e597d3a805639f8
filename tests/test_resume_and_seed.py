"""Pipeline checkpoints: a seed fixes the whole run; a run interrupted in stage 1 or stage 3
(in process, or killed with SIGKILL in a subprocess) and resumed ends with exactly the
results of an uninterrupted run.  Tolerance: exact equality of every field of
results.json except timings (keys ending in ``seconds``), on CPU."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from twodg_pyro.infer.checkpoint import load_checkpoint
from twodg_pyro.pipeline import config_from_dict, run

TINY = {
    "methods": ["deterministic", "mean_field", "2dg"],
    "seed": 5,
    "num_samples": 4,
    "progress": False,
    "checkpoint_every": 2,
    # results.json is what must come out identical; the diagnostics (InferenceData,
    # k-hat, figures: most of a run this small) are not in it, and have tests of their own
    "diagnostics": {"enabled": False},
    "network": {"arch": "mlp", "hidden": [24]},
    "stage1": {"epochs": 6, "deterministic_epochs": 2, "kl_warmup_epochs": 3},
    "sharing": {
        "outlier_rule": "quantile",
        "mu_quantile": 0.99,
        "grad_percentile": 0.005,
        "n_components": 8,
        "n_min": 10,
    },
    "stage3": {
        "epochs": 6,
        "tying": "stochastic",
        "lr_centre": 1e-2,
        "lr_outlier": 1e-2,
        "lr_cov": 1e-2,
        "merge_every": 2,
        "reassign_every": 3,
    },
}


def without_timings(obj):
    """results.json minus timing fields (keys ending in 'seconds')."""
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items() if not k.endswith("seconds")}
    if isinstance(obj, list):
        return [without_timings(v) for v in obj]
    return obj


def results(run_dir) -> dict:
    return without_timings(json.loads((Path(run_dir) / "results.json").read_text()))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    run(config_from_dict(TINY), out)
    return out


def test_same_seed_gives_identical_results_json(reference, tmp_path):
    run(config_from_dict(TINY), tmp_path)
    assert results(tmp_path) == results(reference)
    # and the seed matters
    run(config_from_dict({**TINY, "seed": 6, "methods": ["mean_field"]}), tmp_path / "s6")
    mf = [r for r in results(reference)["records"] if r["method"] == "mean_field"][0]
    assert results(tmp_path / "s6")["records"][0]["nll"] != mf["nll"]


@pytest.mark.parametrize("stage, at", [("stage1", 2), ("stage3", 2), ("stage3", 6)])
def test_interrupted_run_resumes_to_identical_results(
    reference, tmp_path, interrupt_after, stage, at
):
    """Interrupted right after the stage's checkpoint of epoch ``at`` (6: stage 3 complete,
    interrupted during the final prediction)."""
    interrupt_after(stage, at)
    with pytest.raises(KeyboardInterrupt):
        run(config_from_dict(TINY), tmp_path)
    interrupt_after(None)
    assert not (tmp_path / "results.json").exists()
    assert load_checkpoint(tmp_path / "checkpoints" / f"{stage}.pt").epoch == at
    art = run(config_from_dict(TINY), tmp_path, resume=True)
    assert results(tmp_path) == results(reference)
    assert art.trained.get("mean_field") is not None


def test_resume_refuses_other_settings(reference, tmp_path):
    import shutil

    from twodg_pyro.pipeline import ConfigError

    shutil.copytree(reference, tmp_path / "r")
    before = (tmp_path / "r" / "results.json").read_bytes()
    with pytest.raises(ConfigError, match=r"stage3.epochs: 6 \(checkpoint\) vs 7 \(given\)"):
        run(
            config_from_dict({**TINY, "stage3": {**TINY["stage3"], "epochs": 7}}),
            tmp_path / "r",
            True,
        )
    assert (tmp_path / "r" / "results.json").read_bytes() == before


# ---------------------------------------------------------------------- SIGKILL
def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "twodg_pyro.cli", *args]


def _write_config(path: Path, stage3_epochs: int = 40) -> Path:
    cfg = {**TINY, "checkpoint_every": 1, "stage3": {**TINY["stage3"], "epochs": stage3_epochs}}
    cfg["stage1"] = {**TINY["stage1"], "epochs": 20}
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["stage3", "stage1"])
def test_sigkill_during_a_stage_then_resume_matches_uninterrupted(tmp_path, stage):
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cfg = _write_config(tmp_path / "cfg.json")
    ref = tmp_path / "ref"
    subprocess.run(_cli("train", "--config", str(cfg), "--out", str(ref)), check=True, env=env)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _cli("train", "--config", str(cfg), "--out", str(killed)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    target = killed / "checkpoints" / f"{stage}.pt"
    deadline = time.monotonic() + 900
    try:
        while not target.exists():
            assert proc.poll() is None, "the run ended before a checkpoint of the stage appeared"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (killed / "results.json").exists()
    # nothing half-written: every checkpoint file under its final name loads
    for f in (killed / "checkpoints").glob("*.pt"):
        load_checkpoint(f)
    c = load_checkpoint(target)
    assert c.stage == stage and not c.complete

    subprocess.run(_cli("train", "--resume", str(killed)), check=True, env=env)
    assert results(killed) == results(ref)
    assert not list((killed / "checkpoints").glob(".*.tmp"))
