"""Bad inputs across settings, data and files: each case asserts an error that names the
bad value, and that nothing on disk was overwritten (a run folder with results, a model
file and checkpoints keeps every byte)."""

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from twodg_pyro.bnn import BNNModel
from twodg_pyro.cli import main
from twodg_pyro.data import DatasetNotFoundError, DataSplit, make_loader
from twodg_pyro.files.integrity import seal
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import fit
from twodg_pyro.infer.checkpoint import Checkpoint, load_checkpoint, restore_state
from twodg_pyro.io import load_2dg
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.pipeline.runtime import runner as runner_mod


# ---------------------------------------------------------------------- fixtures
def _small(hidden=8):
    net = MLP(64, (hidden,), 10)
    model = BNNModel(net, prior=1.0, likelihood=Categorical(100))
    return model, MeanFieldGuide(model)


@pytest.fixture
def run_dir(tmp_path, digits):
    """A finished run: results, a (checkpoint-format) model file and checkpoints."""
    d = tmp_path / "run"
    (d / "checkpoints").mkdir(parents=True)
    (d / "results.json").write_text('{"schema": 1, "records": [{"method": "old"}]}')
    (d / "results.md").write_text("| method |\n|---|\n| old |\n")
    model, guide = _small()
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    cfg = config_from_dict({"checkpoint_every": 1, "methods": ["mean_field"]})
    (d / "checkpoints" / "config.json").write_text(json.dumps(cfg.to_dict()))
    ck = Checkpoint(d / "checkpoints" / "stage1.pt", stage="stage1", generators=[loader])
    fit(model, guide, loader, 1, 1e-2, callbacks=[ck], progress=False)
    (d / "model.pt").write_bytes((d / "checkpoints" / "stage1.pt").read_bytes())
    return d


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def unchanged(run_dir):
    """Asserts, after the test body, that no file under the run folder changed."""
    before = snapshot(run_dir)
    yield run_dir
    assert snapshot(run_dir) == before


