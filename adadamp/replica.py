"""Moved to :mod:`adadamp.worker.replica` (the worker layer); this path, documented before the
move, keeps importing."""

from .worker.replica import Buckets, Replica, collective_backend, step_vector

__all__ = ["Buckets", "Replica", "collective_backend", "step_vector"]
