"""Model selection as a user runs it: GridSearchCV with adadamp, skorch and plain loops.

``python -m benchmarks.model_selection`` (the code: :mod:`benchmarks.model_selection.bench`);
results here: model_selection.json, model_selection.md."""

from .bench import main

__all__ = ["main"]
