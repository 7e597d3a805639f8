"""Run folders that never lose work: an earlier run is never overwritten without
--overwrite (and then only once the new inputs are valid), two runs never share a folder
(a killed run's lock does not block), the folder is checked before anything trains, and
temporary files of interrupted writes are removed at start and resume."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from twodg_pyro.cli import main
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.pipeline.runtime import run_folder as rf
from twodg_pyro.pipeline.runtime import runner as runner_mod
from twodg_pyro.pipeline.runtime.run_folder import (
    LOCK_NAME,
    RunFolder,
    RunFolderError,
    RunFolderLocked,
    check_output_file,
)

#: A mean-field run on digits in about a second.
QUICK = {
    "methods": ["mean_field"],
    "num_samples": 2,
    "progress": False,
    "network": {"hidden": [8]},
    "stage1": {"epochs": 1},
}


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def earlier(tmp_path) -> Path:
    """A folder holding an earlier run's results and checkpoints, and a user's notes."""
    d = tmp_path / "run"
    (d / "checkpoints").mkdir(parents=True)
    (d / "results.json").write_text('{"schema": 1, "records": [{"method": "old"}]}')
    (d / "checkpoints" / "stage1.pt").write_bytes(b"200 epochs of work")
    (d / "notes.txt").write_text("mine")
    return d


def _no_training(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the data were loaded: the folder was not checked first")

    monkeypatch.setattr(runner_mod, "load_data", fail)


# ---------------------------------------------------------------------- earlier runs
def test_a_fresh_run_refuses_a_folder_holding_an_earlier_run(earlier, monkeypatch, capsys):
    before = _files(earlier)
    _no_training(monkeypatch)
    with pytest.raises(RunFolderError, match=r"holds an earlier run \(results.json, check"):
        run(config_from_dict(QUICK), earlier)
    cfg = earlier.parent / "c.toml"
    cfg.write_text('methods = ["mean_field"]\n')
    assert main(["train", "--config", str(cfg), "--out", str(earlier)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--resume {earlier}" in err and "--overwrite" in err
    assert _files(earlier) == before
    assert not (earlier / LOCK_NAME).exists()  # the lock was given back


def test_overwrite_replaces_the_earlier_run_and_keeps_other_files(earlier):
    run(config_from_dict({**QUICK, "checkpoint_every": 0}), earlier, overwrite=True)
    results = json.loads((earlier / "results.json").read_text())
    assert [r["method"] for r in results["records"]] == ["mean_field"]
    assert not (earlier / "checkpoints" / "stage1.pt").exists()  # the old run's, removed
    assert (earlier / "notes.txt").read_text() == "mine"
    with pytest.raises(RunFolderError, match="resume and overwrite exclude each other"):
        RunFolder(earlier, resume=True, overwrite=True)
    assert main(["train", "--resume", str(earlier), "--overwrite"]) == 2


# ---------------------------------------------------------------------- the lock
def test_a_second_run_into_a_locked_folder_is_refused_naming_the_owner(tmp_path, capsys):
    out = tmp_path / "busy"
    with RunFolder(out) as first:
        assert first.held
        owner = json.loads((out / LOCK_NAME).read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        with pytest.raises(RunFolderLocked, match=rf"pid {os.getpid()} on host"):
            RunFolder(out).acquire()
        cfg = tmp_path / "c.toml"
        cfg.write_text('methods = ["mean_field"]\n')
        assert main(["train", "--config", str(cfg), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "another run is writing to" in err and err.count("\n") == 1
    assert not (out / LOCK_NAME).exists()
    RunFolder(out).acquire().release()  # free again


# the module needs only the standard library: load it alone (no torch import, fast)
_HOLD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("run_folder", sys.argv[2])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
mod.RunFolder(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_the_lock_of_a_killed_run_does_not_block_the_folder(tmp_path):
    out = tmp_path / "killed"
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out), rf.__file__], stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderLocked, match=f"pid {p.pid} on host"):
            RunFolder(out).acquire()
    finally:
        p.kill()  # SIGKILL: no clean-up in the owner
        p.wait()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == p.pid  # stale record left
    with RunFolder(out) as folder:
        assert folder.held
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_only_a_live_lock_holder_keeps_the_folder(tmp_path, monkeypatch):
    """The kernel's lock decides, not the record in the file: a record of a dead process,
    of a live pid or of another host is taken over when no process holds the lock; a
    live holder is refused, naming the recorded owner; on a file system without file locks
    the run goes ahead with a warning naming why, and still records itself."""
    import fcntl

    out = tmp_path / "f"
    out.mkdir()
    lock = out / LOCK_NAME
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = socket.gethostname()
    for owner in ({"pid": dead.pid, "host": here}, {"pid": os.getpid(), "host": here}):
        lock.write_text(json.dumps(owner))
        RunFolder(out).acquire().release()
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "today"}))
    with open(lock) as held:  # another open file: its flock excludes this process too
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RunFolderLocked, match="pid 1 on host 'elsewhere' since today"):
            RunFolder(out).acquire()
    RunFolder(out).acquire().release()

    def no_flock(fd, op):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.warns(RuntimeWarning, match="No locks available.*will not be detected"):
        folder = RunFolder(out).acquire()
    assert folder.held and json.loads(lock.read_text())["pid"] == os.getpid()
    folder.release()
    assert not lock.exists()


# ---------------------------------------------------------------------- checked before training
def test_an_output_folder_that_cannot_take_the_run_fails_before_training(
    tmp_path, monkeypatch, capsys
):
    _no_training(monkeypatch)
    a_file = tmp_path / "results.txt"
    a_file.write_text("x")
    with pytest.raises(RunFolderError, match="output folder '.*results.txt' is a file"):
        run(config_from_dict(QUICK), a_file)
    with pytest.raises(RunFolderError, match="results.txt' is a file, not a folder"):
        run(config_from_dict(QUICK), a_file / "sub")

    def read_only(folder):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(rf, "_probe", read_only)
    with pytest.raises(RunFolderError, match=r"output folder '.*ro' is not writable .*denied"):
        run(config_from_dict(QUICK), tmp_path / "ro")
    cfg = tmp_path / "c.toml"
    cfg.write_text('methods = ["mean_field"]\n')
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "ro")]) == 2
    assert "is not writable" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_fails_before_training(tmp_path, monkeypatch):
    _no_training(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(RunFolderError, match="is not writable"):
            run(config_from_dict(QUICK), ro)
    finally:
        ro.chmod(0o755)


def test_output_file_checks(tmp_path):
    with pytest.raises(RunFolderError, match="--out '.*' is a folder; give a file name"):
        check_output_file(tmp_path, "--out")
    (tmp_path / "f").write_text("")
    with pytest.raises(RunFolderError, match="'.*f' is a file, not a folder"):
        check_output_file(tmp_path / "f" / "metrics.json", "--out")
    assert check_output_file(tmp_path / "new" / "m.json") == tmp_path / "new" / "m.json"
    assert not (tmp_path / "new").exists()  # checking creates nothing


# ---------------------------------------------------------------------- temporary files
def test_temporary_files_are_removed_at_start_and_resume(earlier):
    (earlier / ".inference_data.nc.k2j3h4.tmp").write_bytes(b"x" * 1000)
    (earlier / "checkpoints" / ".stage1.pt.abc.tmp").write_bytes(b"half a checkpoint")
    (earlier / "keep.tmp").write_text("not ours: no leading dot")
    with RunFolder(earlier, resume=True) as folder:
        assert sorted(folder.removed_temporaries) == [
            ".inference_data.nc.k2j3h4.tmp",
            "checkpoints/.stage1.pt.abc.tmp",
        ]
    assert (earlier / "keep.tmp").exists() and (earlier / "checkpoints" / "stage1.pt").exists()
    assert not list(earlier.rglob(".*.tmp"))


def test_a_run_that_fails_before_writing_leaves_no_new_folder(tmp_path, monkeypatch):
    def bad_data(*a, **k):
        raise ValueError("train label 12 at example 5 is out of range [0, 10)")

    monkeypatch.setattr(runner_mod, "load_data", bad_data)
    with pytest.raises(ValueError, match="label 12"):
        run(config_from_dict(QUICK), tmp_path / "new" / "run")
    assert not (tmp_path / "new" / "run").exists()


def test_a_run_leaves_no_lock_and_no_temporary_files(tmp_path):
    out = tmp_path / "clean"
    run(config_from_dict({**QUICK, "checkpoint_every": 1}), out)
    names = {p.name for p in out.rglob("*")}
    assert "results.json" in names and "stage1.pt" in names
    assert LOCK_NAME not in names and not [n for n in names if n.endswith(".tmp")]
