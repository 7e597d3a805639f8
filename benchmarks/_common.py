"""Helpers shared by the benchmark scripts: timing side by side, machine info, recording."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def machine() -> dict:
    """What the numbers were measured on."""
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def interleaved_rounds(
    fns: dict, repeats: int, inner: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Seconds per call of each function in each of ``repeats`` alternating rounds, so that
    drifts of the machine's speed hit every contender alike."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(inner):
                f()
            times[k].append((time.perf_counter() - t) / inner)
    return times


def interleaved(fns: dict, repeats: int, inner: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each function over :func:`interleaved_rounds`."""
    rounds = interleaved_rounds(fns, repeats, inner, warmup)
    return {k: statistics.median(v) for k, v in rounds.items()}


def paired_ratios(rounds: dict[str, list[float]], base: str) -> dict[str, list[float]]:
    """Each contender's time over ``base``'s in the same round, as the quartiles ``[q1,
    median, q3]`` over the rounds: a ratio within a round escapes the drift between
    rounds that a ratio of medians keeps."""
    out = {}
    for k, v in rounds.items():
        ratios = [a / b for a, b in zip(v, rounds[base], strict=True)]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        out[k] = [q[0], statistics.median(ratios), q[2]]
    return out


def record(name: str, payload: dict, markdown: str) -> None:
    """Write ``results/<name>.json`` and ``results/<name>.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine(), "command": f"python benchmarks/{name}.py", **payload}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2))
    (RESULTS / f"{name}.md").write_text(markdown)
    print(markdown)
