"""The CLI under hostile use: every user error is one line on stderr naming the value or
file, exit code 2, no traceback (``--debug`` adds it); Ctrl-C says where the last
checkpoint is and how to resume.  One case per finding of the hostile probe (issue 17)."""

from __future__ import annotations

import json
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from twodg_pyro.cli import main
from twodg_pyro.files.integrity import seal
from twodg_pyro.infer.elbo import DecomposedELBO


@pytest.fixture
def finished(tiny_run) -> Path:
    """A finished run folder (results, model file, checkpoints); tests copy it to change it."""
    return tiny_run


@pytest.fixture
def config(tmp_path, tiny_run_config) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny_run_config))
    return path


def one_line(capsys, code: int, argv: list[str], *named: str) -> str:
    """Run the CLI; assert the exit code, one line on stderr naming ``named``, no traceback."""
    assert main(argv) == code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "warning:" not in ln]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in named:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------- data files
def _fake_mnist(root: Path, n: int = 20) -> Path:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes()
        )
        labels = (np.arange(n) % 10).astype(np.uint8)
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 2049, n) + labels.tobytes()
        )
    return raw


@pytest.mark.parametrize(
    "name, change, named",
    [
        ("t10k-images-idx3-ubyte", lambda b: b[:4000], "truncated"),  # was a shape traceback
        ("train-labels-idx1-ubyte", lambda b: b"\x00\x00\x08\x03" + b[4:], "magic number"),
        ("train-images-idx3-ubyte", lambda b: b"", "is empty"),  # was int('', 16)
        ("train-labels-idx1-ubyte", lambda b: b[:10] + bytes([200]) + b[11:], "label 200"),
    ],
)
def test_damaged_mnist_files(tmp_path, capsys, name, change, named):
    raw = _fake_mnist(tmp_path / "data")
    (raw / name).write_bytes(change((raw / name).read_bytes()))
    cfg = tmp_path / "m.toml"
    cfg.write_text(
        f'methods = ["mean_field"]\n[data]\nname = "mnist"\nroot = "{tmp_path / "data"}"\n'
    )
    one_line(
        capsys,
        2,
        ["train", "--config", str(cfg), "--out", str(tmp_path / "o")],
        str(raw / name),
        named,
    )
    assert not (tmp_path / "o" / "results.json").exists()


# ---------------------------------------------------------------------- devices
def test_devices_are_checked_before_anything(tmp_path, capsys, config, finished):
    out = str(tmp_path / "o")
    bad = tmp_path / "dev5.toml"
    bad.write_text("device = 5\n")
    one_line(capsys, 2, ["train", "--config", str(bad), "--out", out], "device = 5")
    one_line(
        capsys,
        2,
        ["train", "--config", str(config), "--out", out, "--device", "cudafoo"],
        "'cudafoo'",
    )
    model = str(finished / "model_2dg.pt")
    one_line(capsys, 2, ["evaluate", model, "--device", "cudafoo"], "--device = 'cudafoo'")
    if not torch.cuda.is_available():
        one_line(
            capsys,
            2,
            ["train", "--config", str(config), "--out", out, "--device", "cuda"],
            "CUDA is not available here",
        )
        one_line(capsys, 2, ["evaluate", model, "--device", "cuda:0"], "CUDA is not available")
    else:
        n = torch.cuda.device_count()
        one_line(
            capsys, 2, ["evaluate", model, "--device", f"cuda:{n}"], f"this machine has {n} GPU(s)"
        )
    assert not Path(out).exists()


