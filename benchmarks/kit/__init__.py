"""What the training kit costs: mixed precision and torch.compile, adadamp against plain PyTorch.

``python -m benchmarks.kit`` (the code: :mod:`benchmarks.kit.bench`); results here: kit.json, kit.md."""

from .bench import main

__all__ = ["main"]
