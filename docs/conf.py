"""Sphinx configuration of perfkernels' documentation site (``python -m perfkernels docs``).

Why Sphinx: its autodoc reads the docstrings of compiled (Cython) functions, with the signatures
they embed, from the imported package, and napoleon reads their sections; myst-parser renders the
Markdown guides of docs/ as they are, so the guides stay readable on GitHub; and
``-W --keep-going -n`` makes every warning, and every reference to something undocumented, fail
the build.  mkdocstrings reads source files instead, and has no view of the extension modules.
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import perfkernels  # noqa: E402

project = "perfkernels"
author = "the perfkernels authors"
copyright = "the perfkernels authors"
release = version = perfkernels.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Markdown: GitHub's heading anchors (the guides link to #sections of each other)
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = True

html_theme = "furo"
html_title = f"perfkernels {release}"
html_show_sourcelink = False

# -n (nitpicky): every cross-reference to perfkernels' own public names must resolve.  The site
# is built offline (no intersphinx), so references into torch, NumPy and Python, the
# docstrings' free-form type fields ("float32 [N, D]") and private helper classes in signatures
# are not checked.
nitpicky = True
nitpick_ignore_regex = [
    ("py:class", r"(?!perfkernels\.).*"),                 # outside perfkernels, or free-form types
    ("py:class", r"perfkernels\.(.*\.)?_\w+.*"),          # private classes in signatures
    ("py:(class|meth|func|exc|data|obj|attr)", r"(torch|numpy|np|ml_dtypes|collections|typing)\..*"),
]
