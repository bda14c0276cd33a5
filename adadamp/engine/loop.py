"""The fit loop: epochs of model updates on a backend, with the callbacks' hooks (skorch's names),
the validation loss, checkpoints and the verbose table.

The estimator builds the :class:`~adadamp.records.TrainingState` and the backend; this loop runs
them, and publishes their progress where the estimator says (the live page on the Dask dashboard).  Hooks receive the estimator and keyword arguments: ``module``, ``optimizer``, ``damper``,
``loop`` (the clock), ``history``, and ``record`` (one update) or ``row`` (one epoch).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
from distributed import Client

from .. import checkpoint as checkpoint_mod
from ..exceptions import FitInterrupted, StopTraining
from ..records import TrainingState
from .backends.base import Backend
from .interrupts import stop_on_signals

logger = logging.getLogger(__name__)


class Page(Protocol):
    """Where the loop publishes a fit's progress as it goes (the live page on the Dask dashboard)."""

    url: str | None
    fit: str

    def training(self) -> None: ...

    def update(self, n_update: int, record: dict) -> None: ...

    def epoch(self, row: dict, eta: float | None) -> None: ...

    def end(self, error: str | None = None) -> None: ...

    def overview(self) -> str | None: ...

#: With ``verbose``, the fit's first epoch prints its time left after this many updates (or seconds).
FIRST_ESTIMATE = (20, 5.0)


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
                 valid=None, page: Callable[[Client, int], Page], budgeted: bool = True, label: str = ""):
        self.estimator = estimator
        self.label = label  # the estimator in short (its parameters that differ from the defaults), for verbose
        self.budgeted = budgeted
        self.page = page
        self.state = state
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.verbose = verbose
        self.valid = valid
        self._publisher: Page | None = None

    def call(self, hook: str, **info) -> None:
        s = self.state
        for _, cb in s.callbacks:
            getattr(cb, hook)(
                self.estimator, module=s.module, optimizer=s.optimizer, damper=s.damper, loop=s.loop,
                history=s.history, **info,
            )

    def _on_update(self, updates: list[dict]) -> None:
        now = time.monotonic()  # the time between two updates (the epoch's start and its first: the epoch's)
        if self._mark != self._epoch_start:
            self._gaps.append(max(0.0, now - self._mark - updates[-1]["update_time"]))
        self._mark = now
        self._note_shortfall(updates[-1])
        # The epoch's last update is saved, and stopped after, with the epoch's row (``_run``): a
        # checkpoint of a finished epoch without its row would make the resumed fit train it again.
        ends_epoch = not self.state.loop.in_epoch(self._epoch_end)
        every = self.checkpoint_every
        if self._writer is not None and every and self.state.loop.n_updates % every == 0 and not ends_epoch:
            self._backend.sync()
            self._writer.save(self.state, updates)
        if self._stop.signum is not None and not ends_epoch:  # Ctrl-C or SIGTERM: this update is the last
            self._backend.sync()
            if self._writer is not None:
                self._writer.save(self.state, updates)
            raise self._interrupted()
        self._publisher.update(self.state.loop.n_updates, updates[-1])
        before = time.monotonic()
        eta = self._time_left(updates)
        self._mark += time.monotonic() - before  # the estimate's own time is not a cost of the updates to come
        first = len(updates) >= FIRST_ESTIMATE[0] or time.monotonic() - self._epoch_start >= FIRST_ESTIMATE[1]
        if self.verbose and self._untold and first:
            self._untold = False
            print(f"time left: about {eta:.1f} s (estimated from the first {len(updates)} updates; "
                  f"fit {self._publisher.fit})", flush=True)
        self.call("on_update_end", record=updates[-1], eta=eta)

    def open_page(self, client: Client, epochs: int) -> None:
        """Open the fit's page on ``client``'s scheduler (once), before the fit waits for its workers,
        so that the page shows it from its start; with ``verbose``, say which fit this is and, once
        per page and process, where its page is."""
        if self._publisher is not None:
            return
        self._publisher = self.page(client, math.floor(self.state.loop.epoch + 1e-9) + epochs)
        if self.verbose:  # which fit the rows below are (a search's fits print theirs interleaved)
            print(f"fit {self._publisher.fit}: {self.label}", flush=True)
        if self._publisher.url is not None:  # logged; printed where the user looks, once per page and process
            logger.info("live training page: %s", self._publisher.url)
            if self.verbose and _first_on_page(self._publisher.url):
                print(f"live training page: {self._publisher.url} (this process's other fits: ?fit=<id>)", flush=True)

    def close_page(self, error: BaseException) -> None:
        """The fit failed before or while it trained: its page says how (once)."""
        if self._publisher is not None:
            self._publisher.end(error=f"{type(error).__name__}: {error}")

    def _interrupted(self) -> FitInterrupted:
        loop = self.state.loop
        saved = f"; the checkpoint {self.checkpoint} holds it" if self._writer is not None else ""
        return FitInterrupted(
            f"{self._stop.name}: the fit stopped after update {loop.n_updates} (epoch {loop.epoch:.2f}); the estimator "
            f"keeps the weights of that update{saved}", self._stop.signum)

    def _time_left(self, updates: list[dict]) -> float | None:
        """Seconds left now: the epoch's starting estimate less the time since, or, in an epoch that
        started with nothing measured (a fit's first), estimated from its own updates (at each of the
        first ones, then once a second: each estimate reads every update so far)."""
        now = time.monotonic()
        if self._eta is None or (self._measuring and (len(updates) <= FIRST_ESTIMATE[0] or now - self._eta_at >= 1.0)):
            self._eta, self._eta_at = self._estimate(updates), now
        return None if self._eta is None else max(0.0, self._eta - (now - self._eta_at))

    def _estimate(self, current: list[dict] = ()) -> float | None:
        """:func:`time_left` with what this loop measured: the time between updates (median of the
        latest), each epoch's time outside its updates (median of the latest three), and the
        workers each coming batch will have."""
        gap = float(np.median(self._gaps[-RECENT:])) if self._gaps else 0.0
        overhead = float(np.median(self._overheads[-3:])) if self._overheads else 0.0
        members = getattr(self._backend, "members", None)
        scaling = members is not None and members.policy.scale
        return time_left(self.state, self._last_epoch, current, workers=self._workers_for, gap=gap,
                         epoch_overhead=overhead, start=members.start_latency if scaling else None,
                         running=members.running() if scaling else 0)

    def _note_shortfall(self, record: dict) -> None:
        """Remember the largest want an update ran short of (a shared or full cluster: a search's
        fits divide it), so that the time left stops counting on workers that do not come."""
        members = getattr(self._backend, "members", None)
        if members is not None and isinstance(record.get("n_workers"), int):
            wanted = members.wanted(int(record["batch_size"]))
            if record["n_workers"] < wanted:
                self._short = max(self._short, wanted)

    def _workers_for(self, batch: int) -> int:
        """The workers an update of ``batch`` examples will have: no more than the fit has where an
        update already ran short of as many (they are not coming); else those the policy wants for
        it on a cluster the fit scales, or no more than the cluster runs."""
        members = getattr(self._backend, "members", None)
        if members is None:  # a backend without membership: the workers of the latest update
            done = [u for row in self.state.history[-1:] for u in row["updates"]]
            return done[-1]["n_workers"] if done else 1
        wanted = members.wanted(int(batch))
        if wanted <= self._short:
            return max(1, min(wanted, len(members.workers)))
        return wanted if members.policy.scale else min(wanted, members.running())

    def run(self, backend: Backend, epochs: int, epoch_updates: list[dict]) -> None:
        """``epoch_updates``: the records of the current epoch's earlier updates (resuming mid-epoch).
        Ctrl-C and SIGTERM stop it at the next update's end (:mod:`~adadamp.engine.interrupts`)."""
        with stop_on_signals() as self._stop:
            self._run(backend, epochs, epoch_updates)

    def _run(self, backend: Backend, epochs: int, epoch_updates: list[dict]) -> None:
        s = self.state
        last_epoch = math.floor(s.loop.epoch + 1e-9) + epochs  # where this call ends on the epoch clock
        self._backend, self._last_epoch = backend, last_epoch
        self._writer = None if self.checkpoint is None else checkpoint_mod.Writer(self.checkpoint, s)
        self._gaps, self._overheads = [], []  # seconds between updates; each epoch's outside its updates
        self._short = 0  # the largest want an update ran short of
        s.loop.end_epoch = float(last_epoch) if self.budgeted else None
        self.open_page(backend.client, epochs)  # where the session has not opened it yet
        self._publisher.training()
        self.call("on_train_begin")
        try:
            for i in range(epochs):
                if self._stop.signum is not None:  # asked between two epochs (the last one is saved)
                    raise self._interrupted()
                now = time.monotonic()
                if i:  # the last epoch's time outside its updates: its set-up, validation, checkpoint, row
                    ups = s.history[-1]["updates"]
                    gap = float(np.median(self._gaps[-RECENT:])) if self._gaps else 0.0
                    busy = sum(u["update_time"] for u in ups) + gap * max(0, len(ups) - 1)
                    self._overheads.append(max(0.0, now - self._epoch_start - busy))
                self._mark = self._epoch_start = now
                eta = self._estimate(epoch_updates)
                self._eta, self._eta_at = eta, time.monotonic()
                self._measuring = self._untold = eta is None  # nothing measured yet: estimate as updates come
                self.call("on_epoch_begin", epoch=len(s.history) + 1, n_data=s.loop.n_data, eta=eta)
                self._epoch_end = s.loop.epoch_end()  # where backend.run_epoch ends this epoch
                row = backend.run_epoch(epoch_updates, self._on_update)
                epoch_updates = []
                if self.valid is not None:
                    row["valid_loss"] = validation_loss(s, *self.valid)
                s.history.append(row)
                if self._writer is not None:
                    self._writer.save(s, [])
                left = self._estimate()  # with this epoch's updates measured
                if self.verbose:
                    print_row(row, header=len(s.history) == 1, eta=left, fit=self._publisher.fit)
                self._publisher.epoch(row, left)
                self.call("on_epoch_end", row=row)
        except StopTraining as stop:
            logger.info("training stopped early: %s", stop)
        except BaseException as err:
            self.close_page(err)
            raise
        finally:
            s.loop.end_epoch = None  # the next call sets its own
            if self._writer is not None:
                self._writer.close()  # the last checkpoint on disk before fit returns or raises
        self._publisher.end()
        if self.verbose:  # a search's progress as a whole, at each of its fits' end
            line = self._publisher.overview()
            if line:
                print(f"{line} (fit {self._publisher.fit} done)", flush=True)
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


