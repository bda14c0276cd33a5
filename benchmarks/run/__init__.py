"""The throughput suite: plain PyTorch, DDP, skorch and adadamp (both backends) on W1-W3, and the floor.

``python -m benchmarks.run`` (the code: :mod:`benchmarks.run.bench`); results here: results.md
(results-quick.md with --quick)."""

from .bench import main, paired_ratio, tables

__all__ = ["main", "paired_ratio", "tables"]