# ---------------------------------------------------------------------- evaluate / report
def test_evaluate_a_digits_model_on_mnist_and_out_a_folder(tmp_path, capsys, finished):
    _fake_mnist(tmp_path / "data")
    model = str(finished / "model_2dg.pt")
    one_line(
        capsys,
        2,
        ["evaluate", model, "--data", "mnist", "--root", str(tmp_path / "data")],
        f"'{model}' does not fit data set 'mnist'",
        "inputs of shape (1, 28, 28)",
    )
    one_line(
        capsys, 2, ["evaluate", model, "--out", str(tmp_path)], "is a folder; give a file name"
    )
    assert capsys.readouterr().out == ""  # refused before evaluating
    one_line(capsys, 2, ["evaluate", model, "--data", "svhn"], "--data 'svhn'")
    one_line(capsys, 2, ["evaluate", model, "--num-samples", "0"], "--num-samples 0")
    one_line(capsys, 2, ["evaluate", str(tmp_path / "none.pt")], "none.pt")
    assert main(["evaluate", model, "--num-samples", "2", "--out", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["n_examples"] == 359


@pytest.mark.parametrize(
    "content, named",
    [
        (b"[1, 2]", "is not a results file: it holds a list"),
        (b'{"schema": 1, "records": 5}', "'records' must be a list"),
        (b'{"schema": 1, "records": [3]}', "records[0] must be a table"),
        (b'{"schema": 1, "records": [{"accuracy": 0.9}]}', "records[0] has no method name"),
        (b'{"schema": 1, "records": [{"method": "m"}], "config": 7}', "'config' must be a table"),
        (b'{"schema": 1, "records": [', "is not valid JSON"),
        (bytes(range(128, 256)), "is not a text file"),
    ],
)
def test_report_on_a_malformed_results_file(tmp_path, capsys, content, named):
    (tmp_path / "results.json").write_bytes(content)
    one_line(capsys, 2, ["report", str(tmp_path)], str(tmp_path / "results.json"), named)
    assert not (tmp_path / "results.md").exists()


def test_report_rebuilds_the_table(finished, tmp_path, capsys):
    shutil.copytree(finished, tmp_path / "r")
    (tmp_path / "r" / "results.md").unlink()
    assert main(["report", str(tmp_path / "r")]) == 0
    assert "| mean_field |" in (tmp_path / "r" / "results.md").read_text()
    one_line(capsys, 2, ["report", str(tmp_path / "r" / "results.json")], "is a file")


# ---------------------------------------------------------------------- hand-edited files
def _edited(finished: Path, tmp_path: Path, edit, reseal: bool = True) -> str:
    payload = torch.load(finished / "model_2dg.pt", weights_only=True)
    header = json.loads(payload["header"])
    edit(header, payload)
    payload["header"] = json.dumps(header)
    path = tmp_path / "edited.pt"
    torch.save(seal(payload) if reseal else payload, path)
    return str(path)


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda h, p: h.pop("likelihood"), "the header's likelihood = None is not a Categorical"),
        (lambda h, p: h.update(likelihood=None), "likelihood = None"),
        (lambda h, p: h["likelihood"].pop("dataset_size"), "has no dataset_size"),
        (lambda h, p: h.update(tying="shared"), "tying = 'shared' is not one of"),
        (lambda h, p: h.update(site_names="net.0.weight"), "site_names"),
        (lambda h, p: h["network"]["kwargs"].update(hidden=[17]), "does not match the one saved"),
        (lambda h, p: h["network"].update(name="resnet7"), "cannot build its network"),
        (lambda h, p: h["prior"].pop("scale"), "the header's prior"),
        (lambda h, p: p.pop("structure/means"), "sharing structure or guide does not fit"),
        (lambda h, p: p.pop("guide/outlier_loc"), "sharing structure or guide does not fit"),
    ],
)
def test_hand_edited_model_files(finished, tmp_path, capsys, edit, named):
    """Edited and re-sealed (a tool that rewrites the checksum): the content is checked;
    edited without it: the checksum catches it."""
    path = _edited(finished, tmp_path, edit)
    one_line(capsys, 2, ["evaluate", path], path, named)
    path = _edited(finished, tmp_path, edit, reseal=False)
    one_line(capsys, 2, ["evaluate", path], path, "is corrupted")


def test_a_flipped_byte_in_a_checkpoint_is_refused_on_resume(finished, tmp_path, capsys):
    run_dir = tmp_path / "r"
    shutil.copytree(finished, run_dir)
    stage3 = run_dir / "checkpoints" / "stage3.pt"
    payload = torch.load(stage3, weights_only=True)
    data = bytearray(stage3.read_bytes())
    # flip a byte inside the stored tensor data of the outlier locations
    needle = payload["guide/outlier_loc"].numpy().tobytes()[:16]
    at = data.find(needle)
    assert at > 0
    data[at + 3] ^= 0x40
    stage3.write_bytes(bytes(data))
    before = _files(run_dir)
    one_line(capsys, 2, ["train", "--resume", str(run_dir)], str(stage3), "is corrupted")
    assert _files(run_dir) == before


# ---------------------------------------------------------------------- training failures
def test_nan_loss_is_one_line_naming_the_last_checkpoint(tmp_path, capsys, config, monkeypatch):
    real = DecomposedELBO.combine
    calls = {"n": 0}

    def poisoned(self, terms):
        calls["n"] += 1
        loss = real(self, terms)
        return loss * float("nan") if calls["n"] == 14 else loss  # in stage-1 epoch 1

    monkeypatch.setattr(DecomposedELBO, "combine", poisoned)
    out = tmp_path / "o"
    one_line(
        capsys,
        2,
        ["train", "--config", str(config), "--out", str(out)],
        "loss is nan at epoch 1",
        f"last good checkpoint: {out / 'checkpoints' / 'stage1.pt'} (epoch 1)",
    )


