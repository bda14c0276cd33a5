"""Callbacks: code that runs at named points of the training loop, split as skorch splits its own.

:mod:`.base` (the hooks, :class:`Callback`, and how ``callbacks=[...]`` resolves), :mod:`.training`
(early stopping, best-weights checkpoints, the progress bar), :mod:`.lr_scheduler` (learning-rate
schedules and warmup), :mod:`.loggers` (TensorBoard and MLflow).
"""

from ..exceptions import StopTraining  # noqa: F401 -- raised from hooks: importable beside them
from .base import Callback, resolve
from .loggers import MLflowLogger, MlflowLogger, TensorBoard
from .lr_scheduler import LRScheduler, Warmup
from .training import Checkpoint, EarlyStopping, ProgressBar

__all__ = ["Callback", "Checkpoint", "EarlyStopping", "LRScheduler", "MLflowLogger", "MlflowLogger", "ProgressBar",
           "TensorBoard", "Warmup", "resolve"]
