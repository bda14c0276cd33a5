"""The fit loop: epochs of model updates on a backend, with the callbacks' hooks (skorch's names),
the validation loss, checkpoints and the verbose table.

The estimator builds the :class:`~adadamp.records.TrainingState` and the backend; this loop runs
them, and publishes their progress where the estimator says (the live page on the Dask dashboard).  Hooks receive the estimator and keyword arguments: ``module``, ``optimizer``, ``damper``,
``loop`` (the clock), ``history``, and ``record`` (one update) or ``row`` (one epoch).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
from distributed import Client

from .. import checkpoint as checkpoint_mod
from ..exceptions import StopTraining
from ..records import TrainingState
from .backends.base import Backend

logger = logging.getLogger(__name__)


class Page(Protocol):
    """Where the loop publishes a fit's progress as it goes (the live page on the Dask dashboard)."""

    url: str | None

    def update(self, n_update: int, record: dict) -> None: ...

    def epoch(self, row: dict, eta: float | None) -> None: ...

    def end(self, error: str | None = None) -> None: ...

#: With ``verbose``, the fit's first epoch prints its time left after this many updates (or seconds).
FIRST_ESTIMATE = (5, 10.0)


class FitLoop:
    """Runs ``epochs`` epochs of ``state`` on a backend (a :class:`~adadamp.engine.Backend`).

    ``checkpoint`` (a path or None) is written after every epoch and every ``checkpoint_every``
    updates; ``valid`` is ``(X, y)`` held out for ``valid_loss``; ``verbose`` prints the live page's
    address, the time left once the first updates were measured, and a row per epoch.  ``page(client,
    last_epoch)`` opens where the fit's progress is published (the estimator passes the Dask
    dashboard's :class:`~adadamp.dashboard.Publisher`).  ``budgeted``: the call's last epoch is the
    training's (``fit``; not ``partial_fit``, which may be called again): dampers see it as
    ``TrainState.end_epoch``.
    """

    def __init__(self, estimator, state: TrainingState, *, checkpoint=None, checkpoint_every=None, verbose=0,
                 valid=None, page: Callable[[Client, int], Page], budgeted: bool = True):
        self.estimator = estimator
        self.budgeted = budgeted
        self.page = page
        self.state = state
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.verbose = verbose
        self.valid = valid

    def call(self, hook: str, **info) -> None:
        s = self.state
        for _, cb in s.callbacks:
            getattr(cb, hook)(
                self.estimator, module=s.module, optimizer=s.optimizer, damper=s.damper, loop=s.loop,
                history=s.history, **info,
            )

    def _on_update(self, updates: list[dict]) -> None:
        every = self.checkpoint_every
        if self.checkpoint is not None and every and self.state.loop.n_updates % every == 0:
            self._backend.sync()
            checkpoint_mod.save(self.checkpoint, self.state, updates)
        self._publisher.update(self.state.loop.n_updates, updates[-1])
        eta = self._time_left(updates)
        first = len(updates) >= FIRST_ESTIMATE[0] or time.monotonic() - self._epoch_start >= FIRST_ESTIMATE[1]
        if self.verbose and self._untold and first:
            self._untold = False
            print(f"time left: about {eta:.1f} s (estimated from the first {len(updates)} updates)", flush=True)
        self.call("on_update_end", record=updates[-1], eta=eta)

    def _time_left(self, updates: list[dict]) -> float | None:
        """Seconds left now: the epoch's starting estimate less the time since, or, in an epoch that
        started with nothing measured (a fit's first), estimated from its own updates (once a second:
        each estimate reads every update so far)."""
        now = time.monotonic()
        if self._eta is None or (self._measuring and now - self._eta_at >= 1.0):
            self._eta, self._eta_at = time_left(self.state, self._last_epoch, updates), now
        return None if self._eta is None else max(0.0, self._eta - (now - self._eta_at))

    def run(self, backend: Backend, epochs: int, epoch_updates: list[dict]) -> None:
        """``epoch_updates``: the records of the current epoch's earlier updates (resuming mid-epoch)."""
        s = self.state
        last_epoch = math.floor(s.loop.epoch + 1e-9) + epochs  # where this call ends on the epoch clock
        self._backend, self._last_epoch = backend, last_epoch
        s.loop.end_epoch = float(last_epoch) if self.budgeted else None
        self._publisher = self.page(backend.client, last_epoch)
        if self._publisher.url is not None:  # printed where the user looks; logged at verbose=0
            if self.verbose:
                print(f"live training page: {self._publisher.url}", flush=True)
            else:
                logger.info("live training page: %s", self._publisher.url)
        self.call("on_train_begin")
        try:
            for _ in range(epochs):
                eta = time_left(s, last_epoch, epoch_updates)
                self._eta, self._eta_at = eta, time.monotonic()
                self._epoch_start = self._eta_at
                self._measuring = self._untold = eta is None  # nothing measured yet: estimate as updates come
                self.call("on_epoch_begin", epoch=len(s.history) + 1, n_data=s.loop.n_data, eta=eta)
                row = backend.run_epoch(epoch_updates, self._on_update)
                epoch_updates = []
                if self.valid is not None:
                    row["valid_loss"] = validation_loss(s, *self.valid)
                s.history.append(row)
                if self.checkpoint is not None:
                    checkpoint_mod.save(self.checkpoint, s, [])
                left = time_left(s, last_epoch)  # with this epoch's updates measured
                if self.verbose:
                    print_row(row, header=len(s.history) == 1, eta=left)
                self._publisher.epoch(row, left)
                self.call("on_epoch_end", row=row)
        except StopTraining as stop:
            logger.info("training stopped early: %s", stop)
        except BaseException as err:
            self._publisher.end(error=f"{type(err).__name__}: {err}")
            raise
        finally:
            s.loop.end_epoch = None  # the next call sets its own
        self._publisher.end()
        self.call("on_train_end")


