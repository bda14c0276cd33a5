"""Idle workers lent to a fit that wants one.

``python -m benchmarks.lending`` (the code: :mod:`benchmarks.lending.bench`); results here:
lending.json, lending.md."""

from .bench import main

__all__ = ["main"]
