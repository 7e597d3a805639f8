"""The docs (docs/: the guides in MyST markdown and the API reference by autodoc) build with
Sphinx, warnings as errors, and ``make test`` runs that build.  The build itself is slow
here (about 20 s), so it is a slow test; ``make test`` runs it anyway (``make docs``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def make_target(name: str) -> tuple[list[str], list[str]]:
    """The prerequisites and recipe lines of the Makefile's target ``name``."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{name}:(.*)\n((?:\t.*\n)*)", text, flags=re.M)
    assert match, name
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_make_test_builds_the_docs_with_warnings_as_errors():
    _, recipe = make_target("test")
    # the two venvs' dependencies install side by side, then the main venv's checks run
    # beside the ArviZ 1.x venv's own install of the project, then that venv's tests
    assert recipe[0].split()[-2:] == ["install", "arviz1-dependencies"] and "-j2" in recipe[0]
    assert recipe[1].split()[-2:] == ["test-main", "arviz1-venv"] and "-j2" in recipe[1]
    assert "test-arviz1" in recipe[-1] and len(recipe) == 3
    # the second venv's editable install waits for the main one's (both write the
    # project's metadata in this folder)
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP_ARVIZ1\):.*\$\(DEPS_ARVIZ1\) \$\(STAMP\)$", text, flags=re.M)
    prerequisites, recipe = make_target("test-main")
    assert prerequisites[:2] == ["lint", "docs"]  # lint, then the docs, then pytest
    assert recipe[0].startswith("$(BIN)/python -m pytest") and "-n auto" in recipe[0]
    _, docs = make_target("docs")
    assert len(docs) == 1 and "-m sphinx" in docs[0] and "-W" in docs[0].split()
    assert docs[0].split()[-2:] == ["docs", "build/docs"]


def test_the_docs_pages_are_in_the_table_of_contents_and_the_api_covers_the_surface():
    import twodg_pyro as tp

    conf = (DOCS / "conf.py").read_text()
    for extension in ("myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"):
        assert f'"{extension}"' in conf, extension
    api = (DOCS / "api.md").read_text()
    assert ".. automodule:: twodg_pyro\n   :members:\n   :imported-members:" in api
    assert len(tp.__all__) >= 15
    for package in ("guides", "infer", "sharing", "gmm", "io", "diagnostics", "data"):
        assert f".. automodule:: twodg_pyro.{package}\n" in api, package


@pytest.mark.slow
def test_the_docs_build_with_warnings_as_errors(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html"]
        + [str(DOCS), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    html = (tmp_path / "html" / "api.html").read_text()
    for name in ("BNNModel", "SharedGMMGuide", "fit", "build_sharing", "load_model"):
        assert f'id="twodg_pyro.{name}"' in html, name


def test_the_ci_benchmark_reads_each_pytest_runs_closing_line(tmp_path):
    """``benchmarks/bench_make_test.py`` times the README's test command on a fresh clone
    and reads each pytest run's own time from its closing line: here, from real pytest
    runs (``-q``, as ``make test`` runs it, and framed by ``=``), failures and errors
    included."""
    import bench_make_test

    (tmp_path / "test_few.py").write_text(
        "import pytest\n\n"
        "def test_ok():\n    pass\n\n"
        "def test_no():\n    assert False\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError\n\n"
        "def test_err(broken):\n    pass\n\n"
        "@pytest.mark.skip\ndef test_skip():\n    pass\n"
    )
    outputs = []
    for flags in (["-q"], []):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *flags, "-p", "no:cacheprovider", "-c", "/dev/null",
             "--rootdir", str(tmp_path), str(tmp_path / "test_few.py")],
            capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 1
        outputs.append(done.stdout)
    runs = bench_make_test.pytest_runs("\n".join(outputs))
    assert [(r["passed"], r["failed"]) for r in runs] == [(1, 2), (1, 2)]
    assert all(0 < r["seconds"] < 60 for r in runs)
