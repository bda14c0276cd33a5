"""Workers that differ in speed: speed-based shares against equal shares and PyTorch DDP.

``python -m benchmarks.heterogeneous`` (the code: :mod:`benchmarks.heterogeneous.bench`); results
here: heterogeneous.json (a repeat: heterogeneous-repeat.json), heterogeneous.md."""

from .bench import WARM, main, summarize, table, throughput

__all__ = ["WARM", "main", "summarize", "table", "throughput"]
