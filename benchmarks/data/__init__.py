"""The data paths: loading overlapped with compute, dask arrays, set-up time, memory, streams.

``python -m benchmarks.data`` (the code: :mod:`benchmarks.data.bench`); results here: data.md,
data-memory.png."""

from .bench import main

__all__ = ["main"]
