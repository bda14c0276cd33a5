"""Per-update traces of a run: measured (:func:`from_history`) or planned from a schedule
(:func:`schedule_updates`, the real GeoDamp and cluster policy through the engine's loop)."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..cluster.policy import ClusterPolicy
from ..dampers import GeoDamp, simulate_schedule
from .network import _as_counts
from .timing import _n_rescales


@dataclass(frozen=True, eq=False)
class UpdateTrace:
    """Per-update record of a run (real, from a history, or planned).

    Parameters
    ----------
    batch_sizes : array of int
        Examples in each update.
    n_workers : array of int
        Workers in each update.
    epochs : array of int
        Epoch index (0-based) of each update; non-decreasing.
    compute_times : array of float, optional
        Measured seconds of the slowest worker's gradient computation.
    update_times : array of float, optional
        Measured wall seconds of each whole update.
    epoch_times : array of float, optional
        Measured wall seconds of each epoch (index = epoch).

    Examples
    --------
    >>> tr = UpdateTrace([128, 128, 44], [1, 1, 1], [0, 0, 0])
    >>> tr.n_updates, tr.n_epochs, tr.n_examples
    (3, 1, 300)
    """

    batch_sizes: NDArray[np.int64]
    n_workers: NDArray[np.int64]
    epochs: NDArray[np.int64]
    compute_times: NDArray[np.float64] | None = None
    update_times: NDArray[np.float64] | None = None
    epoch_times: NDArray[np.float64] | None = None

    def __post_init__(self) -> None:
        b = _as_counts(self.batch_sizes, "batch_sizes")
        p = _as_counts(self.n_workers, "n_workers")
        e = np.atleast_1d(np.asarray(self.epochs)).astype(np.int64)
        if not (b.shape == p.shape == e.shape):
            raise ValueError("batch_sizes, n_workers and epochs must have the same length.")
        if e.size and (e.min() < 0 or np.any(np.diff(e) < 0)):
            raise ValueError("epochs must be >= 0 and non-decreasing.")
        object.__setattr__(self, "batch_sizes", b)
        object.__setattr__(self, "n_workers", p)
        object.__setattr__(self, "epochs", e)
        for name in ("compute_times", "update_times"):
            v = getattr(self, name)
            if v is not None:
                v = np.atleast_1d(np.asarray(v, dtype=np.float64))
                if v.shape != b.shape:
                    raise ValueError(f"{name} must have one entry per update.")
                object.__setattr__(self, name, v)
        if self.epoch_times is not None:
            v = np.atleast_1d(np.asarray(self.epoch_times, dtype=np.float64))
            if e.size and v.size < int(e.max()) + 1:
                raise ValueError("epoch_times must have one entry per epoch.")
            object.__setattr__(self, "epoch_times", v)

    @property
    def n_updates(self) -> int:
        """Number of model updates."""
        return int(self.batch_sizes.size)

    @property
    def n_epochs(self) -> int:
        """Number of epochs (``max(epochs) + 1``, or the epoch_times length)."""
        n = int(self.epochs.max()) + 1 if self.epochs.size else 0
        if self.epoch_times is not None:
            n = max(n, int(self.epoch_times.size))
        return n

    @property
    def n_examples(self) -> int:
        """Examples processed over the run."""
        return int(self.batch_sizes.sum())

    @property
    def n_rescales(self) -> int:
        """Updates whose worker count differs from the previous update's."""
        return _n_rescales(self.n_workers)

    @property
    def measured_time(self) -> float:
        """Measured seconds: the epoch times if known, else the update times.

        Raises
        ------
        ValueError
            If the trace holds no timings.
        """
        if self.epoch_times is not None:
            return float(self.epoch_times.sum())
        if self.update_times is not None:
            return float(self.update_times.sum())
        raise ValueError("this trace has no measured times.")