def test_ctrl_c_says_where_the_checkpoint_is_and_how_to_resume(
    tmp_path, capsys, config, interrupt_after
):
    interrupt_after("stage1", 1)
    out = tmp_path / "o"
    line = one_line(
        capsys,
        130,
        ["train", "--config", str(config), "--out", str(out)],
        f"interrupted; the last checkpoint is {out / 'checkpoints' / 'stage1.pt'} "
        "(stage1, epoch 1 of 2)",
        f"Continue with: twodg-pyro train --resume {out}",
    )
    assert line.startswith("twodg-pyro train: ")
    interrupt_after(None)
    one_line(capsys, 2, ["train", "--config", str(config), "--out", str(out)], "--resume")
    assert main(["train", "--resume", str(out)]) == 0  # the lock was given back
    assert (out / "results.json").exists()


def test_ctrl_c_without_checkpoints_says_the_run_cannot_be_resumed(
    tmp_path, capsys, monkeypatch, tiny_run_config
):
    from twodg_pyro.pipeline.methods import mean_field as context_mod

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(context_mod, "stage1_mean_field", interrupt)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**tiny_run_config, "checkpoint_every": 0}))
    one_line(
        capsys,
        130,
        ["train", "--config", str(cfg), "--out", str(tmp_path / "o")],
        "cannot be resumed",
        "checkpoint_every > 0",
    )


def test_debug_shows_the_traceback_and_unexpected_failures_are_one_line(
    tmp_path, capsys, config, monkeypatch
):
    bad = tmp_path / "bad.toml"
    bad.write_text("[sharing]\ngmm_max_iter = -1\n")
    assert main(["train", "--config", str(bad), "--out", str(tmp_path / "o"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().endswith(
        "sharing.gmm_max_iter = -1: must be an integer >= 1"
    )
    assert main(["--debug", "train", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "Traceback" in capsys.readouterr().err

    from twodg_pyro.pipeline.methods import mean_field as context_mod

    def bug(*a, **k):
        raise RuntimeError("an internal error\nover two lines")

    monkeypatch.setattr(context_mod, "stage1_mean_field", bug)
    one_line(
        capsys,
        1,
        ["train", "--config", str(config), "--out", str(tmp_path / "o")],
        "RuntimeError: an internal error over two lines",
        "--debug shows the traceback",
    )
    # argparse's own errors are one line too
    one_line(capsys, 2, ["train", "--seed", "x"], "argument --seed: invalid int value: 'x'")


# ---------------------------------------------------------------------- a real Ctrl-C
@pytest.mark.slow
def test_a_real_sigint_stops_the_run_with_the_resume_command(tmp_path, tiny_run_config):
    cfg = tmp_path / "long.json"
    long_stage1 = {"epochs": 400, "deterministic_epochs": 1}
    cfg.write_text(json.dumps({**tiny_run_config, "stage1": long_stage1}))
    out = tmp_path / "o"
    p = subprocess.Popen(
        [sys.executable, "-m", "twodg_pyro.cli", "train", "--config", str(cfg), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell's background job ignores SIGINT and its children inherit that: give the
        # run the default disposition, so Python installs its KeyboardInterrupt handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while not (out / "checkpoints" / "stage1.pt").exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130
    assert f"Continue with: twodg-pyro train --resume {out}" in err and "Traceback" not in err
    assert not (out / ".twodg-pyro.lock").exists()


# ---------------------------------------------------------------------- stdout, stderr
def test_a_run_in_a_latin1_folder_with_a_read_only_home_speaks_in_one_voice(tmp_path):
    """A folder name with a Latin-1 byte (invalid UTF-8) prints (escaped) instead of
    failing after the run, and an unwritable HOME (``/proc``: nothing can be made in
    it) neither breaks ArviZ's import nor lets matplotlib write lines of its own:
    every line on stderr is the CLI's (a one-epoch deterministic run: the model file,
    results and the imports of the diagnostics' libraries are what matter)."""
    import os

    config = tmp_path / "tiny.json"
    settings = {"methods": ["deterministic"], "progress": False, "network": {"hidden": [8]}}
    config.write_text(json.dumps({**settings, "stage1": {"deterministic_epochs": 1}}))
    out = tmp_path / os.fsdecode(b"caf\xe9") / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "MPLCONFIG"))}
    env.update(HOME="/proc", TMPDIR=str(tmp_path), PYTHONIOENCODING="utf-8")
    argv = [sys.executable, "-m", "twodg_pyro.cli", "train", "--config", str(config)]
    proc = subprocess.run(
        [*argv, "--out", os.fsencode(out)], env=env, capture_output=True, timeout=600
    )
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert "wrote " + str(tmp_path) + "/caf\\udce9/run/results.json" in stdout
    assert (out / "results.json").is_file() and (out / "results.md").is_file()
    foreign = [line for line in stderr.splitlines() if not line.startswith("twodg-pyro train:")]
    assert foreign == [], stderr
    assert "Matplotlib created a temporary" not in stderr
