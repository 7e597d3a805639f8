"""The size of the library: lines of ``twodg_pyro/`` per package, and how many of them are
docstrings or blank (issue 22's limit counts every line).

    python benchmarks/library_size.py [--json]

A docstring is the first statement of a module, class or function when it is a string
literal (its lines, first to last); a blank line holds only whitespace.  Root-level
modules (``twodg_pyro/*.py``) are the row ``(root)``.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "twodg_pyro"
SCOPES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def count(path: Path) -> dict[str, int]:
    """``{"lines", "docstrings", "blank"}`` of one Python file."""
    source = path.read_text()
    lines = source.splitlines()
    docstrings = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, SCOPES) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    docstrings += first.end_lineno - first.lineno + 1
    blank = sum(1 for line in lines if not line.strip())
    return {"lines": len(lines), "docstrings": docstrings, "blank": blank}


def library_size(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """Counts per package (``(root)`` for the root-level modules) and ``total``."""
    rows: dict[str, dict[str, int]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        name = rel.parts[0] if len(rel.parts) > 1 else "(root)"
        row = rows.setdefault(name, {"lines": 0, "docstrings": 0, "blank": 0})
        for key, value in count(path).items():
            row[key] += value
    rows["total"] = {k: sum(r[k] for r in rows.values()) for k in ("lines", "docstrings", "blank")}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rows = library_size()
    if parser.parse_args().json:
        print(json.dumps(rows, indent=2))
        return
    print("| package | lines | docstrings | blank | other |")
    print("|---|---:|---:|---:|---:|")
    for name, r in sorted(rows.items(), key=lambda kv: (kv[0] == "total", -kv[1]["lines"])):
        other = r["lines"] - r["docstrings"] - r["blank"]
        print(f"| {name} | {r['lines']:,} | {r['docstrings']:,} | {r['blank']:,} | {other:,} |")


if __name__ == "__main__":
    main()
