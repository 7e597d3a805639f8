"""A run checks what it can before training, and keeps what finished when a later method
fails (issue 23): sizes of the 2DG settings against the network's Bayesian weights, and
``results.json`` marked incomplete with the finished methods' model files."""

from __future__ import annotations

import json

import pytest

from twodg_pyro.io import load_model
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.pipeline.methods import deterministic, mean_field
from twodg_pyro.pipeline.outputs.results import format_results, read_results
from twodg_pyro.pipeline.settings.config import ConfigError

#: the tiny run's 64-16-10 MLP: 64 * 16 + 16 + 16 * 10 + 10 Bayesian weights
N_WEIGHTS = 1210


def _no_training(monkeypatch):
    """Make any training step fail loudly: a check that comes after training is a bug."""

    def trained(*a, **k):
        raise AssertionError("training started before the settings were checked")

    monkeypatch.setattr(mean_field, "stage1_mean_field", trained)
    monkeypatch.setattr(deterministic, "train", trained)


@pytest.mark.parametrize(
    "setting, value", [("n_components", 100_000), ("n_components", 3000), ("n_min", 5000)]
)
def test_sizes_larger_than_the_bayesian_weights_fail_before_training(
    tiny_run_config, tmp_path, monkeypatch, setting, value
):
    tiny_run_config["methods"] = ["deterministic", "mean_field", "2dg"]
    tiny_run_config["sharing"][setting] = value
    _no_training(monkeypatch)
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=rf"sharing\.{setting} = {value}: .*{N_WEIGHTS:,}"):
        run(config_from_dict(tiny_run_config), out)
    assert not out.exists()  # nothing written: the folder it made is gone again


def test_sizes_at_the_bound_pass_the_check(tiny_run_config):
    from twodg_pyro.models import MLP
    from twodg_pyro.pipeline.settings.checks import check_sharing_sizes

    cfg = config_from_dict(tiny_run_config).sharing
    net = MLP(64, (16,), 10)
    check_sharing_sizes(type(cfg)(n_components=N_WEIGHTS, n_min=N_WEIGHTS), net)
    with pytest.raises(ConfigError, match="n_components"):
        check_sharing_sizes(type(cfg)(n_components=N_WEIGHTS + 1), net)


def test_overwrite_with_bad_sizes_keeps_the_earlier_run(tiny_run_config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text('{"earlier": true}')
    tiny_run_config["sharing"]["n_components"] = 100_000
    _no_training(monkeypatch)
    with pytest.raises(ConfigError, match="n_components"):
        run(config_from_dict(tiny_run_config), out, overwrite=True)
    assert (out / "results.json").read_text() == '{"earlier": true}'


def test_k_nearest_above_n_components_is_a_settings_error(tiny_run_config):
    tiny_run_config["sharing"]["k_nearest"] = 5  # n_components = 4
    with pytest.raises(ConfigError, match=r"sharing\.k_nearest = 5: .*n_components \(4\)"):
        config_from_dict(tiny_run_config)


def test_a_late_failure_keeps_the_finished_methods(tiny_run_config, tmp_path):
    """K = n_w passes the check, but stage 1's outliers leave fewer inlier points than K:
    stage 2 fails, after the deterministic and mean-field methods have finished."""
    tiny_run_config["methods"] = ["deterministic", "mean_field", "2dg"]
    tiny_run_config["checkpoint_every"] = 0
    tiny_run_config["sharing"].update(n_components=N_WEIGHTS, k_nearest=1, n_min=1)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="larger than the number of inlier points"):
        run(config_from_dict(tiny_run_config), out)
    payload = read_results(out)
    assert payload["complete"] is False
    assert payload["incomplete"]["failed_method"] == "2dg"
    assert "inlier points" in payload["incomplete"]["error"]
    assert [r["method"] for r in payload["records"]] == ["deterministic", "mean_field"]
    assert payload["incomplete"]["finished"] == ["deterministic", "mean_field"]
    model, guide = load_model(out / "model_mean_field.pt")
    assert guide.num_trainable() == 2 * N_WEIGHTS
    assert not (out / "model_2dg.pt").exists()
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    assert diagnostics["skipped"] == "2dg failed"
    md = (out / "results.md").read_text()
    assert md.startswith("**Incomplete run**: method 2dg failed")
    assert md == format_results(payload)


def test_a_finished_run_says_it_is_complete(tiny_run):
    assert read_results(tiny_run)["complete"] is True
