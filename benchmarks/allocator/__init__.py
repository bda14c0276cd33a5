"""The allocator's division as the fits sharing a cluster grow.

``python -m benchmarks.allocator`` (the code: :mod:`benchmarks.allocator.bench`); results here:
allocator.json, allocator.md."""

from .bench import main

__all__ = ["main"]
