"""Sphinx configuration for the adadamp documentation.

Build with warnings as errors (what CI does through ``tests/test_docs.py``)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Nothing here reaches the network: there is no intersphinx, so references to
PyTorch, Dask or scikit-learn objects are written as plain text or links.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import adadamp

project = "adadamp"
author = "adadamp contributors"
copyright = "adadamp contributors"
release = adadamp.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "numpydoc",
]

exclude_patterns = ["_build"]
templates_path = []
html_static_path = []
html_theme = "alabaster"
html_theme_options = {"description": "PyTorch on Dask, with batch sizes that grow", "fixed_sidebar": False}

# Document members in source order, with their type hints in the signature.
autodoc_member_order = "bysource"
autodoc_default_options = {}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

# numpydoc renders the Parameters/Returns/Examples sections.  Members are
# listed by autodoc itself, so numpydoc must not add a second table of them
# (which would also need autosummary stubs).
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# The docstrings' examples are doctested by the test suite, not by Sphinx.
