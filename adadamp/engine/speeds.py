"""How fast each worker computes, measured on every update, and what the shares of the next updates
are made of (:doc:`/guide/heterogeneous`).

Every gradient reply says how many examples the worker computed and how long it took; both are
smoothed over updates per worker, and one *elasticity* says how much of a worker's time grows
with its share (:class:`Speeds`).  With ``shares="speed"`` the fit's shards are held so that all
workers are predicted to finish an update together (:func:`~adadamp.data.placement.shard_quotas`:
in proportion to the throughputs when the time is all compute), and they are placed again when
the model says that other holders would shorten the update by :data:`REBALANCE_GAIN`
(:meth:`Speeds.rebalance`).

A *straggler* is a worker that would take more than twice the median worker's time for an equal
share (:data:`STRAGGLER_RATIO`): then an equal share makes every update wait twice the time the
others need, so the fit runs at the straggler's pace and everyone else idles half the time -- the
case speed shares exist for.  Stragglers are named in each update's record (``stragglers``, their
ranks) in both modes; with speed shares their share already keeps the update near the others'
time (down to no shard at all for a worker that could not finish one shard in the others' time).
Pure; no Dask.
"""

from __future__ import annotations

import math
import statistics

import dask

from ..data.placement import makespan, shard_quotas

#: The weight of the newest measurement in a worker's smoothed throughput: a change of speed is
#: followed within a few updates (0.7**6 < 0.12), and one noisy update moves it by a third.
SMOOTHING = 0.35
#: Shards are placed again when the best quotas would shorten the update (the slowest worker's
#: predicted time) by this fraction.  Below it the noise of the timings moves blocks back and forth
#: for nothing: on 2 cores shared with other jobs single updates vary by 10-20 %, the smoothed
#: speeds by about 5 %, and at 5 % four workers of equal speed traded a shard every 5-10 updates.
#: A real change of speed (a worker at half or a quarter speed) predicts gains of 30-200 %.
REBALANCE_GAIN = 0.1
#: How fast the elasticity forgets (per update; its sums hold about the last 20 updates' worth).
MEMORY = 0.95
#: Updates at least between two placements that follow the speeds (each moves blocks).
REBALANCE_EVERY = 4
#: A worker slower than this fraction of the median worker (for an equal share) is a straggler.
STRAGGLER_RATIO = 0.5
#: Shards per worker with ``shares="speed"``: the granularity of a share.  With 16, a worker at half
#: the others' speed among four holds 9 of the 64 shards and the others 18-19: the update runs at
#: 0.96x the ideal throughput at best (the sum of the speeds; 8 per worker: 0.91x).  Modules whose examples do not interact
#: (no BatchNorm, no dropout) compute all of a worker's shards in one pass, so the count costs
#: nothing there; others run one pass per shard and get :data:`COUPLED_SHARDS_PER_WORKER`.
SHARDS_PER_WORKER = 16
COUPLED_SHARDS_PER_WORKER = 4
#: A worker given no shard is no longer measured: its estimate grows by this factor per update
#: until it gets a shard again and is measured (a straggler that recovered comes back; one still
#: slow costs one small share every few dozen updates: 1.02**35 = 2).
PROBE_GROWTH = 1.02


def lost_after(others: float) -> float:
    """Seconds after a round's start at which a worker that has not answered is treated as lost,
    when the others took ``others`` seconds: ``max(adadamp.stragglers.min-seconds, others *
    adadamp.stragglers.factor)`` (dask config; 5 s and 10 by default).

    Ten times the others' time lets a worker that slowed to a quarter (or a tenth) of its speed
    mid-update finish that update (its next share is made smaller); the floor keeps a short update
    from giving up on a worker that a garbage collection, swapping or a busy machine held for a
    moment (on this 2-core machine, with four workers and a test suite beside them, single
    updates of 20 ms took up to 1.5 s).  ``update_timeout`` stays the upper bound, and a worker
    on its first update of the fit (a first pass may compile kernels or warm a device up) is
    only held to that.

    >>> lost_after(0.02), lost_after(1.5)
    (5.0, 15.0)
    """
    factor = float(dask.config.get("adadamp.stragglers.factor", 10.0))
    floor = float(dask.config.get("adadamp.stragglers.min-seconds", 5.0))
    return max(floor, factor * others)


