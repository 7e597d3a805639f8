"""Bounded diagnostics: the budget of draws and examples, ``--no-diagnostics``, a progress
bar on every step, and the results written before the diagnostics start."""

from __future__ import annotations

import json

import pytest
from conftest import SMALL_SHARING

from twodg_pyro import diagnostics as D
from twodg_pyro.cli import main
from twodg_pyro.pipeline import ConfigError, config_from_dict, run
from twodg_pyro.pipeline.outputs.diagnostics_steps import diagnostics_budget
from twodg_pyro.pipeline.settings.config import DiagnosticsConfig

TINY = {
    "methods": ["mean_field", "2dg"],
    "num_samples": 5,
    "progress": False,
    "network": {"hidden": [16]},
    "stage1": {"epochs": 2},
    "sharing": SMALL_SHARING,
    "stage3": {"epochs": 1},
    "diagnostics": {"khat_samples": 30, "max_examples": 300, "min_examples": 50},
}


def test_budget_caps_then_shrinks_the_examples_in_proportion():
    d = DiagnosticsConfig()  # 100 draws for the k-hat, at most 2000 examples, budget 1
    # 10 epochs of 50,000: 100 x 2000 + 30 x (2000 + 2000) = 320,000 passes <= 500,000
    # (an export's draws also run on the k-hat's training examples, for log_p): caps only
    b = diagnostics_budget(d, 30, 50_000, 10_000, 10 * 50_000)
    assert (b["n_train_examples"], b["n_eval_examples"], b["reduced"]) == (2000, 2000, False)
    assert b["diagnostics_passes"] == 320_000
    # 2 epochs: 100,000 allowed, both subsets shrink by 100,000 / 320,000
    b = diagnostics_budget(d, 30, 50_000, 10_000, 2 * 50_000)
    assert (b["n_train_examples"], b["n_eval_examples"], b["reduced"]) == (625, 625, True)
    assert b["diagnostics_passes"] <= 100_000
    # a tiny training: no fewer than min_examples (or the whole set, if smaller)
    b = diagnostics_budget(d, 30, 50_000, 60, 100)
    assert (b["n_train_examples"], b["n_eval_examples"]) == (100, 60)
    # no training to compare with (diagnose): the caps only
    b = diagnostics_budget(d, 30, 1000, 500, None)
    assert (b["n_train_examples"], b["n_eval_examples"], b["reduced"]) == (1000, 500, False)
    # every exported method costs its draws: 100 x 2000 + 3 x 30 x 4000 = 560,000 passes
    b = diagnostics_budget(d, 30, 50_000, 10_000, 20 * 50_000, n_exports=3)
    assert (b["diagnostics_passes"], b["n_exports"], b["reduced"]) == (560_000, 3, False)


def test_block_khats_run_only_within_the_budget():
    d = DiagnosticsConfig()
    # 7 blocks cost 7 x 100 x 2000 = 1,400,000 more: within 20 epochs' 1,000,000? no
    b = diagnostics_budget(d, 30, 50_000, 10_000, 20 * 50_000, khat_blocks=7)
    assert (b["khat_blocks"], b["khat_blocks_run"], b["diagnostics_passes"]) == (7, False, 320_000)
    # 40 epochs: 2,000,000 allowed >= 320,000 + 1,400,000: they run, and count
    b = diagnostics_budget(d, 30, 50_000, 10_000, 40 * 50_000, khat_blocks=7)
    assert (b["khat_blocks_run"], b["diagnostics_passes"]) == (True, 1_720_000)
    # no training to compare with (diagnose): they run
    assert diagnostics_budget(d, 30, 1000, 500, None, khat_blocks=7)["khat_blocks_run"]


def test_diagnostics_settings_are_validated():
    with pytest.raises(ConfigError, match="diagnostics.khat_samples"):
        config_from_dict({"diagnostics": {"khat_samples": 10}})
    with pytest.raises(ConfigError, match="diagnostics.min_examples"):
        config_from_dict({"diagnostics": {"min_examples": 500, "max_examples": 100}})
    with pytest.raises(ConfigError, match="diagnostics.budget"):
        config_from_dict({"diagnostics": {"budget": 0}})


def test_run_holds_diagnostics_to_the_budget_after_writing_results(tmp_path, monkeypatch):
    import twodg_pyro.pipeline.outputs.artifacts as artifacts

    real = artifacts.write_artifacts
    seen = {}

    def check_results_first(art, cfg, out_dir):
        seen["results_written_first"] = (tmp_path / "results.json").is_file()
        return real(art, cfg, out_dir)

    monkeypatch.setattr(artifacts, "write_artifacts", check_results_first)
    run(config_from_dict(TINY), tmp_path)
    assert seen == {"results_written_first": True}
    report = json.loads((tmp_path / "diagnostics.json").read_text())
    budget = report["budget"]
    # 3 epochs (2 + 1) x 1258 examples = 3774 passes < 30 x 300 + 2 x 5 x (300 + 300) =
    # 15,000 (k-hat, and the exports of mean_field and 2dg on the test and, for log_p,
    # the training examples): both subsets shrink by 3774 / 15,000, to 75 examples
    assert budget["train_passes"] == 3 * budget["train_examples_total"] == 3774
    assert budget["n_exports"] == 2
    assert budget["reduced"] and budget["n_train_examples"] == budget["n_eval_examples"] == 75
    assert budget["diagnostics_passes"] <= budget["train_passes"]
    assert report["vi"]["n_examples"] == 75 and report["vi"]["num_samples"] == 30
    # the 2DG guide's 7 block k-hats (2 layers, the outliers, 4 components) do not fit
    assert budget["khat_blocks"] == 7 and not budget["khat_blocks_run"]
    assert "budget" in report["vi"]["blocks"]["skipped"]
    for method in ("mean_field", "2dg"):
        idata = D.load_inference_data(tmp_path / f"inference_data_{method}.nc")
        assert idata.log_likelihood["y"].shape == (1, 5, 75)
        stats = D.group(idata, "sample_stats")  # log_p on the k-hat's training examples
        assert stats.attrs["log_p_data"] == "train_data" and stats.attrs["log_p_examples"] == 75
        # a subset of the test examples: diagnostics.json says so and gives its metrics
        info = report["methods"][method]["inference_data"]
        assert (info["n_examples"], info["n_examples_total"]) == (75, 359)
        assert set(info["metrics_on_exported_examples"]) == {"accuracy", "nll", "ece", "brier"}
    assert report["errors"] == {}


def test_no_diagnostics_writes_results_and_model_only(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "run"
    args = ["train", "--config", str(cfg), "--out", str(out), "--no-diagnostics"]
    assert main(args) == 0
    names = {p.name for p in out.iterdir()}
    assert {
        "results.json",
        "results.md",
        "model_2dg.pt",
        "model_mean_field.pt",
        "diagnostics.json",
    } <= names
    assert not names & {
        "inference_data_2dg.nc",
        "inference_data_mean_field.nc",
        "posterior_summary.csv",
        "elbo_terms.png",
    }
    report = json.loads((out / "diagnostics.json").read_text())
    assert report["skipped"] == "diagnostics.enabled = false"


def test_every_diagnostics_step_shows_a_progress_bar(tmp_path, capsys):
    run(config_from_dict({**TINY, "progress": True}), tmp_path)
    err = capsys.readouterr().err
    for bar in ("diagnostics", "export", "k-hat"):
        assert bar in err, bar
