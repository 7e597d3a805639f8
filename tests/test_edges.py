"""Edges of the command line, the config file and the file writer (issue 23): each bad
input is one line on stderr naming the value, exit code 2, checked before any work; a
full disk is said as such and leaves no half-written file."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

import pytest
import torch
from test_cli_errors import one_line  # the CLI's one-line check

from twodg_pyro.cli import main
from twodg_pyro.files import atomic as files
from twodg_pyro.files.atomic import NoSpaceError, atomic_torch_save, atomic_write, atomic_write_text
from twodg_pyro.pipeline import ConfigError, config_from_dict, load_config
from twodg_pyro.pipeline.outputs.results import format_table


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*.tmp"))


# ---------------------------------------------------------------------- a full disk
TORCH_FULL = RuntimeError(
    "[enforce fail at inline_container.cc:672] . unexpected pos 40576 vs 40456"
)


@pytest.mark.parametrize(
    "failure",
    [OSError(errno.ENOSPC, "No space left on device"), TORCH_FULL],
    ids=["ENOSPC", "torch-unexpected-pos"],
)
def test_a_full_disk_in_torch_save_keeps_the_old_file(tmp_path, monkeypatch, failure):
    path = tmp_path / "model.pt"
    atomic_torch_save({"w": torch.ones(3)}, path)
    before = path.read_bytes()
    real = torch.save

    def full(obj, f, *args, **kwargs):  # half the file, then the disk is full
        real(obj, f, *args, **kwargs)
        raise failure

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(NoSpaceError) as info:
        atomic_torch_save({"w": torch.zeros(1000)}, path)
    assert str(info.value) == f"no space left on device (writing {path})"
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_a_full_disk_in_any_writer_is_named(tmp_path):
    path = tmp_path / "results.md"
    atomic_write_text(path, "old")

    def write(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(NoSpaceError, match=r"no space left on device \(writing .*results.md\)"):
        atomic_write(path, write)
    assert path.read_text() == "old" and _leftovers(tmp_path) == []
    # another failure is not a full disk: raised as it is, the temporary file removed
    with pytest.raises(PermissionError):
        atomic_write(path, lambda tmp: (_ for _ in ()).throw(PermissionError("no")))
    assert path.read_text() == "old" and _leftovers(tmp_path) == []


def test_a_size_hint_larger_than_the_free_space_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_free_bytes", lambda folder: 1000)
    called = []
    with pytest.raises(NoSpaceError, match="needs about 5,000 bytes, 1,000 free"):
        atomic_write(tmp_path / "x.nc", called.append, size_hint=5000)
    assert called == [] and list(tmp_path.iterdir()) == []


def test_an_inference_data_file_is_not_started_on_a_too_full_disk(tmp_path, monkeypatch):
    """h5py crashes the process when the disk fills mid-write: the netCDF writer refuses
    first when the free space cannot hold the tree's data (and writes nothing)."""
    import numpy as np

    from twodg_pyro import diagnostics as D
    from twodg_pyro.diagnostics import _arviz as A

    tree = A.build_tree({"posterior": {"w": np.zeros((1, 10, 1000))}}, {"posterior"}, {}, {}, {})
    monkeypatch.setattr(files, "_free_bytes", lambda folder: 50_000)
    with pytest.raises(NoSpaceError, match=r"needs about [\d,]+ bytes, 50,000 free"):
        D.save_inference_data(tree, tmp_path / "idata.nc")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(files, "_free_bytes", lambda folder: 10**9)
    D.save_inference_data(tree, tmp_path / "idata.nc")
    assert A.group(D.load_inference_data(tmp_path / "idata.nc"), "posterior")["w"].shape == (
        1,
        10,
        1000,
    )


def test_a_writer_refuses_a_folder_or_a_device(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError, match=r"'.*d' is a folder"):
        atomic_write_text(tmp_path / "d", "x")
    fifo = tmp_path / "fifo"  # like a device: not a file to replace
    os.mkfifo(fifo)
    with pytest.raises(OSError, match=r"'.*fifo' is not a regular file"):
        atomic_write_text(fifo, "x")
    assert fifo.is_fifo()
    assert _leftovers(tmp_path) == []


@pytest.fixture
def config(tmp_path, tiny_run_config) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny_run_config))
    return path


