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
    """Load ``results.json`` of a run folder, checking its schema version and layout.

    Raises:
        FileNotFoundError: no ``results.json`` there.
        ValueError: not JSON, another schema, or not the layout of the module
            docstring (a ``records`` list of tables, each with a ``method`` name);
            the message names the file and the first bad entry.
    """
    path = Path(run_dir) / "results.json"
    if Path(run_dir).is_file():
        raise ValueError(f"{str(run_dir)!r} is a file; give the run folder that holds results.json")
    if not path.is_file():
        raise FileNotFoundError(f"no results.json in {str(run_dir)!r}")
    where = str(path)
    try:
        payload = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{where!r} is not a text file: {e}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{where!r} is not valid JSON: {e}") from e
    if not isinstance(payload, dict):
        raise ValueError(f"{where!r} is not a results file: it holds a {type(payload).__name__}")
    if payload.get("schema") != SCHEMA_VERSION:
        raise ValueError(
            f"{where!r} has schema {payload.get('schema')!r}, this version reads {SCHEMA_VERSION}"
        )
    records = payload.get("records")
    if not isinstance(records, list):
        raise ValueError(f"{where!r}: 'records' must be a list of results, got {records!r:.80}")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise ValueError(f"{where!r}: records[{i}] must be a table, got {r!r:.80}")
        if not isinstance(r.get("method"), str):
            raise ValueError(
                f"{where!r}: records[{i}] has no method name (method = {r.get('method')!r:.80})"
            )
    if not isinstance(payload.get("config", {}), dict):
        raise ValueError(f"{where!r}: 'config' must be a table of settings")
    return payload