def from_history(
    history: Sequence[Mapping[str, Any]] | Any,
    *,
    compute_key: str = "compute_time",
    time_key: str = "update_time",
    epoch_time_key: str = "dur",
) -> UpdateTrace:
    """Read an estimator's ``history_`` into an :class:`UpdateTrace`.

    Parameters
    ----------
    history : list of dict, or an object with ``history_``
        One dict per epoch, each with an ``"updates"`` list of per-update
        dicts.  Every update needs ``"batch_size"`` (examples actually used)
        and ``"n_workers"``; ``compute_key`` (seconds of the slowest worker's
        gradient) and ``time_key`` (wall seconds of the whole update) are read
        when every update has them.  The epoch of an update is the position
        of its epoch dict in the list.
    compute_key, time_key : str
        Keys of the per-update timings.
    epoch_time_key : str, default "dur"
        Key of an epoch's wall seconds, read when every epoch has it.

    Returns
    -------
    UpdateTrace

    Raises
    ------
    ValueError
        If a required key is missing, or a timing key is present in only
        some of the updates.

    Examples
    --------
    >>> hist = [{"dur": 0.5, "updates": [
    ...     {"batch_size": 64, "n_workers": 2, "compute_time": 0.1, "update_time": 0.2},
    ...     {"batch_size": 36, "n_workers": 2, "compute_time": 0.06, "update_time": 0.15}]}]
    >>> tr = from_history(hist)
    >>> tr.batch_sizes.tolist(), tr.n_workers.tolist(), tr.measured_time
    ([64, 36], [2, 2], 0.5)
    """
    if hasattr(history, "history_"):
        history = history.history_
    b: list[int] = []
    p: list[int] = []
    e: list[int] = []
    comp: list[Any] = []
    wall: list[Any] = []
    durs: list[Any] = []
    for i, ep in enumerate(history):
        if "updates" not in ep:
            raise ValueError(f"epoch {i} of the history has no 'updates' list.")
        durs.append(ep.get(epoch_time_key))
        for j, u in enumerate(ep["updates"]):
            for key in ("batch_size", "n_workers"):
                if key not in u:
                    raise ValueError(f"update {j} of epoch {i} has no {key!r}.")
            b.append(u["batch_size"])
            p.append(u["n_workers"])
            e.append(i)
            comp.append(u.get(compute_key))
            wall.append(u.get(time_key))

    def _all_or_none(values: list[Any], key: str) -> NDArray[np.float64] | None:
        present = [v is not None for v in values]
        if not values or not any(present):
            return None
        if not all(present):
            raise ValueError(f"{key!r} is present in only some entries of the history.")
        return np.asarray(values, dtype=np.float64)

    return UpdateTrace(
        np.asarray(b, dtype=np.int64),
        np.asarray(p, dtype=np.int64),
        np.asarray(e, dtype=np.int64),
        compute_times=_all_or_none(comp, compute_key),
        update_times=_all_or_none(wall, time_key),
        epoch_times=_all_or_none(durs, epoch_time_key),
    )


def schedule_updates(
    *,
    n_data: int,
    epochs: int,
    initial: int,
    factor: float = 5.0,
    delay: int = 60,
    max_batch_size: int | None = None,
    grads_per_worker: int = 128,
    min_workers: int = 1,
    max_workers: int | None = None,
) -> UpdateTrace:
    """Expand a GeoDamp schedule into per-update batch sizes and workers.

    The real :class:`~adadamp.dampers.GeoDamp` is run through the engine's
    epoch loop (:func:`~adadamp.dampers.simulate_schedule`): at epoch ``e``
    the damping is ``D = initial * factor ** (e // delay)`` and the batch
    ``B = min(ceil(D), cap)`` (Holt & Sievert 2021, "Increasing the batch size"; once the cap is
    hit GeoDamp decays the learning rate instead, which does not change the
    timing).  Each epoch runs ``ceil(n_data / B)`` updates, all of ``B``
    examples except the last, which takes the remainder (this epoch
    accounting reproduces the paper's Table 1, e.g. max batch 640:
    ``391 * 60 + 79 * 140 = 34,520``).  Workers per update: the real
    :class:`~adadamp.cluster.ClusterPolicy`, ``clip(ceil(B / grads_per_worker),
    min_workers, max_workers)`` (Holt & Sievert 2021, "Architecture").

    Parameters
    ----------
    n_data : int
        Training examples (50,000 for CIFAR-10).
    epochs : int
        Epochs to run.
    initial : int
        Batch size at epoch 0.
    factor : float, default 5
        Growth factor of the damping every ``delay`` epochs (1 = constant).
    delay : int, default 60
        Epochs between growths.
    max_batch_size : int, optional
        Cap on the batch size (default: none besides ``n_data``).
    grads_per_worker : int, default 128
        Examples per worker the cluster policy aims for.
    min_workers : int, default 1
        Fewest workers.
    max_workers : int, optional
        Most workers (default: no limit).

    Returns
    -------
    UpdateTrace
        Without timings.

    Examples
    --------
    >>> tr = schedule_updates(n_data=50_000, epochs=200, initial=128,
    ...                       max_batch_size=640)
    >>> tr.n_updates, int(tr.n_workers.max())
    (34520, 5)
    >>> tr.batch_sizes[389:391].tolist()  # end of epoch 0: 390 * 128 + 80
    [128, 80]
    """
    for value, name, low in (
        (n_data, "n_data", 1),
        (epochs, "epochs", 0),
        (initial, "initial", 1),
        (delay, "delay", 1),
        (grads_per_worker, "grads_per_worker", 1),
        (min_workers, "min_workers", 1),
    ):
        if int(value) != value or value < low:
            raise ValueError(f"{name} must be an integer >= {low}; got {value!r}.")
    if not factor >= 1:
        raise ValueError(f"factor must be >= 1; got {factor!r}.")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1; got {max_batch_size!r}.")
    if max_workers is not None and max_workers < min_workers:
        raise ValueError("max_workers must be >= min_workers.")
    damper = GeoDamp(initial=int(initial), delay=int(delay), factor=factor, max_batch_size=max_batch_size)
    policy = ClusterPolicy(
        grads_per_worker=int(grads_per_worker),
        min_workers=int(min_workers),
        max_workers=sys.maxsize if max_workers is None else int(max_workers),
    )
    trace = simulate_schedule(damper, n_data=int(n_data), max_epochs=int(epochs))  # the engine's own loop
    batches = np.array([r["batch_size"] for r in trace], dtype=np.int64)
    workers = np.array([policy.wanted(r["requested"]) for r in trace], dtype=np.int64)
    epochs_of = np.array([math.floor(r["epoch"] + 1e-9) for r in trace], dtype=np.int64)
    return UpdateTrace(batches, workers, epochs_of)
