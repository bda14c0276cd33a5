"""Update time across emulated hosts on shaped links, beside the simulator's (needs root).

``python -m benchmarks.netbed`` (the code: :mod:`benchmarks.netbed.bench`); results here:
netbed.json (a repeat: netbed-repeat.json; announced steps: netbed-announce.json), netbed.md."""

from .bench import SYSTEMS, main

__all__ = ["SYSTEMS", "main"]