def validation_loss(state: TrainingState, X: np.ndarray, y: np.ndarray, criterion=None) -> float:
    """Mean criterion over held-out data (eval mode, on the client); ``criterion``: a
    :class:`~adadamp.sample_weight.SampleWeightedLoss` when ``y`` carries sample weights."""
    module = state.module
    module.eval()
    total = weight = 0.0
    with torch.no_grad():
        for start in range(0, len(X), 4096):
            xb, yb = torch.tensor(X[start : start + 4096]), torch.from_numpy(y[start : start + 4096])
            if criterion is None:
                total, weight = total + float(state.criterion(module(xb), yb)) * len(xb), weight + len(xb)
            else:
                batch_total, batch_weight = criterion.sum_and_weight(module(xb), yb)
                total, weight = total + float(batch_total), weight + batch_weight
    module.train()
    return total / weight


def time_left(state: TrainingState, last_epoch: int, current: list[dict] = ()) -> float | None:
    """Seconds until the epoch clock reaches ``last_epoch``: the schedule's coming batch sizes (the
    damper's pure ``forecast_batch_size`` per epoch; the last batch size where it has no forecast)
    times the update time measured so far in this fit, as a line in the batch size fitted to the
    updates.  ``current``: the records of the epoch in progress (not in ``history`` yet).  None
    before any update was measured."""
    done = [u for row in state.history for u in row["updates"]] + list(current)
    if not done:
        return None
    sizes = np.array([u["batch_size"] for u in done], dtype=float)
    times = np.array([u["update_time"] for u in done], dtype=float)
    slope, base = 0.0, float(np.mean(times))
    if len(np.unique(sizes)) > 1:
        slope, base = np.polyfit(sizes, times, 1)
        if slope < 0 or base < 0:  # noise: a line through nothing real
            slope, base = 0.0, float(np.mean(times))
    return sum(base + slope * b for b in coming_batches(state, last_epoch, int(sizes[-1])))


def coming_batches(state: TrainingState, last_epoch: int, last: int | None = None) -> list[int]:
    """The batch sizes of the updates until ``last_epoch``, from the schedule's forecasts (where it has
    none: ``last``, the latest update's batch size, else the last epoch's).

    Examples
    --------
    >>> from adadamp.dampers import GeoDamp
    >>> from adadamp.engine import LoopState
    >>> s = TrainingState(None, None, None, GeoDamp(initial=4, delay=1, factor=2), LoopState(0, 10, progress=5))
    >>> coming_batches(s, 2)  # the rest of epoch 0 at 4, then epoch 1 at 8
    [4, 1, 8, 2]
    """
    loop, damper = state.loop, state.damper
    if last is None:
        last = state.history[-1]["updates"][-1]["batch_size"] if state.history else None
    last = last or 1
    batches, epoch = [], math.floor(loop.epoch + 1e-9)
    left = round(loop.epoch_end() - loop.progress)  # examples left in the current epoch
    while epoch < last_epoch:
        size = max(1, int(damper.forecast_batch_size(epoch) or last))
        full, rest = divmod(max(left, 0), size)
        batches += [size] * full + ([rest] if rest else [])
        epoch, left = epoch + 1, loop.n_data
    return batches


def print_row(row: dict, header: bool, eta: float | None = None) -> None:
    """One line of the ``verbose=1`` table (and the header before the first); ``eta``: seconds left."""
    cols = ("epoch", "train_loss", *(("valid_loss",) if "valid_loss" in row else ()), "batch_size", "lr",
            "n_workers", "n_updates", "dur")
    if header:
        print("  ".join(f"{c:>10}" for c in (*cols, "time left")))
    cells = []
    for c in cols:
        v = row[c]
        cells.append(f"{v:>10.4g}" if isinstance(v, float) else f"{v:>10}")
    cells.append(f"{'-' if eta is None else f'{eta:.1f} s':>10}")
    print("  ".join(cells), flush=True)
