"""Update time as the cluster grows from 1 to 16 workers, with fixed per-worker compute.

``python -m benchmarks.scaling`` (the code: :mod:`benchmarks.scaling.bench`); results here:
scaling.md."""

from .bench import main

__all__ = ["main"]
