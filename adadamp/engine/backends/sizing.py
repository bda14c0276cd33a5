"""How many workers and shards a fit trains on, and which data blocks each worker holds: the part
of a backend (:class:`~adadamp.engine.backends.base.Backend`) that follows the damper's schedule
with the cluster.

The workers a batch wants (:meth:`Membership.wanted`), the schedule read far enough ahead that
workers asked for now are up when their batch comes (``WORKER_START``, ``START_MARGIN``), the
shards an update is cut into (finer with speed-based shares), and the placement of the data blocks
on the workers, moving as few as possible (:func:`~adadamp.data.placement.plan_moves`).  These
are one decision, where the data goes for the coming batches, taken between updates; what an
update does is :mod:`.base`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from typing import TYPE_CHECKING

import numpy as np
from dask.utils import format_bytes

from ...cluster import policy as cl
from ...data.placement import plan_moves
from ...wire.parameters import examples_independent
from ..speeds import COUPLED_SHARDS_PER_WORKER, REBALANCE_GAIN, SHARDS_PER_WORKER

if TYPE_CHECKING:
    import torch
    from distributed import Client

    from ...dampers import BaseDamper
    from ...dampers.clock import LoopState
    from ...data import DataSource
    from ...data.placement import Placement
    from ..membership import Membership
    from ..speeds import Speeds
    from ..transport import Transport

logger = logging.getLogger(__name__)

#: Seconds a worker takes from the cluster's request to taking part, before a fit measured it: a Dask
#: worker process importing torch takes 2-10 s (the schedule is read this far ahead; see ``_ahead``).
WORKER_START = 10.0
#: How far ahead of a measured worker start the schedule is read: starts vary (more workers at once,
#: a busier machine or queue), and a worker asked for early costs only its idle seconds.
START_MARGIN = 2.0
#: The most epochs the schedule is read ahead.
MAX_LOOKAHEAD_EPOCHS = 100
#: Whole updates of a batch size timed with lent workers and without before the times decide
#: whether lending shortens them (:meth:`Sizing._lent_slower`); the medians of the latest
#: ``2 * LENT_TRIAL`` are compared, so a worker's first, warming-up update counts little.
LENT_TRIAL = 5


class Sizing:
    """The workers, shards and data placement of a fit, as the damper's schedule asks.

    A base of :class:`~adadamp.engine.backends.base.Backend`, which provides the attributes
    declared below (its contract with its host; annotations only, nothing is set here).
    """

    # ------------------------------------------------------------------ what the host provides
    client: Client
    module: torch.nn.Module
    damper: BaseDamper
    loop: LoopState
    data: DataSource
    placement: Placement
    speeds: Speeds
    members: Membership  #: set when the backend is entered
    transport: Transport  #: set when the backend is entered
    workers: list[str]  #: (a property) the workers training now, in rank order
    policy: cl.ClusterPolicy  #: (a property) the cluster policy in force
    _policy: cl.ClusterPolicy  #: the estimator's cluster policy
    _recent: collections.deque[float]  #: the latest updates' seconds (the schedule's clock)
    _lent_times: dict[tuple[int, int], collections.deque[float]]  #: update seconds by (batch, lent workers)
    _resizing: int | None  #: the batch the workers are being sized for (between updates), else None
    # ------------------------------------------------------------------ what it sets
    n_shards: int | None  #: the shards each update is cut into (set at the first placement)
    _placed: bool  #: a first placement was done (later ones only warn about memory)
    _independent: bool  #: each example's gradient is independent of the others' (the module's)

    # ------------------------------------------------------------------ how many workers and shards
    def _size_cluster(self) -> None:
        """The cluster policy of this damper, the workers its first batch wants, and the cluster
        sized for the batches of the first ``prescale_epochs``."""
        self.members.policy = self._policy
        if self._policy.scale and self.damper.follows_workers:
            self.members.policy = dataclasses.replace(self._policy, scale=False)  # B follows W: never size W from B
        self.members.use(self._first_workers())
        batch = self.damper.forecast_batch_size(self.loop.epoch)  # None: the first update sizes the cluster
        if self.policy.scale and batch:
            ahead = self.damper.forecast_batch_size(self.loop.epoch + self.policy.prescale_epochs) or 0
            self.members.scale_to(self.members.wanted(max(int(batch), int(ahead))))

    def _first_workers(self) -> int:
        """The workers a fit starts on: those its first batch wants (the damper's forecast); else
        ``max_workers`` (the first update decides; a damper that follows the workers keeps it)."""
        batch = self.damper.forecast_batch_size(self.loop.epoch)
        if batch and not self.damper.follows_workers:
            return self.members.wanted(int(batch))
        return self._policy.max_workers

    def _worker_budget(self, running: int) -> int:
        """The most workers this fit may train on: ``max_workers`` when it scales the cluster (its
        share of a shared cluster when it predicts its speedup), else the workers the cluster runs
        or plans (at most ``max_workers``)."""
        if self.policy.scale:
            grant = self.members.grant
            if grant.speedups and grant.share:
                return min(self.policy.max_workers, grant.share)
            return self.policy.max_workers
        return min(self.policy.max_workers, max(running, self.members.planned(), 1))

    def _ahead(self, batch_size: int) -> int:
        """The largest batch the schedule names before workers asked for now could take part: within
        ``prescale_epochs`` and, scaling the cluster, within ``START_MARGIN`` worker starts (measured;
        ``WORKER_START`` seconds before the first), the coming epochs timed at the median of the
        latest updates (an update costs about the same at any batch when the workers grow with it).
        0 where the damper has no forecast."""
        lp, forecast = self.loop, self.damper.forecast_batch_size
        ahead = forecast(lp.epoch + self.policy.prescale_epochs) or 0
        if not ahead or not self._recent or not self.policy.scale:  # no worker to start: set-ups take less
            return ahead
        seconds = float(np.median(self._recent))
        latency = self.members.start_latency
        horizon = WORKER_START if latency is None else START_MARGIN * latency
        left = (lp.epoch_end() - lp.progress) / batch_size * seconds  # the rest of this epoch
        epoch = math.floor(lp.epoch + 1e-9) + 1
        for _ in range(MAX_LOOKAHEAD_EPOCHS):
            if left >= horizon:
                break
            batch = forecast(epoch)
            if not batch:
                break
            ahead = max(ahead, int(batch))
            left += math.ceil(lp.n_data / batch) * seconds
            epoch += 1
        return ahead

    def _resize(self, batch_size: int) -> None:
        """Train the coming update on the workers ``batch_size`` wants (:meth:`Membership.follow`),
        cut into the shards :meth:`_target_shards` names (between updates only): a placement on
        the new workers cuts them at once, else the data is placed again on the same workers."""
        self._resizing = batch_size
        try:
            if self.policy.scale:  # a cluster shared by fits that predict their speedup is divided by it
                self.members.grant.speedups = self.damper.speedups(self.policy.max_workers)
            if not self.damper.follows_workers:
                self.members.grant.borrow = self._borrow(batch_size)
                self.members.follow(batch_size, self._ahead(batch_size))
            n_shards = self._target_shards(batch_size)
            if n_shards != self.n_shards and self.workers:
                logger.info("update %d: %d shards (were %s)", self.loop.n_updates, n_shards, self.n_shards)
                self.members.replace()
        finally:
            self._resizing = None

    #: Whether workers no fit wants may be lent to this backend's fits (:meth:`_borrow`).
    lends = False

    def _borrow(self, batch_size: int) -> int:
        """How many workers no fit wants this fit would train on beyond those ``batch_size`` wants:
        with speed shares (the shards stay those of the batch, only their holders change), as many
        as the measured speeds say would each shorten an update (:meth:`Speeds.helpers`), and none
        once whole updates timed with lent workers were not faster (:meth:`_lent_slower`: the
        workers' compute is all the share model sees; the client's step and the comms, on a
        machine the workers share, may grow more than the compute shrinks)."""
        if not self.lends or self.policy.shares != "speed" or not self.workers or self._lent_slower(batch_size):
            return 0
        n, n_shards = self.members.wanted(batch_size), self._target_shards(batch_size)
        lent = self._lent_workers()
        own = [w for w in self.workers if w not in lent]
        room = min(self.policy.max_workers, n_shards) - n
        return self.speeds.helpers(own, lent, n_shards, room, batch_size)

    def _time_lent(self, batch_size: int, n: int, lent: int, seconds: float) -> None:
        """Remember a whole update's seconds by its batch and the workers lent to it."""
        if self.lends and n == batch_size:  # not an epoch's ragged last batch
            times = self._lent_times.setdefault((batch_size, lent), collections.deque(maxlen=2 * LENT_TRIAL))
            times.append(seconds)

    def _lent_slower(self, batch_size: int) -> bool:
        """Whether updates of ``batch_size`` timed with lent workers were not :data:`REBALANCE_GAIN`
        faster than without (each over at least :data:`LENT_TRIAL` updates)."""
        alone = self._lent_times.get((batch_size, 0), ())
        if len(alone) < LENT_TRIAL:
            return False
        return any(b == batch_size and k > 0 and len(t) >= LENT_TRIAL
                   and np.median(t) * (1 + REBALANCE_GAIN) > np.median(alone)
                   for (b, k), t in self._lent_times.items())

    def _lent_workers(self) -> list[str]:
        """The workers training that were lent to this fit, not granted (its damper does not see them)."""
        lent = self.members.grant.lent if self.members.grant else ()
        return [w for w in self.workers if w in lent]

    def _target_shards(self, batch_size: int | None = None, workers: list[str] | None = None) -> int:
        """The shards an update of ``batch_size`` examples is cut into.

        The workers the batch wants (the schedule decides, not the workers that came) when the fit
        scales the cluster; on a cluster it does not scale, no more than it has: the most workers
        this fit has had, or that the client's cluster plans (workers restarting included), never
        fewer when workers are lost, so a lost worker changes no update; more only when more
        workers take part than there are shards.  A damper that follows the workers: the latter.
        With speed-based shares, :meth:`_shards_per_worker` times that (at most one per block).
        """
        workers = self.workers if workers is None else workers
        most = max(self.n_shards or 0, self._finer(max(len(workers), self.members.planned(), 1)))
        batch = batch_size or self.damper.forecast_batch_size(self.loop.epoch)
        if batch and not self.damper.follows_workers:
            wanted = self._finer(self.members.wanted(int(batch)))
            return wanted if self.policy.scale else min(wanted, most)
        return most

    def _finer(self, n_shards: int) -> int:
        """``n_shards`` cut :meth:`_shards_per_worker` times finer, at most one shard per block."""
        per_worker = self._shards_per_worker()
        return max(n_shards, min(n_shards * per_worker, self.placement.n_blocks)) if per_worker > 1 else n_shards

    def _shards_per_worker(self) -> int:
        """Shards per worker: 1 with equal shares; with speed-based shares enough for a share to
        follow a worker's speed (:data:`~adadamp.engine.speeds.SHARDS_PER_WORKER`), fewer when each
        shard is its own forward pass (BatchNorm, dropout: :func:`examples_independent`)."""
        if self.policy.shares != "speed":
            return 1
        if not hasattr(self, "_independent"):  # the architecture's: the same for a warm call's copy
            self._independent = examples_independent(self.module)
        return SHARDS_PER_WORKER if self._independent else COUPLED_SHARDS_PER_WORKER

    # ------------------------------------------------------------------ where the data goes
    def _place(self, new_workers: list[str]) -> dict[str, BaseException]:
        """Give every worker a fair share of the data blocks, moving as few as possible.

        Returns the workers that were lost while taking their blocks (other errors raise).
        """
        preferred = self.data.preferred(self.placement)  # where Dask holds a block already (dask data)
        n_shards = self._placement_shards(new_workers)
        quota = self.speeds.quotas(new_workers, n_shards) if self.policy.shares == "speed" else None
        shard_of, holder, add, drop = plan_moves(
            self.placement.names(self.workers), new_workers, n_shards, preferred, quota
        )
        self._check_memory([holder[g] for g in shard_of], new_workers)
        timeout = max(60.0, self.policy.update_timeout)
        failed = self.data.move(self.transport, self.placement, add, drop, timeout)
        self._placed = True
        self.placement.assign(shard_of, holder, new_workers)
        sizes = sorted(int(c) for c in np.bincount(self.placement.owner, minlength=len(new_workers)))
        logger.info("workers: %d, shards: %d, blocks per worker: %s", len(new_workers), n_shards, sizes)
        return failed

    def _placement_shards(self, new_workers: list[str]) -> int:
        """The shards of a placement on ``new_workers``: the fit's (a lost worker's shards go to the
        others); only the first placement and the placements between updates that size the workers
        for the next batch (:meth:`_resize`; the data then moves once) set them."""
        if not self.n_shards or self._resizing is not None:
            self.n_shards = self._target_shards(self._resizing, workers=new_workers)
        return self.n_shards

    def _follow_speeds(self) -> None:
        """With speed-based shares, place the shards again when the measured speeds say other
        quotas would shorten the update (:meth:`Speeds.rebalance`); between updates only."""
        if self.policy.shares != "speed" or not self.workers:
            return
        held = np.bincount(self.placement.holder, minlength=len(self.workers)).tolist()
        if self.speeds.rebalance(self.workers, held, self.loop.n_updates):
            logger.info("update %d: shards follow the measured speeds %s (held %s, elasticity %.2f)",
                        self.loop.n_updates, [round(r) for r in self.speeds.of(self.workers)], held,
                        self.speeds.elasticity())
            self.members.replace()

    def _check_memory(self, owner: list[str], workers: list[str]) -> None:
        """Refuse a fit's first placement when it gives a worker more examples than its
        ``memory_limit`` holds, before any block moves (a worker over its limit dies, restarts and
        dies again).  Later placements (a cluster that shrank), and a first one on a cluster that
        may still grow for the fit, only warn: the fit keeps its weights and may go on."""
        per_example = self.data.bytes_per_example()
        if per_example is None:  # read example by example: nothing is placed
            return
        examples = dict.fromkeys(workers, 0)
        for b, w in enumerate(owner):
            examples[w] += len(self.placement.rows(b))
        info = self.members.latest  # the watcher's latest look (memory limits do not change)
        if info is None or not set(workers) <= set(info):
            info = cl.scheduler_info(self.client)["workers"]
        for w in workers:
            limit = info.get(w, {}).get("memory_limit") or 0  # 0: no limit
            needed = examples[w] * per_example
            if limit and needed > limit:
                error = ValueError(
                    f"The training data needs {format_bytes(needed)} per worker on {len(workers)} worker(s) "
                    f"({examples[w]} examples of {per_example} bytes on {w}), more than its memory_limit "
                    f"of {format_bytes(limit)}. Use more workers (min_workers=...: a fit trains on the workers its "
                    "batch wants), workers with a larger "
                    "memory_limit, or pass a torch Dataset as X (read example by example, never held whole)."
                )
                may_grow = self.policy.scale and len(workers) < self.policy.max_workers
                if getattr(self, "_placed", False) or may_grow:
                    logger.warning("%s", error)
                    return
                raise error
