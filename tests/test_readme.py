"""The README runs as pasted: its python code blocks, executed in order in one namespace
(as a reader pastes them into one session), in a scratch folder (about 10 s here: the
README's own epochs, the main job's)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pyro

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    """The ```python fenced blocks of a markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_readme_has_the_blocks_we_run():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 5
    first = blocks[0]
    # the first snippet defines its data with the library's helpers
    assert "load_digits_split" in first and "make_loader" in first
    for name in ("train_set", "train_loader", "x_test", "y_test"):
        assert re.search(rf"^{name}\b|^{name}, |, {name} =", first, flags=re.M), name


def test_readme_python_blocks_run_as_pasted(tmp_path, monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # the blocks write model files into the current folder
    namespace: dict = {"__name__": "__readme__"}
    try:
        for i, block in enumerate(python_blocks(README.read_text())):
            try:
                exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
            except Exception as e:  # noqa: BLE001 - name the block that failed
                raise AssertionError(f"README python block {i + 1} failed: {e!r}\n{block}") from e
    finally:
        pyro.clear_param_store()  # the SVI block fills Pyro's global store
    # what the blocks promise
    assert 0.9 < float((namespace["probs"].argmax(-1) == namespace["y_test"]).float().mean())
    assert (tmp_path / "model_2dg.pt").is_file() and (tmp_path / "model.2dgz").is_file()
    assert "layers.0.weight" in namespace["idata"].posterior
