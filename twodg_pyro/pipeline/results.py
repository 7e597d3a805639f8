"""The results table: ``results.json`` and ``results.md`` in a run folder.

``results.json`` schema::

    {"schema": 1, "config": {...all settings...},
     "records": [{"method": str, "accuracy": float, "nll": float, "ece": float,
                  "brier": float, "trainable_params": int, ...}, ...]}

Records of weight-sharing methods add ``n_outliers``, ``n_ellipses``,
``n_gaussians``, ``compression_ratio``, ``size_mb`` and ``size_mb_with_index``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..io.files import atomic_write_text

__all__ = ["write_results", "read_results", "format_table", "atomic_write_text"]

SCHEMA_VERSION = 1

_COLUMNS = [
    ("method", "method", "{}"),
    ("kl_weight", "KL weight", "{:g}"),
    ("accuracy", "acc", "{:.4f}"),
    ("nll", "NLL", "{:.4f}"),
    ("ece", "ECE", "{:.4f}"),
    ("brier", "Brier", "{:.4f}"),
    ("trainable_params", "trainable", "{:,}"),
    ("compression_ratio", "compression", "{:.1f}x"),
    ("n_outliers", "#outliers", "{:,}"),
    ("n_ellipses", "#ellipses", "{:,}"),
    ("n_gaussians", "#Gaussians", "{:,}"),
    ("size_mb", "MB", "{:.4f}"),
    ("size_mb_with_index", "MB+index", "{:.4f}"),
    ("train_seconds", "train s", "{:.1f}"),
]


def format_table(records: list[dict]) -> str:
    """A markdown table with the columns that any record has."""
    cols = [c for c in _COLUMNS if any(c[0] in r for r in records)]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("-")
            else:
                try:
                    cells.append(fmt.format(v))
                except (ValueError, TypeError):
                    cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(out_dir: str | Path, records: list[dict], config: dict | None = None) -> Path:
    """Write ``results.json`` and ``results.md`` atomically; returns the JSON path."""
    out_dir = Path(out_dir)
    payload = {"schema": SCHEMA_VERSION, "config": config or {}, "records": records}
    atomic_write_text(out_dir / "results.json", json.dumps(payload, indent=2, sort_keys=True))
    atomic_write_text(out_dir / "results.md", format_table(records))
    return out_dir / "results.json"


def read_results(run_dir: str | Path) -> dict:
    """Load ``results.json`` of a run folder, checking its schema version."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results.json in {str(run_dir)!r}")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if payload.get("schema") != SCHEMA_VERSION:
        raise ValueError(
            f"{path} has schema {payload.get('schema')!r}, this version reads {SCHEMA_VERSION}"
        )
    return payload
