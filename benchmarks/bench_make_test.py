"""What CI costs: the README's test command on a fresh clone, timed end to end.

    python benchmarks/bench_make_test.py [--repo .] [--keep]

Clones the repository's committed ``HEAD`` into a temporary folder and runs ``bash
.ci/run`` there (``make test``: both venvs' installs, ruff, the docs build, the suite, and
the ArviZ 1.x tests when the main venv has ArviZ 0.x), as CI does, with ``CI=true``.
Records the wall time of the whole command (the project allows 10 minutes on 2 cores)
and the time each pytest run reports for itself; the rest is installs, ruff and Sphinx.
The machine should be otherwise idle: on a shared one the suite's time moves by a third.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from _common import record

#: the project's limit for the fresh-clone test command, seconds
LIMIT_S = 600
#: pytest's closing line, e.g. "1 failed, 1104 passed, 2 skipped, 10 warnings in 296.37s
#: (0:04:56)" (``-q``; without it the line is framed by ``=``)
_CLOSING = re.compile(r"^=*\s*((?:\d+ \w+, )*\d+ \w+) in ([0-9.]+)s\b", re.M)


def pytest_runs(output: str) -> list[dict]:
    """Each pytest run's closing line in ``output``, in the order they ran: ``{"passed",
    "failed", "seconds"}`` (errors count as failed)."""
    runs = []
    for counts, seconds in _CLOSING.findall(output):
        n = {word: int(k) for k, word in re.findall(r"(\d+) (\w+)", counts)}
        failed = n.get("failed", 0) + n.get("error", 0) + n.get("errors", 0)
        runs.append({"passed": n.get("passed", 0), "failed": failed, "seconds": float(seconds)})
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path printed)")
    args = parser.parse_args(argv)
    head = subprocess.run(
        ["git", "-C", args.repo, "rev-parse", "--short", "HEAD"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="bench_make_test_"))
    clone = folder / "repo"
    subprocess.run(["git", "clone", "--quiet", args.repo, str(clone)], check=True)
    start = time.perf_counter()
    done = subprocess.run(
        ["bash", ".ci/run"], cwd=clone, env={**os.environ, "CI": "true"},
        capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    (folder / "output.txt").write_text(output)
    runs = pytest_runs(output)
    if args.keep:
        print(f"the clone and its output are kept in {folder}")
    else:
        shutil.rmtree(folder)
    names = ["main suite", "ArviZ 1.x tests"][: len(runs)] + ["pytest"] * max(0, len(runs) - 2)
    lines = [
        "# `make test` on a fresh clone (`bash .ci/run`)",
        "",
        f"Commit {head}, {os.cpu_count()} CPUs; `python benchmarks/bench_make_test.py`.",
        "",
        "| part | seconds |",
        "|---|---:|",
        f"| the whole command (exit code {done.returncode}) | {seconds:.0f} |",
        *(
            f"| {n}: {r['passed']} passed, {r['failed']} failed | {r['seconds']:.0f} |"
            for n, r in zip(names, runs, strict=True)
        ),
        f"| installs, ruff, Sphinx (the rest) | {seconds - sum(r['seconds'] for r in runs):.0f} |",
        "",
        f"Limit {LIMIT_S} s: **{'met' if seconds <= LIMIT_S else 'missed'}**.",
    ]
    payload = {
        "commit": head,
        "returncode": done.returncode,
        "seconds": seconds,
        "pytest_runs": runs,
        "limit_s": LIMIT_S,
    }
    record("bench_make_test", payload, "\n".join(lines) + "\n")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