def test_train_on_a_full_disk_is_one_line(tmp_path, capsys, config, monkeypatch):
    """The first checkpoint (stage 1, epoch 1) finds the disk full."""

    def full(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    out = tmp_path / "o"
    line = one_line(
        capsys,
        2,
        ["train", "--config", str(config), "--out", str(out)],
        "no space left on device (writing ",
        str(out / "checkpoints" / "stage1.pt"),
    )
    assert "Errno" not in line
    assert _leftovers(out) == [] and not (out / "checkpoints" / "stage1.pt").exists()


def test_a_model_file_lost_to_a_full_disk_makes_the_run_incomplete(
    tmp_path, capsys, config, monkeypatch
):
    """Every method trains, then ``model_2dg.pt`` finds the disk full: the run is not a
    success (exit 2, one line naming the file, no warnings), ``results.json`` says
    ``"complete": false`` naming it, the files that fit are written, no half file."""
    save = files._torch_save

    def full_for_2dg(obj, tmp):
        if Path(tmp).name.startswith(".model_2dg.pt."):
            with open(tmp, "wb") as f:
                f.write(b"PK\x03\x04 half a file")
            raise OSError(errno.ENOSPC, "No space left on device")
        save(obj, tmp)

    monkeypatch.setattr(files, "_torch_save", full_for_2dg)
    out = tmp_path / "o"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "warning" not in err, err
    assert f"no space left on device (writing {out / 'model_2dg.pt'})" in err
    assert f"the run is incomplete ({out / 'results.json'} says so" in err
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is False
    assert list(results["incomplete"]["failed_files"]) == ["model_2dg"]
    assert results["incomplete"]["finished"] == ["mean_field", "2dg"]
    assert "model file(s) model_2dg could not be written" in (out / "results.md").read_text()
    assert not (out / "model_2dg.pt").exists() and _leftovers(out) == []
    assert (out / "model_mean_field.pt").is_file() and (out / "model_2dg.2dgz").is_file()
    report = json.loads((out / "diagnostics.json").read_text())
    assert "model_2dg" in report["errors"] and "skipped" in report


# ---------------------------------------------------------------------- export, diagnose, evaluate
def test_export_to_a_folder_is_refused_before_any_work(tiny_run, tmp_path, capsys, monkeypatch):
    from twodg_pyro.io import compact

    def never(*a, **k):
        raise AssertionError("the export ran")

    monkeypatch.setattr(compact, "export_compact_file", never)
    (tmp_path / "d").mkdir()
    one_line(
        capsys,
        2,
        ["export", str(tiny_run), "--out", str(tmp_path / "d")],
        f"--out {str(tmp_path / 'd')!r} is a folder",
    )
    os.mkfifo(tmp_path / "fifo")
    one_line(capsys, 2, ["export", str(tiny_run), "--out", str(tmp_path / "fifo")], "not a regular")
    assert (tmp_path / "fifo").is_fifo()


@pytest.mark.parametrize(
    "flag, value, named",
    [
        (
            "--outlier-sigma-bits",
            "0",
            "argument --outlier-sigma-bits: 0: must be an integer in [1, 16]",
        ),
        ("--outlier-sigma-bits", "17", "argument --outlier-sigma-bits: 17"),
        ("--alpha-bits", "1", "argument --alpha-bits: 1: must be an integer in [2, 16]"),
        ("--outlier-mu-bits", "12", "argument --outlier-mu-bits: invalid choice: 12"),
        ("--alpha-bits", "x", "argument --alpha-bits: 'x' is not an integer"),
    ],
)
def test_export_bit_widths_are_checked_by_the_parser(tmp_path, capsys, flag, value, named):
    one_line(capsys, 2, ["export", str(tmp_path), flag, value], named)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--khat-samples", "10"], "--khat-samples 10: must be >= 30"),
        (["--khat-samples", "24"], "--khat-samples 24"),
        (["--khat-components", "-1"], "--khat-components -1: must be >= 0"),
        (["--num-samples", "1"], "--num-samples 1: must be >= 2 (PSIS-LOO"),
        (["--max-examples", str(10**20)], f"--max-examples {10**20}: must be below 2**63"),
        (["--seed", "-1"], "--seed = -1"),
        (["--seed", str(10**20)], f"--seed = {10**20}"),
    ],
)
def test_diagnose_flags_are_checked_on_entry(tmp_path, capsys, monkeypatch, argv, named):
    from twodg_pyro.pipeline.outputs import saved_models

    def never(*a, **k):
        raise AssertionError("the diagnostics ran")

    monkeypatch.setattr(saved_models, "diagnose_model_file", never)
    out = tmp_path / "d"
    one_line(capsys, 2, ["diagnose", str(tmp_path / "m.pt"), "--out", str(out), *argv], named)
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, named",
    [
        *((["--seed", s], f"--seed = {s}") for s in ("-1", str(2**32), str(10**20))),
        (["--num-samples", str(10**20)], f"--num-samples {10**20}: must be below 2**63"),
    ],
)
def test_evaluate_flags_are_checked_on_entry(tmp_path, capsys, monkeypatch, argv, named):
    from twodg_pyro.pipeline.outputs import saved_models

    monkeypatch.setattr(saved_models, "evaluate_model_file", lambda *a, **k: 1 / 0)
    one_line(capsys, 2, ["evaluate", str(tmp_path / "m.pt"), *argv], named)