# ---------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "toml, named",
    [
        ("[sharing]\nn_components = 0\n", "sharing.n_components = 0"),  # K < 1
        ("[sharing]\ntau_w = -0.5\n", "sharing.tau_w = -0.5"),  # tau out of range
        ("[sharing]\nmu_quantile = 1.5\n", "sharing.mu_quantile = 1.5"),
        ("[sharing]\nmahalanobis_threshold = 0.0\n", "sharing.mahalanobis_threshold = 0.0"),
        ("[stage1]\nlr_loc = -0.01\n", "stage1.lr_loc = -0.01"),  # negative learning rate
        ("num_samples = 0\n", "num_samples = 0"),  # N_s < 1
        ('[stage3]\ntying = "shared"\n', "stage3.tying = 'shared'"),  # unknown tying
        ("bogus = 1\n", "unknown setting(s) bogus"),  # unknown config key
        ("checkpoint_every = -1\n", "checkpoint_every = -1"),
        ('[data]\nname = "svhn"\n', "data.name = 'svhn'"),
        # stage 2's settings, checked when the config is built (not after stage 1)
        ("[sharing]\ngmm_max_iter = -1\n", "sharing.gmm_max_iter = -1: must be an integer >= 1"),
        ("[sharing]\ngmm_batch_size = -5\n", "sharing.gmm_batch_size = -5: must be an integer"),
        ("[sharing]\nk_nearest = 0\n", "sharing.k_nearest = 0"),
        ('[sharing]\ntau_d = "big"\n', "sharing.tau_d must be a number, got 'big'"),
        ("[sharing]\nuse_ellipses = 1\n", "sharing.use_ellipses must be true or false"),
        ("[network]\nhidden = [true]\n", "network.hidden = [True]: must be a list of positive"),
        ('[network]\narch = "resnet7"\n', "network.arch = 'resnet7': must be one of"),
        ("device = 5\n", "device = 5: must be 'cpu', 'cuda' or 'cuda:<index>'"),
        ('device = "cudafoo"\n', "device = 'cudafoo'"),
        ('methods = ["2dg", "2dg"]\n', "names a method twice"),
        ("seed = 1.5\n", "seed must be an integer, got 1.5"),
        ("[ssvi]\nupdate_every = true\n", "ssvi.update_every must be an integer, got True"),
        ("[data]\nval_fraction = 0.5\ntest_fraction = 0.5\n", "nothing would be left to train"),
        ("", "sets nothing: an empty config would silently run the library defaults"),
        ("# comments only\n", "sets nothing"),
        ('preset = "cifar"\n', "preset = 'cifar': must be one of ['cifar10-resnet18'"),
    ],
)
def test_bad_setting_is_named_and_nothing_is_written(unchanged, tmp_path, capsys, toml, named):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml)
    assert main(["train", "--config", str(cfg), "--out", str(unchanged), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1 and err.startswith("twodg-pyro train: error:")


def test_preset_key_starts_from_the_main_jobs_settings(tmp_path):
    from twodg_pyro.pipeline import ConfigError, load_config

    cfg = tmp_path / "p.toml"
    cfg.write_text('preset = "digits"\nseed = 3\n[stage3]\nepochs = 5\n')
    c = load_config(cfg)
    assert (c.seed, c.stage3.epochs, c.stage3.lr_centre) == (3, 5, 1e-2)  # file over preset
    assert c.sharing.n_components == 32 and c.stage1.epochs == 150
    assert c.sharing.outlier_rule == "quantile"
    # with a base (train --preset NAME --config FILE) an empty file runs the base
    from twodg_pyro.pipeline.settings.presets import preset

    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing\n")
    assert load_config(empty, base=preset("digits")).sharing.n_components == 32
    with pytest.raises(ConfigError, match="says preset = 'digits', another preset was given"):
        load_config(cfg, base=preset("mnist-lenet5"))


def test_unreadable_config_files_are_named(tmp_path, capsys):
    garbage = tmp_path / "garbage.toml"
    garbage.write_bytes(bytes(range(256)) * 4)
    nul = tmp_path / "nul.json"
    nul.write_bytes(b'{"seed": 1}\x00\x00')
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    for path, named in (
        (garbage, "is not a text file (byte 0x80 at offset 128 is not UTF-8)"),
        (nul, "is not a text file (it holds NUL bytes)"),
        (folder, "is a folder, not a file"),
        (tmp_path / "none.toml", "does not exist"),
        (tmp_path / "c.ini", "does not exist"),
    ):
        assert main(["train", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert f"config file {str(path)!r} {named}" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


_DEEP = 100_000  # levels (issue 33: JSON this deep was "RecursionError", exit 1)


@pytest.mark.parametrize(
    "name, text, nesting",
    [
        ("arrays.json", "[" * _DEEP + "]" * _DEEP, "past Python's recursion limit"),
        ("objects.json", '{"a": ' * _DEEP + "1" + "}" * _DEEP, "past Python's recursion limit"),
        # PyYAML's flow sequences take 15 s at 100,000 levels; 10,000 are past the limit too
        ("flow.yaml", "seed: " + "[" * 10_000 + "]" * 10_000, "past Python's recursion limit"),
        ("mapping.yml", "a: " + "{a: " * _DEEP + "1" + "}" * _DEEP, "recursion limit"),
        ("arrays.toml", "seed = " + "[" * _DEEP + "]" * _DEEP, "past Python's recursion limit"),
        ("inline.toml", "a = " + "{a = " * _DEEP + "1" + "}" * _DEEP, "recursion limit"),
        # parsed in time quadratic in its parts (minutes), so refused before parsing
        ("dotted.toml", "seed = 1\nstage1." + "a." * _DEEP + "b = 1\n", "dotted key"),
        ("header.toml", "[" + "a." * 20 + "b]\nx = 1\n", "more than 16 parts on line 1"),
        # parseable, but deeper than any setting: the path down is named
        ("lists.json", '{"network": {"hidden": ' + "[" * 20 + "]" * 20 + "}}", "22 levels"),
    ],
)
def test_a_config_file_nested_too_deeply_is_one_line(tmp_path, capsys, name, text, nesting):
    path = tmp_path / name
    path.write_text(text)
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RecursionError" not in err and "unexpected" not in err
    assert f"config file {str(path)!r} is nested too deeply (" in err
    assert nesting in err and "at most 16 levels deep" in err
    assert not (tmp_path / "out").exists()


def test_the_nesting_of_a_config_file_is_measured_without_recursion():
    from twodg_pyro.pipeline.settings.config import MAX_NESTING, _nesting

    deep: list = []
    node = deep
    for _ in range(50_000):  # far past the recursion limit
        node.append([])
        node = node[0]
    assert _nesting(deep)[0] == 50_001
    shared = {"x": [1]}  # a YAML alias: one object under two keys, counted once
    assert _nesting({"a": shared, "b": {"c": shared}}) == (4, "b.c.x")
    assert _nesting({"seed": 1}) == (1, "") and _nesting(3) == (0, "")
    assert _nesting({"network": {"hidden": [128]}})[0] == 3 <= MAX_NESTING


def test_missing_data_folder_is_named(unchanged, tmp_path, capsys):
    """Even with --overwrite the earlier run stays: the data are checked first."""
    missing = tmp_path / "no_such_folder"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'methods = ["mean_field"]\n[data]\nname = "cifar10"\nroot = "{missing}"\n')
    argv = ["train", "--config", str(cfg), "--out", str(unchanged), "--no-progress"]
    assert main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "CIFAR-10 data set not found" in err and str(missing) in err
    with pytest.raises(DatasetNotFoundError):
        run(
            config_from_dict({"data": {"name": "cifar10", "root": str(missing)}}),
            unchanged,
            overwrite=True,
        )


# ---------------------------------------------------------------------- data
def _split(x, y, input_shape=(64,)):
    ds = TensorDataset(x, y)
    return DataSplit(ds, TensorDataset(x[:0], y[:0]), ds, 10, input_shape, "synthetic")


def _bad_data_run(monkeypatch, run_dir, split):
    monkeypatch.setattr(runner_mod, "load_data", lambda cfg, image: split)
    cfg = config_from_dict({"methods": ["mean_field"], "checkpoint_every": 1, "progress": False})
    run(cfg, run_dir, overwrite=True)  # the data are checked before anything is removed


def test_nan_in_data_is_named_before_training(unchanged, monkeypatch):
    x, y = torch.randn(50, 64), torch.randint(0, 10, (50,))
    x[17, 3] = float("nan")
    with pytest.raises(
        ValueError, match=r"train inputs hold 1 non-finite value\(s\) \(nan first, in example 17"
    ):
        _bad_data_run(monkeypatch, unchanged, _split(x, y))


def test_label_out_of_range_is_named_before_training(unchanged, monkeypatch):
    x, y = torch.randn(50, 64), torch.randint(0, 10, (50,))
    y[5] = 12
    with pytest.raises(ValueError, match=r"train label 12 at example 5 is out of range \[0, 10\)"):
        _bad_data_run(monkeypatch, unchanged, _split(x, y))


def test_wrong_input_shape_is_named_before_training(unchanged, monkeypatch):
    x, y = torch.randn(50, 63), torch.randint(0, 10, (50,))
    with pytest.raises(
        ValueError, match=r"shape \(63,\) per example, the split declares input shape \(64,\)"
    ):
        _bad_data_run(monkeypatch, unchanged, _split(x, y))


def test_labels_of_file_backed_splits_are_checked_before_training(unchanged, monkeypatch):
    """train/val of the image data sets are Subsets of a data set with ``targets``."""
    from torch.utils.data import Dataset, Subset

    class Files(Dataset):  # stands for a torchvision data set: labels known without images
        def __init__(self, targets):
            self.targets = targets

        def __len__(self):
            return len(self.targets)

        def __getitem__(self, i):
            return torch.zeros(64), self.targets[i]

    full = Files([i % 10 for i in range(40)])
    full.targets[33] = 200
    ok = Files([i % 10 for i in range(10)])
    split = DataSplit(Subset(full, list(range(30, 40))), Subset(full, [0]), ok, 10, (64,), "files")
    with pytest.raises(ValueError, match=r"train label 200 at example 3 is out of range \[0, 10\)"):
        _bad_data_run(monkeypatch, unchanged, split)


def test_empty_data_set_is_named(unchanged, monkeypatch):
    x, y = torch.randn(0, 64), torch.zeros(0, dtype=torch.long)
    with pytest.raises(ValueError, match="train set of 'synthetic' is empty"):
        _bad_data_run(monkeypatch, unchanged, _split(x, y))
    model, guide = _small()
    with pytest.raises(ValueError, match="no minibatches in epoch 0: the data set is empty"):
        fit(model, guide, [], 1, 1e-2, progress=False)


def test_fit_names_a_label_out_of_range_and_a_wrong_input_shape(unchanged):
    model, guide = _small()
    ck = Checkpoint(unchanged / "checkpoints" / "stage1.pt")  # would overwrite if reached
    bad_y = [(torch.randn(8, 64), torch.tensor([0, 1, 2, 10, 3, 4, 5, 6]))]
    with pytest.raises(ValueError, match=r"class label 10 at example 3 is out of range \[0, 10\)"):
        fit(model, guide, bad_y, 1, 1e-2, callbacks=[ck], progress=False)
    bad_x = [(torch.randn(8, 63), torch.zeros(8, dtype=torch.long))]
    with pytest.raises(ValueError, match=r"input of shape \(8, 63\) does not fit the network MLP"):
        fit(model, guide, bad_x, 1, 1e-2, callbacks=[ck], progress=False)
    float_y = [(torch.randn(8, 64), torch.zeros(8))]
    with pytest.raises(ValueError, match="class labels must be integers, got dtype torch.float32"):
        fit(model, guide, float_y, 1, 1e-2, callbacks=[ck], progress=False)


# ---------------------------------------------------------------------- files
class _Payload:
    """Unpickling this creates ``marker`` (stands for any code a pickle could run)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_payload_in_a_model_file_runs_no_code(unchanged, tmp_path):
    marker = tmp_path / "pwned"
    # the payload is real: unrestricted unpickling would create the marker
    pickle.loads(pickle.dumps(_Payload(tmp_path / "control")))
    assert (tmp_path / "control").exists()
    for name, write in (
        ("zip.pt", lambda p: torch.save({"header": _Payload(marker)}, p)),
        ("raw.pkl", lambda p: p.write_bytes(pickle.dumps({"header": _Payload(marker)}))),
    ):
        path = tmp_path / name
        write(path)
        with pytest.raises(ValueError, match="holds objects other than plain tensors"):
            load_2dg(path, net=nn.Linear(3, 2))
        with pytest.raises(ValueError, match="holds objects other than plain tensors"):
            load_checkpoint(path)
        assert not marker.exists()


def test_truncated_checkpoint_on_resume_is_named(unchanged, capsys):
    stage1 = unchanged / "checkpoints" / "stage1.pt"
    data = stage1.read_bytes()
    stage1.write_bytes(data[: len(data) // 3])
    before = snapshot(unchanged)
    assert main(["train", "--resume", str(unchanged), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(stage1) in err and "truncated, corrupted" in err
    assert snapshot(unchanged) == before
    stage1.write_bytes(data)  # restore for the fixture's final check


def test_corrupted_and_foreign_files_are_clear_errors(unchanged, tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match="junk.pt' is not a readable twodg_pyro file"):
        load_checkpoint(junk)
    text = tmp_path / "notes.pt"
    text.write_text("hello world")
    with pytest.raises(ValueError, match="notes.pt' is not a readable twodg_pyro file"):
        load_checkpoint(text)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="it is empty"):
        load_2dg(empty, net=nn.Linear(3, 2))
    foreign = tmp_path / "state_dict.pt"
    torch.save(nn.Linear(3, 2).state_dict(), foreign)  # a valid torch file, not ours
    with pytest.raises(ValueError, match="is not a twodg_pyro checkpoint"):
        load_checkpoint(foreign)
    with pytest.raises(ValueError, match="is not a 2DG BNN file|not a twodg_pyro model file"):
        load_2dg(unchanged / "model.pt", net=nn.Linear(3, 2))  # a checkpoint, not a model


def test_checkpoint_of_another_format_version_is_named(unchanged, tmp_path):
    payload = torch.load(unchanged / "checkpoints" / "stage1.pt", weights_only=True)
    header = json.loads(payload["header"])
    header["format_version"] = 99
    payload["header"] = json.dumps(header)
    torch.save(seal(payload), tmp_path / "v99.pt")  # a consistent file of a future version
    with pytest.raises(ValueError, match="checkpoint format version 99"):
        load_checkpoint(tmp_path / "v99.pt")


def test_checkpoint_from_another_network_is_named(unchanged, digits):
    other, guide = _small(hidden=9)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    named = r"another network: 4 Bayesian sites with 610 weights.*this network has 4 sites with 685"
    with pytest.raises(ValueError, match=named):
        restore_state(
            unchanged / "checkpoints" / "stage1.pt", other, guide, 1e-2, generators=[loader]
        )


def test_resume_without_checkpoints_is_named(tmp_path, capsys):
    empty = tmp_path / "fresh"
    empty.mkdir()
    (empty / "results.json").write_text("{}")
    assert main(["train", "--resume", str(empty)]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert (empty / "results.json").read_text() == "{}"
    assert not (empty / "checkpoints").exists()


def test_resume_with_other_settings_is_named(unchanged, tmp_path, capsys):
    cfg = tmp_path / "other.toml"
    cfg.write_text('methods = ["mean_field"]\ncheckpoint_every = 1\nseed = 4\n')
    assert main(["train", "--config", str(cfg), "--resume", str(unchanged)]) == 2
    assert "seed: 0 (checkpoint) vs 4 (given)" in capsys.readouterr().err
