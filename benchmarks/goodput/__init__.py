"""Goodput against tuned constant batches and GeoDamp: time to a target test accuracy.

``python -m benchmarks.goodput`` (the code: :mod:`benchmarks.goodput.bench`); results here:
goodput.json (a repeat: goodput-repeat.json), goodput.md, goodput.png."""

from .bench import high_target, main, summary, target

__all__ = ["high_target", "main", "summary", "target"]