#: The latest updates whose median sets the pace of the updates to come (the machine's pace now).
RECENT = 32
#: A fit's first updates, slower (the workers' first backward pass and optimizer step), left out of
#: the pace once there are twice as many others.
WARMUP = 2


def update_time_model(updates: list[dict]) -> tuple[float, float]:
    """``(base, per_example)``: an update of ``b`` examples on ``w`` workers takes about
    ``base + per_example * b / w`` seconds.

    ``per_example`` is a line through the median time of each per-worker batch seen (weighted by
    how many updates had it), so one slow update (the fit's first, a worker starting, a garbage
    collection) moves nothing; ``base`` is the median of the latest :data:`RECENT` updates less
    their per-example part, so a machine that became faster or slower is followed.

    Examples
    --------
    >>> ups = [{"batch_size": b, "n_workers": 1, "update_time": t}
    ...        for b, t in [(10, 9.0), (10, 0.2), (10, 0.2), (20, 0.3), (20, 0.3), (20, 0.3)]]
    >>> [round(v, 3) for v in update_time_model(ups)]  # the first update (9 s) warmed up
    [0.1, 0.01]
    """
    x = np.array([u["batch_size"] / max(1, u["n_workers"]) for u in updates], dtype=float)
    t = np.array([u["update_time"] for u in updates], dtype=float)
    per_example = 0.0
    groups = np.unique(x)
    if len(groups) > 1:
        medians = np.array([np.median(t[x == g]) for g in groups])
        counts = np.array([np.sum(x == g) for g in groups], dtype=float)
        per_example = max(0.0, float(np.polyfit(groups, medians, 1, w=np.sqrt(counts))[0]))
    recent = slice(max(len(t) - RECENT, WARMUP if len(t) > 2 * WARMUP else 0), None)
    base = float(np.median(t[recent] - per_example * x[recent]))
    if base < 0:  # a line steeper than the updates: their median is the better guess
        per_example, base = 0.0, float(np.median(t[recent]))
    return base, per_example


