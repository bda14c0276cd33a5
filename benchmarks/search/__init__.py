"""A scikit-learn search over schedules on a shared, growing cluster.

``python -m benchmarks.search`` (the code: :mod:`benchmarks.search.bench`); results here:
search.json, search.md (search-x10.* with --device-scale 10)."""

from .bench import main

__all__ = ["main"]