def test_evaluate_a_run_folder_evaluates_each_model_file(tiny_run, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["evaluate", str(tiny_run), "--num-samples", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads(out.read_text())
    assert sorted(metrics) == ["model_2dg.2dgz", "model_2dg.pt", "model_mean_field.pt"]
    for name, m in metrics.items():
        assert 0 <= m["accuracy"] <= 1, name
    assert '"model_2dg.pt"' in printed
    # the same numbers as evaluating the file alone
    assert main(["evaluate", str(tiny_run / "model_2dg.pt"), "--num-samples", "2"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["accuracy"] == metrics["model_2dg.pt"]["accuracy"]


def test_evaluate_a_folder_without_model_files(tmp_path, capsys):
    (tmp_path / "results.json").write_text("{}")
    one_line(
        capsys,
        2,
        ["evaluate", str(tmp_path)],
        f"{str(tmp_path)!r} is a folder with no model file",
        "model_<method>.pt",
    )


def test_a_foreign_file_is_named_in_a_short_line(tmp_path, capsys):
    path = tmp_path / "results.pt"
    torch.save({"x": Path("a")}, path)  # a pickled object, refused by weights_only
    line = one_line(capsys, 2, ["evaluate", str(path)], str(path), "not a readable")
    assert len(line) < 400, line


# ---------------------------------------------------------------------- report
def test_report_prints_nan_as_nan_and_missing_as_dash():
    table = format_table(
        [
            {"method": "2dg", "accuracy": math.nan, "nll": 0.5, "trainable_params": 10},
            {"method": "mean_field", "accuracy": 0.9, "nll": None},
        ]
    )
    assert "| 2dg | nan | 0.5000 | 10 |" in table
    assert "| mean_field | 0.9000 | - | - |" in table


def test_report_of_a_partial_uncertainty_record_is_a_table():
    """A hand-edited (or older) record with part of the uncertainty fields: ``-`` where a
    value is missing, never a KeyError (exit 1)."""
    from twodg_pyro.pipeline.outputs.results import uncertainty_table

    table = uncertainty_table(
        [{"method": "2dg", "ood": {"noise": {"mi_auroc": 0.5}}, "aurc": math.nan, "shift": 3}]
    )
    assert "| 2dg | - | nan | - (0.500) | - |" in table


# ---------------------------------------------------------------------- config values
@pytest.mark.parametrize(
    "values, named",
    [
        ({"seed": 10**20}, f"seed = {10**20}: must be an integer in [0, 4294967295]"),
        ({"seed": 2**32}, f"seed = {2**32}"),
        ({"seed": -1}, "seed = -1"),
        ({"seed": True}, "seed must be an integer, got True"),
        ({"seed": 1e20}, "seed must be an integer, got 1e+20"),
        ({"data": {"split_seed": 2**40}}, f"data.split_seed = {2**40}"),
        ({"stage1": {"epochs": 10**20}}, f"stage1.epochs = {10**20}: must be below 2**63"),
        ({"data": {"batch_size": 2**63}}, f"data.batch_size = {2**63}: must be below 2**63"),
        ({"network": {"hidden": [10**20]}}, f"network.hidden = [{10**20}]: must be below 2**63"),
        ({"sharing": {"gmm_batch_size": 10**19}}, "sharing.gmm_batch_size"),
        ({"stage1": {"deterministic_milestones": [1, 10**30]}}, "deterministic_milestones"),
    ],
)
def test_integer_settings_beyond_their_range_are_named(values, named):
    with pytest.raises(ConfigError) as info:
        config_from_dict(values)
    assert named in str(info.value)


def test_a_huge_seed_in_a_json_config_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "s.json"
    cfg.write_text('{"preset": "digits", "seed": 100000000000000000000}')
    one_line(
        capsys,
        2,
        ["train", "--config", str(cfg), "--out", str(tmp_path / "o")],
        "seed = 100000000000000000000",
    )
    assert not (tmp_path / "o").exists()


def test_a_pipe_as_config_file_is_refused_not_read(tmp_path, capsys):
    """Reading a pipe waits for a writer: without the check ``train`` hangs."""
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    one_line(capsys, 2, ["train", "--config", str(fifo)], str(fifo), "not a regular file")


def test_the_largest_seed_is_accepted():
    assert config_from_dict({"seed": 2**32 - 1, "data": {"split_seed": 0}}).seed == 2**32 - 1


@pytest.mark.parametrize(
    "name, text",
    [
        ("c.toml", "seed = 3\n[stage1]\nepochs = 2\n"),
        ("c.json", '{"seed": 3, "stage1": {"epochs": 2}}'),
        ("c.yaml", "seed: 3\nstage1:\n  epochs: 2\n"),
    ],
)
def test_a_config_file_with_a_byte_order_mark(tmp_path, name, text):
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    cfg = load_config(path)
    assert cfg.seed == 3 and cfg.stage1.epochs == 2