def time_left(state: TrainingState, last_epoch: int, current: list[dict] = (), *,
              workers: Callable[[int], int] | None = None, gap: float = 0.0, epoch_overhead: float = 0.0,
              start: float | None = None, running: int = 0) -> float | None:
    """Seconds until the epoch clock reaches ``last_epoch``.

    The schedule's coming batch sizes (:func:`coming_batches`: the damper's pure
    ``forecast_batch_size`` per epoch, the ragged last batch of each epoch included), each at the
    time :func:`update_time_model` gives its batch on the workers it will have (``workers(batch)``;
    default: the latest update's), plus ``gap`` seconds per update (the loop's own time between
    updates) and ``epoch_overhead`` per epoch to come (the current one included: validation,
    checkpoint, the epoch's row).  ``start``: seconds the cluster takes to bring a worker (None:
    unknown); the first coming batch that wants more than the ``running`` workers waits for what
    is left of a start by then.  A growing batch makes the coming epochs faster: fewer updates,
    each about as long while the workers grow with the batch.  ``current``: the records of the
    epoch in progress (not in ``history`` yet).  None before any update was measured.
    """
    done = [u for row in state.history for u in row["updates"]] + list(current)
    if not done:
        return None
    base, per_example = update_time_model(done)
    last_workers = max(1, int(done[-1]["n_workers"]))
    def update(b: int) -> float:
        w = last_workers if workers is None else max(1, int(workers(b)))
        return base + gap + per_example * b / w

    total, waited = 0.0, start is None
    for size, full, rest in coming_epochs(state, last_epoch, int(done[-1]["batch_size"])):
        if not waited and workers is not None and workers(size) > running:
            total, waited = total + max(0.0, start - total), True  # asked for ahead: what is left of a start
        total += full * update(size) + (update(rest) if rest else 0.0)
    epochs = last_epoch - math.floor(state.loop.epoch + 1e-9)
    return total + max(0.0, epoch_overhead) * max(0, epochs)


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
    return [b for size, full, rest in coming_epochs(state, last_epoch, last) for b in [size] * full + [rest] * bool(rest)]


