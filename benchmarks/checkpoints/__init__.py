"""What periodic checkpoints cost a long fit.

``python -m benchmarks.checkpoints`` (the code: :mod:`benchmarks.checkpoints.bench`); results here:
checkpoints.json, checkpoints.md."""

from .bench import main

__all__ = ["main"]
