"""The all-reduce backend: model-size sweep, membership change, SIGKILL, the simulator's calibration.

``python -m benchmarks.allreduce`` (the code: :mod:`benchmarks.allreduce.bench`); results here:
allreduce.json, allreduce.md, allreduce-calibration.json."""

from .bench import MLP, main

__all__ = ["MLP", "main"]
