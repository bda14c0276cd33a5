"""Sphinx configuration for the adadamp documentation.

Build with warnings as errors (what CI does through ``tests/project/test_docs.py``)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Nothing here reaches the network, and neither do the built pages: there is no
intersphinx (references to PyTorch, Dask or scikit-learn objects are written as
plain text or links), MathJax is served from the built docs
(``sphinx-mathjax-offline``) and the theme bundles its fonts and scripts, so the
docs read the same on an air-gapped cluster.  The gallery (``docs/gallery``) is
run by the build: short fits on the embedded cluster (sphinx-gallery).
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
    "sphinx-mathjax-offline",  # MathJax from _static/mathjax, not a CDN
    "sphinx_gallery.gen_gallery",
    "numpydoc",
]

exclude_patterns = ["_build", "gallery/README.rst"]
templates_path = []
html_static_path = ["_static"]
html_css_files = ["adadamp.css"]
html_theme = "pydata_sphinx_theme"  # scikit-learn's theme
html_title = "adadamp"
html_theme_options = {
    "logo": {"text": "adadamp"},
    "navbar_align": "left",
    "header_links_before_dropdown": 6,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}

sphinx_gallery_conf = {
    "examples_dirs": "gallery",
    "gallery_dirs": "auto_examples",
    "filename_pattern": "/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "show_signature": False,
    "image_scrapers": ("matplotlib",),
}

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
