"""The results table: ``results.json`` and ``results.md`` in a run folder.

``results.json`` schema::

    {"schema": 1, "config": {...all settings...},
     "evaluation": {"num_samples": int, "seed": int, "sample_chunk": int,
                    "n_examples": int, "split": "test"},
     "records": [{"method": str, "accuracy": float, "nll": float, "ece": float,
                  "brier": float, "trainable_params": int, ...}, ...],
     "complete": bool,
     "incomplete": {"failed_method": str, "error": str, "finished": [str, ...]}
                or {"failed_files": {step: error}, "error": str, "finished": [str, ...]}}

``complete`` is false when a method failed (the table then holds the methods that
finished before it, whose model files are kept, and ``incomplete`` says which failed
and why) or when a model file could not be written (``failed_files``: the table is
whole, a file is missing; :func:`~twodg_pyro.pipeline.run` then raises
:class:`IncompleteRunError`).  Files written before it was recorded have neither key.

Records of weight-sharing methods add ``n_outliers``, ``n_ellipses``,
``n_gaussians``, ``compression_ratio`` (floating-point numbers: mean-field's over the
trainable ones, no index), ``size_mb`` and ``size_mb_with_index``.

What a user deploys (:mod:`twodg_pyro.pipeline.outputs.costs`): every record of a method the run
trained has ``file`` and ``file_bytes`` (the size of the smallest file the library
writes for it and loads back: ``model_2dg.2dgz`` for 2DG, ``model_<method>.pt`` for the
others, the computed float32 size for the deterministic network, which also has
``file_bytes_int8``), ``bytes_per_weight``, ``float32_ratio`` (the float32 deterministic
network's bytes over ``file_bytes``), ``forwards_per_prediction``, ``predict_seconds``
and ``relative_predict_seconds`` (over the deterministic network's, same run).  The table
shows them beside the counts of floats, whose columns say "(floats)".

``evaluation`` says which draws and examples the Bayesian rows' metrics used
(:mod:`twodg_pyro.evaluation`: ``num_samples`` posterior draws seeded with the run's
seed, on the test split); ``results.md`` states it under the table.  Files of runs
written before it was recorded have no ``evaluation`` (and no such line).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ...evaluation import draws_record, n_examples
from ...files.atomic import atomic_write_text

SCHEMA_VERSION = 1

_COLUMNS = [
    ("method", "method", "{}"),
    ("kl_weight", "KL weight", "{:g}"),
    ("accuracy", "acc", "{:.4f}"),
    ("nll", "NLL", "{:.4f}"),
    ("ece", "ECE", "{:.4f}"),
    ("brier", "Brier", "{:.4f}"),
    ("trainable_params", "trainable", "{:,}"),
    ("compression_ratio", "compression (floats)", "{:.1f}x"),
    ("n_outliers", "#outliers", "{:,}"),
    ("n_ellipses", "#ellipses", "{:,}"),
    ("n_gaussians", "#Gaussians", "{:,}"),
    ("size_mb", "MB (floats)", "{:.4f}"),
    ("size_mb_with_index", "MB+index", "{:.4f}"),
    ("file_bytes", "file bytes", "{:,}"),
    ("bytes_per_weight", "bytes/weight", "{:.3f}"),
    ("float32_ratio", "x smaller than fp32 det", "{:.1f}x"),
    ("forwards_per_prediction", "forwards", "{:,}"),
    ("relative_predict_seconds", "predict time / det", "{:.1f}x"),
    ("train_seconds", "train s", "{:.1f}"),
]


def format_table(records: list[dict]) -> str:
    """A markdown table with the columns that any record has: ``-`` marks a value that is
    missing or does not apply (e.g. the compression of mean-field); a NaN (a metric that
    was computed and is not a number) is printed ``nan``, infinities ``inf``."""
    cols = [c for c in _COLUMNS if any(c[0] in r for r in records)]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        lines.append("| " + " | ".join(_cell(r.get(key), fmt) for key, _, fmt in cols) + " |")
    return "\n".join(lines) + "\n"


def evaluation_note(evaluation: dict | None) -> str:
    """The line under the table saying which draws and examples its metrics used
    (``""`` without an evaluation record)."""
    if not isinstance(evaluation, dict):
        return ""
    try:
        return (
            f"\nMetrics of the Bayesian rows: N_s = {int(evaluation['num_samples'])} posterior "
            f"draws seeded with {int(evaluation['seed'])} on the {int(evaluation['n_examples']):,} "
            f"{evaluation.get('split', 'test')} examples (the same draws as diagnostics.json, "
            "reliability.png and `twodg-pyro evaluate model_<method>.pt`); deterministic: "
            "one forward pass.  File bytes: the method's smallest file that loads back "
            "(model_2dg.2dgz for 2dg, model_<method>.pt, the deterministic network at "
            "float32 computed); bytes/weight over the network's parameters.\n"
        )
    except (KeyError, TypeError, ValueError):
        return ""


def _cell(v, fmt: str) -> str:
    """One cell: ``-`` for a missing value, ``nan`` for NaN, else ``fmt`` (or ``str``)."""
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def _worst_shift_nll(shift) -> float | None:
    """The mean over the corruption families of the NLL at the most severe level (``None``
    when there is none, or the record is not of that layout)."""
    try:
        nlls = [fam[max(fam, key=int)]["nll"] for fam in shift.values()]
        return sum(nlls) / len(nlls) if nlls else None
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def uncertainty_table(records: list[dict]) -> str:
    """The uncertainty columns of the records that have them (``[uncertainty] enabled``):
    mean clean MI, AURC, each OOD set's entropy AUROC (MI AUROC) and the mean over the
    corruption families of the NLL at the most severe level; ``""`` when none has them."""
    rows = [r for r in records if isinstance(r.get("ood"), dict)]
    if not rows:
        return ""
    sets = list(rows[0]["ood"])
    head = ["method", "mean MI", "AURC", *(f"AUROC {s}" for s in sets), "NLL, worst shift"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["method"]), *(_cell(r.get(k), "{:.4f}") for k in ("mean_mi_clean", "aurc"))]
        for s in sets:
            m = r["ood"].get(s)
            m = m if isinstance(m, dict) else {}
            cell = _cell(m.get("entropy_auroc"), "{:.3f}")
            cells.append(cell + (f" ({_cell(m['mi_auroc'], '{:.3f}')})" if "mi_auroc" in m else ""))
        cells.append(_cell(_worst_shift_nll(r.get("shift")), "{:.3f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return (
        "\nUncertainty (entropy AUROC, MI AUROC in brackets; `ood` and `shift` in "
        "results.json):\n\n" + "\n".join(lines) + "\n"
    )


class IncompleteRunError(OSError):
    """A run trained every method but could not write a model file (e.g. a full disk):
    its ``results.json`` says ``"complete": false``, naming the file."""


def incomplete_note(incomplete: dict | None) -> str:
    """The line above the table of an incomplete run (``""`` for a complete one)."""
    if not isinstance(incomplete, dict):
        return ""
    if "failed_files" in incomplete:
        return (
            f"**Incomplete run**: model file(s) {', '.join(incomplete['failed_files'])} could "
            f"not be written ({incomplete.get('error')!s}); no diagnostics were written.\n\n"
        )
    return (
        f"**Incomplete run**: method {incomplete.get('failed_method')!s} failed "
        f"({incomplete.get('error')!s}); the rows below are the methods that finished, "
        "their model files are kept, and no diagnostics were written.\n\n"
    )


def format_results(payload: dict) -> str:
    """``results.md``: the table of ``payload["records"]``, the evaluation line and, when
    the run measured it, the uncertainty table (:func:`uncertainty_table`)."""
    records = payload["records"]
    return (
        incomplete_note(payload.get("incomplete"))
        + format_table(records)
        + evaluation_note(payload.get("evaluation"))
        + uncertainty_table(records)
    )


def write_results(
    out_dir: str | Path,
    records: list[dict],
    config: dict | None = None,
    evaluation: dict | None = None,
    incomplete: dict | None = None,
) -> Path:
    """Write ``results.json`` and ``results.md`` atomically; returns the JSON path.

    ``evaluation``: which draws and examples the metrics used
    (:func:`~twodg_pyro.evaluation.draws_record`).  ``incomplete``: for a run that a
    method's failure stopped, ``{"failed_method", "error", "finished"}``, or whose model
    files could not all be written, ``{"failed_files", "error", "finished"}``; the file
    then has ``"complete": false`` (a finished run: ``"complete": true``)."""
    out_dir = Path(out_dir)
    payload = {"schema": SCHEMA_VERSION, "config": config or {}, "records": records}
    payload["complete"] = incomplete is None
    optional = {"incomplete": incomplete, "evaluation": evaluation}
    payload.update({k: v for k, v in optional.items() if v is not None})
    atomic_write_text(out_dir / "results.json", json.dumps(payload, indent=2, sort_keys=True))
    atomic_write_text(out_dir / "results.md", format_results(payload))
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


def evaluation_of(cfg, eval_data) -> dict:
    """How the Bayesian rows of the results table were evaluated (``results.json``'s
    ``evaluation``): ``cfg.num_samples`` draws seeded with the run's seed on the test split
    (:mod:`twodg_pyro.evaluation`)."""
    return draws_record(cfg.num_samples, cfg.seed, n_examples(eval_data), "test")


def kl_weight_field(kl_weight: float) -> dict:
    """``{"kl_weight": beta}`` for a record trained on a tempered ELBO, ``{}`` at 1."""
    return {} if kl_weight == 1.0 else {"kl_weight": kl_weight}


def size_mb(n_params: int, bytes_per_param: int = 4) -> float:
    """Storage of ``n_params`` float32 numbers in MB (:math:`10^6` bytes)."""
    return n_params * bytes_per_param / 1e6
