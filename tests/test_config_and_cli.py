import json
import re

import pytest

from twodg_pyro.cli import main
from twodg_pyro.pipeline import ConfigError, RunConfig, config_from_dict, load_config


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) stage1.epoch\b"):
        config_from_dict({"stage1": {"epoch": 3}})
    p = tmp_path / "c.toml"
    p.write_text("[sharing]\ntau_w = -1.0\n")
    with pytest.raises(ConfigError, match=r"sharing.tau_w = -1.0"):
        load_config(p)


def test_config_round_trip_and_types(tmp_path):
    cfg = config_from_dict({"seed": 3, "sharing": {"tau_g": "inf", "n_components": 8}})
    assert cfg.seed == 3 and cfg.sharing.n_components == 8
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cfg.to_dict()))
    assert load_config(p) == cfg
    with pytest.raises(ConfigError, match="num_samples = 0"):
        RunConfig(num_samples=0)
    with pytest.raises(ConfigError, match="stage1.epochs must be an integer"):
        config_from_dict({"stage1": {"epochs": "ten"}})


def test_booleans_are_not_numbers_in_settings_built_directly():
    from twodg_pyro.pipeline.config import PriorConfig, Stage1Config

    with pytest.raises(ConfigError, match=r"stage1.epochs = True: must be an integer >= 0"):
        Stage1Config(epochs=True)
    with pytest.raises(ConfigError, match=r"prior.scale = True: must be a positive number"):
        PriorConfig(scale=True)


@pytest.mark.parametrize(
    "section, kwargs, named",
    [
        ("SharingConfig", {"gmm_max_iter": -1}, "sharing.gmm_max_iter = -1"),
        ("SharingConfig", {"gmm_batch_size": 0}, "sharing.gmm_batch_size = 0"),
        ("SharingConfig", {"gmm_batch_size": True}, "sharing.gmm_batch_size = True"),
        ("SharingConfig", {"mu_quantile": "0.9"}, "sharing.mu_quantile = '0.9'"),
        ("SharingConfig", {"tau_g": float("nan")}, "sharing.tau_g = nan"),
        ("SharingConfig", {"use_merging": "yes"}, "sharing.use_merging = 'yes'"),
        ("NetworkConfig", {"hidden": [True]}, "network.hidden = [True]"),
        ("NetworkConfig", {"hidden": 128}, "network.hidden = 128"),
        ("DataConfig", {"batch_size": True}, "data.batch_size = True"),
        ("DataConfig", {"root": 3}, "data.root = 3"),
        ("SSVIConfig", {"move_fraction": True}, "ssvi.move_fraction = True"),
        ("RunConfig", {"device": 5}, "device = 5"),
        ("RunConfig", {"device": "cuda:x"}, "device = 'cuda:x'"),
        ("RunConfig", {"progress": "no"}, "progress = 'no'"),
        ("RunConfig", {"sharing": {"n_components": 3}}, "sharing = {'n_components': 3}"),
        ("DataConfig", {"augment": 1}, "data.augment = 1"),
        ("PriorConfig", {"delta": True}, "prior.delta = True"),
        ("Stage1Config", {"deterministic_milestones": 5}, "stage1.deterministic_milestones = 5"),
        ("DiagnosticsConfig", {"enabled": "no"}, "diagnostics.enabled = 'no'"),
    ],
)
def test_every_setting_is_checked_when_built_directly(section, kwargs, named):
    """Every field, stage 2's included, is validated when the settings are built."""
    from twodg_pyro.pipeline import config as config_mod

    with pytest.raises(ConfigError, match=re.escape(named)):
        getattr(config_mod, section)(**kwargs)


def test_cli_reports_config_errors(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text("bogus = 1\n")
    assert main(["train", "--config", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "unknown setting(s) bogus" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
