"""Holt & Sievert 2021's Table 1 measured: time to a target accuracy, the cluster growing.

``python -m benchmarks.time_to_accuracy`` (the code: :mod:`benchmarks.time_to_accuracy.bench`);
results here: time_to_accuracy.json, time_to_accuracy.md, time_to_accuracy.png."""

from .bench import main, ratios, report

__all__ = ["main", "ratios", "report"]
