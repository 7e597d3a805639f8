import json
import re

import pytest

from twodg_pyro.cli import main
from twodg_pyro.cli_parser import build_parser
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
    # a section of the wrong type is named, not an AttributeError of a later check
    with pytest.raises(ConfigError, match="data = 'x': must be a DataConfig"):
        RunConfig(data="x")
    with pytest.raises(ConfigError, match="stage1.epochs must be an integer"):
        config_from_dict({"stage1": {"epochs": "ten"}})


def test_booleans_are_not_numbers_in_settings_built_directly():
    from twodg_pyro.pipeline.settings.config import PriorConfig, Stage1Config

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
    from twodg_pyro.pipeline.settings import config as config_mod

    with pytest.raises(ConfigError, match=re.escape(named)):
        getattr(config_mod, section)(**kwargs)


def test_cli_reports_config_errors(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text("bogus = 1\n")
    assert main(["train", "--config", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "unknown setting(s) bogus" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["run", "train"])
def test_help_names_every_preset_of_the_registry(command, capsys, monkeypatch):
    """Issue 33: the help listed five presets and missed ``mnist-lenet5-bayes``; the list
    now comes from ``PRESETS``, and a name stays whole on an 80-column terminal."""
    from twodg_pyro.pipeline.settings.presets import PRESETS

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert len(PRESETS) >= 6 and "mnist-lenet5-bayes" in PRESETS
    words = set(re.findall(r"[\w-]+", out))
    missing = [name for name in PRESETS if name not in words]
    assert not missing, (missing, out)
    assert max(len(line) for line in out.splitlines()) <= 80


def test_help_is_fast_it_imports_no_torch():
    """The preset list of the help comes from a registry that imports no torch."""
    import subprocess
    import sys

    code = (
        "import sys; from twodg_pyro.cli_parser import build_parser; build_parser(); "
        "print('torch' in sys.modules, 'twodg_pyro.pipeline.settings.config' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_an_unknown_preset_on_the_command_line_is_named(capsys):
    assert main(["train", "--preset", "mnist-lenet6", "--out", "unused", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'mnist-lenet6'" in err and "mnist-lenet5-bayes" in err
    assert err.count("\n") == 1


def test_the_cli_guide_names_every_preset():
    from pathlib import Path

    from twodg_pyro.pipeline.settings.presets import PRESETS

    guide = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    assert [name for name in PRESETS if f"`{name}`" not in guide] == []
