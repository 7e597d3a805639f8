r"""Docstrings say what they were written to say: every docstring of the package in which a
backslash appears (LaTeX in ``:math:``) is a raw string, so that ``\a`` of ``\arg\max``
does not become a BEL character in ``help()``; and none holds a control character."""

from __future__ import annotations

import ast
import pydoc
from pathlib import Path

import twodg_pyro

PACKAGE = Path(twodg_pyro.__file__).parent


def docstring_literals():
    """``(where, source text of the literal, its value)`` of every docstring."""
    for path in sorted(PACKAGE.rglob("*.py")):
        src = path.read_text()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                continue
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    where = f"{path.relative_to(PACKAGE.parent)}:{first.lineno}"
                    text = ast.get_source_segment(src, first.value)
                    yield where, text, first.value.value


def test_every_docstring_with_a_backslash_is_raw_and_none_holds_control_characters():
    literals = list(docstring_literals())
    assert len(literals) > 500
    not_raw = [w for w, text, _ in literals if "\\" in text and not text.startswith(("r", "R"))]
    assert not not_raw, f"docstrings with a backslash that are not raw strings: {not_raw}"
    control = [w for w, _, value in literals if any(c in value for c in "\a\b\f\v\x00")]
    assert not control, f"docstrings holding control characters: {control}"


def test_help_shows_the_mathematics_as_written():
    text = pydoc.render_doc(twodg_pyro.MahalanobisHook, renderer=pydoc.plaintext)
    assert r"\arg\max_k" in text and "\a" not in text
