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


def interleaved(fns: dict, repeats: int, inner: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each function, measured in alternating rounds so that
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
    return {k: statistics.median(v) for k, v in times.items()}


def record(name: str, payload: dict, markdown: str) -> None:
    """Write ``results/<name>.json`` and ``results/<name>.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine(), "command": f"python benchmarks/{name}.py", **payload}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2))
    (RESULTS / f"{name}.md").write_text(markdown)
    print(markdown)
