"""The README and the guides in docs/ run as pasted: the README's python code blocks, then
those of each guide of ``GUIDES`` in that order, executed in one namespace (as a reader
pastes them into one session: the guides' blocks use the README example's model, guides
and data), in a scratch folder (about 10 s here: the README's own epochs, the main job's).
So do the worked examples of ``OWN_SESSION`` (docs/arviz.md, mcmc.md, regression.md,
rank1.md, ssvi.md; each its own namespace: it trains its own small run).  The README is a
front page of at most 300 lines; the docs build itself (Sphinx, warnings as errors) is
``make docs``, which ``make test`` runs."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pyro

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS = README.parent / "docs"
ARVIZ_DOC = DOCS / "arviz.md"
MCMC_DOC = DOCS / "mcmc.md"
#: the worked examples with a session of their own each
OWN_SESSION = ("arviz.md", "mcmc.md", "regression.md", "rank1.md", "ssvi.md")
#: the guides whose python blocks continue the README's session, in the order they run
GUIDES = ("library.md", "model-files.md", "baselines.md", "diagnostics.md", "uncertainty.md")
README_MAX_LINES = 300


def python_blocks(text: str) -> list[str]:
    """The ```python fenced blocks of a markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    for page in (*GUIDES, *OWN_SESSION, "api.md"):
        assert f"](docs/{page})" in text, page  # the "read on" list links every page


def test_every_guide_with_python_blocks_runs():
    """A guide's python blocks run: it is in GUIDES (or it is docs/arviz.md), and every
    page is in the docs' table of contents."""
    with_blocks = {p.name for p in DOCS.glob("*.md") if python_blocks(p.read_text())}
    assert with_blocks == {*GUIDES, *OWN_SESSION}
    index = (DOCS / "index.md").read_text()
    for page in DOCS.glob("*.md"):
        assert page.name == "index.md" or f"\n{page.stem}\n" in index, page.name


def test_readme_has_the_blocks_we_run():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 2
    first = blocks[0]
    # the first snippet defines its data with the library's helpers
    assert "load_digits_split" in first and "make_loader" in first
    for name in ("train_set", "train_loader", "x_test", "y_test"):
        assert re.search(rf"^{name}\b|^{name}, |, {name} =", first, flags=re.M), name


def run_blocks(*paths: Path) -> dict:
    """Execute the python blocks of the markdown files ``paths``, file after file, each
    file's in order, in one namespace (the current folder: a scratch one); returns the
    namespace."""
    matplotlib.use("Agg")
    namespace: dict = {"__name__": "__readme__"}
    try:
        for path in paths:
            for i, block in enumerate(python_blocks(path.read_text())):
                where = f"{path.name} python block {i + 1}"
                try:
                    exec(compile(block, where, "exec"), namespace)
                except Exception as e:  # noqa: BLE001 - name the block that failed
                    raise AssertionError(f"{where} failed: {e!r}\n{block}") from e
    finally:
        pyro.clear_param_store()  # the SVI block fills Pyro's global store
        import matplotlib.pyplot as plt

        plt.close("all")  # ArviZ's figures are pyplot's
    return namespace


def test_readme_and_guides_python_blocks_run_as_pasted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the blocks write model files into the current folder
    namespace = run_blocks(README, *(DOCS / page for page in GUIDES))
    # what the blocks promise
    assert 0.9 < float((namespace["probs"].argmax(-1) == namespace["y_test"]).float().mean())
    assert (tmp_path / "model_2dg.pt").is_file() and (tmp_path / "model.2dgz").is_file()
    assert "layers.0.weight" in namespace["idata"].posterior


def test_arviz_doc_python_blocks_run_as_pasted(tmp_path, monkeypatch):
    """docs/arviz.md's worked example, on the installed ArviZ major, with no numerical
    warning from compare (the block turns warnings into errors)."""
    monkeypatch.chdir(tmp_path)
    namespace = run_blocks(ARVIZ_DOC)
    assert len(python_blocks(ARVIZ_DOC.read_text())) >= 6
    for name in ("forest_components.png", "pairs.png", "ppc_classes.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    assert namespace["res"]["pareto_k"].shape == (len(namespace["split"].test),)
    assert set(namespace["table"].index) == {"2dg", "mean_field"}
    kinds = {b["kind"] for b in namespace["blocks"]["blocks"]}
    assert kinds == {"layer", "outliers", "component"}


def test_mcmc_doc_python_blocks_run_as_pasted(tmp_path, monkeypatch):
    """docs/mcmc.md's worked example: NUTS chains on a small network, their report, a
    fidelity score and the model file."""
    monkeypatch.chdir(tmp_path)
    namespace = run_blocks(MCMC_DOC)
    assert namespace["posterior"].draws.shape == (2, 30, 650)
    assert namespace["accuracy"] > 0.75
    report = namespace["report"]
    assert report["predictive"]["n_values"] == 50 * 10
    assert 0 <= namespace["scores"]["tv"] < 1
    assert (tmp_path / "model_mcmc.pt").is_file()


def test_regression_doc_python_blocks_run_as_pasted(tmp_path, monkeypatch):
    """docs/regression.md's worked example: a learnt noise, the predictive spread, the
    regression metrics, 2DG, ArviZ's LOO and comparison, the model file."""
    from twodg_pyro import diagnostics as D

    monkeypatch.chdir(tmp_path)
    ns = run_blocks(DOCS / "regression.md")
    assert 0.3 < ns["model"].likelihood.scale < 1.2  # standardised targets, R^2 about 0.5
    assert set(ns["mf"]) >= {"rmse", "nll", "coverage_50", "coverage_90", "coverage_95"}
    assert ns["mf"]["rmse"] < 0.85 and ns["two_dg"]["rmse"] < 0.85  # better than the mean
    assert ns["n_mf"] / ns["n_2dg"] >= 10
    assert set(ns["table"].index) == {"2dg", "mean_field"}
    y = D.group(ns["trees"]["2dg"], "observed_data")["y"].values
    assert y.shape == (88,) and y.dtype.kind == "f"


def test_rank1_and_ssvi_docs_python_blocks_run_as_pasted(tmp_path, monkeypatch):
    """docs/rank1.md and docs/ssvi.md: each trains, evaluates and reloads its method."""
    monkeypatch.chdir(tmp_path)
    rank1 = run_blocks(DOCS / "rank1.md")
    assert rank1["metrics"]["accuracy"] > 0.8 and rank1["model"].components == 4
    ssvi = run_blocks(DOCS / "ssvi.md")
    assert ssvi["metrics"]["accuracy"] > 0.8 and len(ssvi["update"].updates) >= 1
    assert ssvi["guide"].num_active == ssvi["guide2"].num_active < ssvi["model"].num_weights
