"""Where a whole fit's time goes besides its updates, phase by phase.

``python -m benchmarks.setup_phases`` (the code: :mod:`benchmarks.setup_phases.bench`); results
here: setup_phases.md."""

from .bench import main

__all__ = ["main"]