class Speeds:
    """Each worker's smoothed examples and compute seconds per update, and how much of a worker's
    time grows with its share (see the module docstring).

    A worker's time for a share of ``n`` examples is modelled as ``t (1 - e + e n / m)``, ``m``
    and ``t`` its smoothed examples and seconds per update, ``e`` the *elasticity* of the compute
    time in the share: the least-squares slope of ``log(seconds)`` on ``log(examples)`` over
    every worker's deviations from its own means (exponentially forgotten, :data:`MEMORY`).
    With ``e = 1`` the time is proportional to the share and shares follow the throughputs; a
    fit whose updates are mostly fixed costs (a small model, kernel launches) has ``e`` near 0,
    and then no share is worth moving: throughputs alone (``n / t``) would favour whichever worker
    holds more, and the shares would drift onto one worker (measured: 125 of 128 examples on one
    of four equal CPU workers, 1.5x slower updates).

    >>> s = Speeds()
    >>> s.observe("a", 100, 1.0); s.observe("b", 50, 1.0)
    >>> s.of(["a", "b", "c"])  # examples per second; c: not measured yet, taken as the median
    [100.0, 50.0, 75.0]
    >>> s.observe("d", 40, 1.0); s.observe("e", 100, 1.0)
    >>> s.stragglers(["a", "d", "e"]), s.stragglers(["a", "b"])  # d: 2.5x the others' time for an equal share
    ([1], [])
    """

    def __init__(self):
        self.examples: dict[str, float] = {}  # smoothed examples per update
        self.seconds: dict[str, float] = {}  # smoothed compute seconds per update
        self._sxy = self._sxx = 0.0  # the elasticity's sums (deviations of log seconds on log examples)
        self._placed_at = 0  # the update of the last placement that followed the speeds (the first ones warm up)
        self.answered: set[str] = set()  # the workers that replied to an update of this fit

    @property
    def rate(self) -> dict[str, float]:
        """Each measured worker's examples per second (its smoothed examples over its smoothed seconds)."""
        return {w: self.examples[w] / self.seconds[w] for w in self.seconds}

    def observe(self, worker: str, n: int, seconds: float) -> None:
        """One update's measurement: ``n`` examples in ``seconds`` (nothing learnt from an empty share)."""
        if n <= 0 or seconds <= 0:
            return
        if worker in self.seconds:
            dx, dy = math.log(n / self.examples[worker]), math.log(seconds / self.seconds[worker])
            self._sxy = MEMORY * self._sxy + dx * dy
            self._sxx = MEMORY * self._sxx + dx * dx
            self.examples[worker] += SMOOTHING * (n - self.examples[worker])
            self.seconds[worker] += SMOOTHING * (seconds - self.seconds[worker])
        else:
            self.examples[worker], self.seconds[worker] = float(n), float(seconds)

    def observe_update(self, workers: list[str], per_worker: dict[str, list]) -> None:
        """One update's measurements (``per_worker``: examples and seconds of each worker that
        computed any); the workers of ``workers`` that computed nothing look :data:`PROBE_GROWTH`
        faster each time, until they get a shard and are measured again.

        A worker's first reply of the fit is not a measurement: its first pass warms up (allocations,
        kernels, caches; measured on emulated workers: +50 ms on a 117 ms update at a third of the
        speed, +16 ms on 39 ms at full speed), and kept, it made a third-speed worker look slower
        than it is: its share settled at 5 % of the batch instead of 1/7."""
        for w in workers:
            n, seconds = per_worker.get(w, (0, 0.0))
            if n > 0 and w not in self.answered:
                self.answered.add(w)
            elif n > 0:
                self.observe(w, n, seconds)
            elif w in self.seconds:
                self.seconds[w] /= PROBE_GROWTH

    def forget(self, worker: str) -> None:
        self.answered.discard(worker)
        self.examples.pop(worker, None)
        self.seconds.pop(worker, None)

    def elasticity(self) -> float:
        """How the compute time grows with the share, in [0, 1] (1 until the shares have varied
        enough to tell: the sum of squared deviations of log examples under ``0.05``)."""
        return min(1.0, max(0.0, self._sxy / self._sxx)) if self._sxx >= 0.05 else 1.0

    def of(self, workers: list[str]) -> list[float]:
        """The workers' throughputs (examples per second); one not measured yet is taken as the
        median of the others (1.0 when none is measured)."""
        rate = self.rate
        known = [rate[w] for w in workers if w in rate]
        typical = statistics.median(known) if known else 1.0
        return [rate.get(w, typical) for w in workers]

    def _model(self, workers: list[str], n_shards: int, batch: float) -> tuple[list[float], list[float]]:
        """Each worker's shards per second and fixed seconds per update, for shards of
        ``batch / n_shards`` examples (workers not measured yet: the median of the others)."""
        e, per_shard = self.elasticity(), batch / max(n_shards, 1)
        known = [w for w in workers if w in self.seconds]
        if not known:
            return [1.0] * len(workers), [0.0] * len(workers)
        speed = {w: self.examples[w] / (e * self.seconds[w] * per_shard) if e > 0 else math.inf for w in known}
        fixed = {w: (1 - e) * self.seconds[w] for w in known}
        typical = statistics.median(speed.values()), statistics.median(fixed.values())
        return [speed.get(w, typical[0]) for w in workers], [fixed.get(w, typical[1]) for w in workers]

    def quotas(self, workers: list[str], n_shards: int) -> list[int]:
        """The shards each of ``workers`` should hold (:func:`~adadamp.data.placement.shard_quotas`)."""
        speeds, fixed = self._model(workers, n_shards, self._batch(workers))
        return shard_quotas(n_shards, speeds, fixed)

    def _batch(self, workers: list[str]) -> float:
        return sum(self.examples.get(w, 0.0) for w in workers) or 1.0

    def stragglers(self, workers: list[str]) -> list[int]:
        """The ranks of the measured workers that would take more than ``1 / STRAGGLER_RATIO``
        times the median worker's time for an equal share."""
        measured = [w for w in workers if w in self.seconds]
        if len(measured) < 2:
            return []
        e, equal = self.elasticity(), self._batch(measured) / len(measured)
        time = {w: self.seconds[w] * (1 - e + e * equal / self.examples[w]) for w in measured}
        typical = statistics.median(time.values())
        return [k for k, w in enumerate(workers) if w in time and time[w] * STRAGGLER_RATIO > typical]

    def helpers(self, own: list[str], lent: list[str], n_shards: int, room: int, batch: int) -> int:
        """How many workers beyond ``own`` would each shorten an update of ``batch`` examples in
        ``n_shards`` shards by :data:`REBALANCE_GAIN` (the workers ``lent`` already first, as
        measured; then workers of the median speed), at most ``room``: what a fit borrows of the
        workers no fit wants (:func:`~adadamp.cluster.division.lend`).  0 until ``own`` are measured.

        >>> s = Speeds()
        >>> for _ in range(3): s.observe("a", 64, 0.064)  # time all per example: a second worker halves it
        >>> s.helpers(["a"], [], n_shards=16, room=3, batch=64), s.helpers(["a"], [], n_shards=1, room=3, batch=64)
        (3, 0)
        >>> s._sxx = 1.0  # a time all fixed costs (elasticity 0): no worker shortens it
        >>> s.helpers(["a"], [], n_shards=16, room=3, batch=64)
        0
        """
        if room <= 0 or not own or not all(w in self.seconds for w in own):
            return 0

        def update_time(k: int) -> float:
            names = [*own, *lent, *(f"more-{i}" for i in range(k))][: len(own) + k]
            speeds, fixed = self._model(names, n_shards, batch)
            return makespan(shard_quotas(n_shards, speeds, fixed), speeds, fixed)

        k, best = 0, update_time(0)
        while k < room:
            t = update_time(k + 1)
            if t * (1 + REBALANCE_GAIN) > best:
                break
            k, best = k + 1, t
        return k

    def rebalance(self, workers: list[str], held: list[int], update: int) -> bool:
        """Whether shards should move now: the best quotas shorten the predicted update by
        :data:`REBALANCE_GAIN` and the last such move is :data:`REBALANCE_EVERY` updates old."""
        if update - self._placed_at < REBALANCE_EVERY or not all(w in self.seconds for w in workers):
            return False
        speeds, fixed = self._model(workers, sum(held), self._batch(workers))
        best = makespan(shard_quotas(sum(held), speeds, fixed), speeds, fixed)
        if makespan(held, speeds, fixed) <= (1 + REBALANCE_GAIN) * best:
            return False
        self._placed_at = update
        return True
