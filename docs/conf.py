"""Sphinx configuration: the guides (markdown, MyST) and the API reference (autodoc).

Build: ``python -m sphinx -W -b html docs build/docs`` (``make docs``; ``make test`` runs
it with warnings as errors).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's package, installed or not

from twodg_pyro import __version__  # noqa: E402

project = "twodg_pyro"
author = "twodg_pyro authors"
release = __version__
version = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
master_doc = "index"
exclude_patterns = ["_build"]

# markdown: `$...$` stays literal (the guides write code in backticks); headings to
# level 3 get anchors
myst_heading_anchors = 3

# the docstrings are Google style (Args:, Returns:, Raises:) with RST math
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "separated"
autodoc_inherit_docstrings = False

html_theme = "alabaster"
html_title = f"twodg_pyro {__version__}"