def coming_epochs(state: TrainingState, last_epoch: int, last: int | None = None) -> list[tuple[int, int, int]]:
    """:func:`coming_batches` by epoch: ``(batch size, full batches, the last one's size or 0)``."""
    loop, damper = state.loop, state.damper
    if last is None:
        last = state.history[-1]["updates"][-1]["batch_size"] if state.history else None
    last = last or 1
    epochs, epoch = [], math.floor(loop.epoch + 1e-9)
    left = round(loop.epoch_end() - loop.progress)  # examples left in the current epoch
    while epoch < last_epoch:
        size = max(1, int(damper.forecast_batch_size(epoch) or last))
        epochs.append((size, *divmod(max(left, 0), size)))
        epoch, left = epoch + 1, loop.n_data
    return epochs


def print_row(row: dict, header: bool, eta: float | None = None, fit: str = "") -> None:
    """One line of the ``verbose=1`` table (and the header before the first); ``eta``: seconds left;
    ``fit``: the fit's id, last, so that the rows of a search's fits printed together tell apart."""
    cols = ("epoch", "train_loss", *(("valid_loss",) if "valid_loss" in row else ()), "batch_size", "lr",
            "n_workers", "n_updates", "dur")
    if header:
        print("  ".join(f"{c:>10}" for c in (*cols, "time left", *(("fit",) if fit else ()))))
    cells = []
    for c in cols:
        v = row[c]
        cells.append(f"{v:>10.4g}" if isinstance(v, float) else f"{v:>10}")
    cells.append(f"{'-' if eta is None else f'{eta:.1f} s':>10}")
    if fit:
        cells.append(fit)
    print("  ".join(cells), flush=True)


_PAGES: set[str] = set()  # the pages this process printed the address of
_PAGES_LOCK = threading.Lock()


def _first_on_page(url: str) -> bool:
    """Whether no fit of this process printed the page at ``url``'s address before (one address per page)."""
    base = url.split("?", 1)[0]
    with _PAGES_LOCK:
        first = base not in _PAGES
        _PAGES.add(base)
    return first
