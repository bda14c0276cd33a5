"""How fast each worker computes, measured on every update, and what the shares of the next updates
are made of (issue 33; :doc:`/guide/heterogeneous`).

Every gradient reply says how many examples the worker computed and how long it took; a worker's
*throughput* is the ratio, smoothed over updates (:class:`Speeds`).  With ``shares="speed"`` the
fit's shards are held in proportion to these throughputs (:func:`~adadamp.data.placement.shard_quotas`),
so that all workers finish an update together, and they are placed again when the measured speeds
say that other holders would shorten the update by :data:`REBALANCE_GAIN` (:meth:`Speeds.rebalance`).

A *straggler* is a worker whose throughput stays under :data:`STRAGGLER_RATIO` of the median's:
at half the others' speed an equal share makes every update take twice the time the others need,
so the fit runs at the straggler's pace and everyone else idles half the time -- the case speed
shares exist for.  Stragglers are named in each update's record (``stragglers``, their ranks) in
both modes; with speed shares their share already keeps the update near the others' time (it is
proportional to their speed, down to no shard at all for a worker that could not finish one shard
in the others' time).  Pure; no Dask.
"""

from __future__ import annotations

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
#: Updates at least between two placements that follow the speeds (each moves blocks).
REBALANCE_EVERY = 4
#: A worker slower than this fraction of the median worker is a straggler (module docstring).
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
    """Each worker's smoothed throughput, in examples per second (see the module docstring).

    >>> s = Speeds()
    >>> s.observe("a", 100, 1.0); s.observe("b", 50, 1.0)
    >>> s.of(["a", "b", "c"])  # c: not measured yet, taken as the median
    [100.0, 50.0, 75.0]
    >>> s.stragglers(["a", "b"]), Speeds().stragglers(["a"])
    ([], [])
    """

    def __init__(self):
        self.rate: dict[str, float] = {}
        self._placed_at = 0  # the update of the last placement that followed the speeds (the first ones warm up)

    def observe(self, worker: str, n: int, seconds: float) -> None:
        """One update's measurement: ``n`` examples in ``seconds`` (nothing learnt from an empty share)."""
        if n <= 0 or seconds <= 0:
            return
        rate = n / seconds
        old = self.rate.get(worker)
        self.rate[worker] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate

    def observe_update(self, workers: list[str], per_worker: dict[str, list]) -> None:
        """One update's measurements (``per_worker``: examples and seconds of each worker that
        computed any); the workers of ``workers`` that computed nothing grow by :data:`PROBE_GROWTH`."""
        for w in workers:
            n, seconds = per_worker.get(w, (0, 0.0))
            if n > 0:
                self.observe(w, n, seconds)
            elif w in self.rate:
                self.rate[w] *= PROBE_GROWTH

    def forget(self, worker: str) -> None:
        self.rate.pop(worker, None)

    def of(self, workers: list[str]) -> list[float]:
        """The workers' throughputs; one not measured yet is taken as the median of the others
        (1.0 when none is measured)."""
        known = [self.rate[w] for w in workers if w in self.rate]
        typical = statistics.median(known) if known else 1.0
        return [self.rate.get(w, typical) for w in workers]

    def quotas(self, workers: list[str], n_shards: int) -> list[int]:
        """The shards each of ``workers`` should hold (:func:`~adadamp.data.placement.shard_quotas`)."""
        return shard_quotas(n_shards, self.of(workers))

    def stragglers(self, workers: list[str]) -> list[int]:
        """The ranks of the measured workers slower than :data:`STRAGGLER_RATIO` of the median."""
        measured = [self.rate[w] for w in workers if w in self.rate]
        if len(measured) < 2:
            return []
        typical = statistics.median(measured)
        return [k for k, w in enumerate(workers) if w in self.rate and self.rate[w] < STRAGGLER_RATIO * typical]

    def rebalance(self, workers: list[str], held: list[int], update: int) -> bool:
        """Whether shards should move now: the best quotas shorten the predicted update by
        :data:`REBALANCE_GAIN` and the last such move is :data:`REBALANCE_EVERY` updates old."""
        if update - self._placed_at < REBALANCE_EVERY or not all(w in self.rate for w in workers):
            return False
        speeds = self.of(workers)
        best = makespan(shard_quotas(sum(held), speeds), speeds)
        if makespan(held, speeds) <= (1 + REBALANCE_GAIN) * best:
            return False
        self._placed_at = update
        return True
