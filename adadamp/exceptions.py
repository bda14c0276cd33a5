"""Errors adadamp raises on purpose."""

from __future__ import annotations


class ConvergenceError(ArithmeticError):
    """The training loss became non-finite; the last finite weights are kept."""


class NoWorkersError(RuntimeError):
    """No Dask worker was left to train on, and none joined in time."""


class SchedulerLostError(RuntimeError):
    """The Dask scheduler is gone: training cannot go on; resume from a checkpoint."""
