"""The time left the progress displays show, against the time the fit really took.

``python -m benchmarks.time_left`` (the code: :mod:`benchmarks.time_left.bench`); prints a table."""

from .bench import main

__all__ = ["main"]
