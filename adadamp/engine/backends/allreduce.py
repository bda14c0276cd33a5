"""The all-reduce backend: replicas of the module and optimizer on the workers step in lockstep.

The client sends each member under a hundred bytes per update and reads back a few scalars, so
the model never crosses the client's link (the faster way across machines and on GPUs).  How an
update, a change of group and a group kept between fits work: :doc:`/guide/backends`, "Inside the
all-reduce backend".
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import copy
import dataclasses
import io
import logging
import math
import statistics
import time

import cloudpickle
import dask
import numpy as np
import torch

from ...dampers import BaseDamper
from ...dampers.clock import LoopState, Sampler
from ...dampers.epoch import run_epoch
from ...exceptions import CollectiveError, NoWorkersError, StopTraining
from ...records import (
    CommitReply,
    CommitRequest,
    GroupRequest,
    ReplicaSettings,
    SetupReply,
    SetupRequest,
    ShareRequest,
    StepVector,
    finite_update,
)
from ...wire.batches import BatchPlan
from ...wire.optimizer_plan import apply_plan, group_settings
from ...wire.parameters import attributes, compact_copy, flatten_parameters, float_buffers
from ...wire.rpc import rpc_call
from ...worker.rendezvous import ABORT
from ...worker.replica import dump_state, load_state
from ..aggregation import Totals
from ..speeds import lost_after
from ..transport import LOST
from .base import PREFETCH_BATCHES, Backend, Batch
from .plaintext import check_plaintext
from .rounds import MAX_RECOMPUTES, in_rounds, triage

logger = logging.getLogger(__name__)

_NO_INDICES = np.zeros(0, dtype=np.int64)

#: dask config key: seconds the workers keep a fit's group for the next fit on them (0: neither kept nor taken over).
KEEP_GROUP = "adadamp.allreduce.keep-group"
#: dask config key: send a step planned without the round's statistics with the update's own requests
#: (default True; False: every step goes with the next request, as for dampers that read the round).
ANNOUNCE_STEPS = "adadamp.allreduce.announce-steps"


def collective_timeout(update_timeout: float) -> float:
    """Seconds a replica waits in a collective before giving its peers up: dask config
    ``adadamp.allreduce.timeout`` (default 30), at most half of ``update_timeout``, so the
    survivors' error reaches the client before the client gives up on them.

    Examples
    --------
    >>> collective_timeout(120.0), collective_timeout(20.0)
    (30.0, 10.0)
    """
    return min(float(dask.config.get("adadamp.allreduce.timeout", 30.0)), update_timeout / 2)


@dataclasses.dataclass
class Commit:
    """The state the client's copy of the module is at: the clock and the damper at the start of
    an epoch, and how many of the epoch's update records were in by then."""

    loop: LoopState
    damper: BaseDamper
    n_records: int


class RolledBack(Exception):
    """No replica was left: the epoch continues from the client's committed state."""


class ReplicasLost(NoWorkersError):
    """Every replica was lost in a sync, before the client's copy was brought up to date: within
    an epoch, the epoch continues from the commit; elsewhere the fit stops with the last good state."""


@dataclasses.dataclass
class _Forming:
    """A generation being formed: its workers, their rank order, the calls and when they went."""

    workers: list[str]
    order: list[str]
    calls: list
    reuse: str | None
    t0: float


class AllReduce(Backend):
    """Trains ``module`` on replicas held by the workers of ``client`` (see the module docstring).

    The same constructor, context manager, data placement and membership as
    :class:`~adadamp.engine.ParameterServer` (:class:`~adadamp.engine.backends.base.Backend`);
    only the update differs.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generation = 0
        self._group: list[str] | None = None  # the workers of the current generation (rank order: self.workers)
        self._current: set[str] = set()  # workers whose replica holds the fit's latest state
        self._step_owed: tuple[int, float, list[float]] | None = None  # the step the replicas owe
        self._announced: tuple[int, float, list[float]] | None = None  # the running update's own step (announce_step)
        self._set_up_at: dict[str, int] = {}  # the update count of the payload each worker was set up from
        self._epoch_updates: list | None = None  # the running epoch's update records (run_epoch's list)
        self._rounds: collections.deque = collections.deque(maxlen=16)  # (seconds, examples) of the last rounds
        self._aborted = False  # this round's generation was aborted for a late member (_abort)
        self._kept: dict[str, dict | None] = {}  # the group each worker's set-up offered (kept by an earlier fit)
        self._keep_seconds = float(dask.config.get(KEEP_GROUP, 60.0))
        self._announces = bool(dask.config.get(ANNOUNCE_STEPS, True))
        self._layouts: dict[str, tuple[int, ...]] = {}  # the batch plans' layout each member last heard
        self._standing = 0  # 1 while an update that stands without some members' answers re-forms the group

    # ------------------------------------------------------------------ set-up
    def _acquire(self, stack: contextlib.ExitStack) -> None:
        check_plaintext(self.client, embedded=self._policy.shared)  # before any work on the cluster
        stack.callback(self._forget_rendezvous)
        self._payload_at = self.loop.n_updates
        super()._acquire(stack)

    def _forget_rendezvous(self) -> None:
        """Empty the fit's rendezvous keys in the scheduler (an empty entry is left: Dask has no delete)."""
        with contextlib.suppress(Exception):  # the scheduler may be gone
            self.client.sync(self.client.scheduler.set_metadata, keys=[self.fit_id], value={}, callback_timeout=5.0)

    def module_payload(self) -> bytes:
        # one pickle: the optimizer's state keeps pointing at the module's parameters; of a copy whose
        # tensors own their data (the module's are views into the flat buffers: compact_copy)
        module, optimizer = compact_copy(self.module, self.optimizer)
        return cloudpickle.dumps((module, self.criterion, self.device, optimizer, attributes(self.optimizer)))

    def bind(self) -> None:
        """The client's module keeps its own flat buffers (it is only written at a sync)."""
        self.flat, self.grads = flatten_parameters(self.module)
        self._buffers = float_buffers(self.module)
        self._bound = True

    def setup_request(self, worker: str) -> SetupRequest:
        request = super().setup_request(worker)
        request.replica = ReplicaSettings(
            timeout=collective_timeout(self.policy.update_timeout),
            bucket_mb=float(dask.config.get("adadamp.allreduce.bucket-mb", 25.0)),
            applied=self._payload_at,
            stream=self.placement.order,
        )
        self._set_up_at[worker] = self._payload_at
        self._layouts.pop(worker, None)  # a fresh replica has heard no batch layout
        return request

    def setup_reply(self, worker: str, reply: SetupReply) -> None:
        super().setup_reply(worker, reply)
        self._kept[worker] = reply.kept

    # ------------------------------------------------------------------ the group
    def _ensure_group(self) -> None:
        """Form a new generation if the workers changed since the last one."""
        in_rounds(
            self.members,
            self._form_group,
            f"could not form an all-reduce group in {1 + MAX_RECOMPUTES} tries: workers keep leaving",
        )

    def _form_group(self, _attempt: int) -> tuple[bool | None, list[str]]:
        """One try at forming the group of the current workers; None and the workers lost if it failed."""
        if self._group == self.workers:
            return True, []
        workers = list(self.workers)
        forming = self._group_calls(workers)
        return self._group_formed(forming, self.client.sync(self._form, forming.calls, self.transport.timeout))

    def _group_calls(self, workers: list[str]) -> _Forming:
        """The next generation of ``workers``: its rank order and ``adadamp_group`` calls."""
        current = [w for w in workers if w in self._current]
        restore = None
        if not current:
            if self.loop.n_updates != self._commit.loop.n_updates:
                self._roll_back()
                raise RolledBack
            if self._set_up_at.get(workers[0]) != self.loop.n_updates:
                restore = self._client_state()
        # group rank 0 is a replica of the last generation (or holds the committed state)
        order = current + [w for w in workers if w not in current]
        reuse = self._reusable(order)
        # every member set up from the state the fit is at: rank 0 has nothing to send them
        broadcast = bool(current) or restore is not None or self._step_owed is not None or any(
            self._set_up_at.get(w) != self.loop.n_updates for w in order)
        self.generation += 1
        step = self._step_vector(-1)
        calls = [
            rpc_call(w, "adadamp_group", GroupRequest(self.fit_id, self.generation, rank, len(order), step,
                                                      restore if rank == 0 else None, tuple(order), reuse, broadcast),
                     serialized=("step",))
            for rank, w in enumerate(order)
        ]
        return _Forming(workers, order, calls, reuse, time.perf_counter())

    def _group_formed(self, forming: _Forming, replies: list) -> tuple[bool | None, list[str]]:
        """Take the ``adadamp_group`` replies: the group is formed, or None and the workers lost
        (those that failed, and those whose state is not at the fit's update, are no longer current:
        the next group takes its state from a replica that is, or from the client's commit)."""
        order = forming.order
        dead, broken = triage(self.members, order, replies, collectives=True)  # the hung left out, as in an update
        at = self.loop.n_updates + self._standing  # the update the replicas' state should be at
        behind = [w for w, r in zip(order, replies) if not dead and not broken and r["applied"] != at]
        if not dead and not broken and not behind:
            self._group, self._current, self._step_owed = forming.workers, set(forming.workers), None
            logger.info("all-reduce group %d %s: %d workers in %.3f s", self.generation,
                        "formed" if forming.reuse is None else "taken over from an earlier fit", len(order),
                        time.perf_counter() - forming.t0)
            return True, []
        if behind:  # not at the fit's update (a stale rank 0 makes every member so): not current
            self._current -= set(behind)
            for w in behind:  # nor the state they were set up from: the next group sends them one
                self._set_up_at.pop(w, None)
            logger.warning("workers %s are behind the fit's update %d after forming all-reduce group %d; forming "
                           "another from a replica at that update or the client's copy", behind, at, self.generation)
            return None, []
        lost = [order[k] for k in sorted(dead + broken)]
        self._current -= set(lost)
        logger.warning("workers %s lost or failed while forming all-reduce group %d; forming another", lost,
                       self.generation)
        return None, [order[k] for k in dead]

    def _place(self, new_workers: list[str]) -> dict[str, BaseException]:
        """Place the data on ``new_workers`` while their group forms (workers joining or leaving a
        running group): the two rounds overlap instead of following each other, one round less
        for a growth step across hosts (on one 2-core machine the members' CPU is the limit and
        it measured no faster; workers mapping the client's data are sent no blocks at all).  A
        worker lost while forming counts as lost while placing; a group formed with a worker the
        placement lost is formed again."""
        if not self.workers or self._group == new_workers or not self._current.intersection(new_workers):
            return super()._place(new_workers)  # the first placement, the same group, or none to take over
        forming = self._group_calls(list(new_workers))
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="adadamp-group") as pool:
            sent = pool.submit(self.client.sync, self._form, forming.calls, self.transport.timeout)
            try:
                failed = super()._place(new_workers)
            finally:
                replies = sent.result()
        _, lost = self._group_formed(forming, replies)
        failed.update({w: replies[forming.order.index(w)] for w in lost if w not in failed})
        if failed:
            self._group = None
        return failed

    def _reusable(self, order: list[str]) -> str | None:
        """The key of the group an earlier fit left on the workers, if every member of ``order``
        offered it at its set-up, formed by the same workers in the same rank order (so the
        all-reduce sums in the same order as a group formed now) with this fit's collective timeout.
        An offer is tried once: after any try the group is formed afresh.  None with
        ``keep-group`` 0 (this client neither keeps groups nor takes them over)."""
        offers = [self._kept.get(w) for w in order]
        self._kept.clear()
        timeout = collective_timeout(self.policy.update_timeout)
        first = offers[0]
        if self._keep_seconds <= 0 or first is None or list(first["members"]) != order or first["timeout"] != timeout:
            return None
        return first["key"] if all(o is not None and o["key"] == first["key"] for o in offers) else None

    async def _form(self, calls: list[tuple[str, str, dict]], timeout: float) -> list:
        """The ``adadamp_group`` calls (as :meth:`Transport.call_all`); the first member lost or
        failed marks the generation aborted in its rendezvous keys, so the others, waiting there
        for the lost one, give up within ``ABORT_POLL`` instead of the collective timeout."""
        aborted = False

        async def one(call):
            nonlocal aborted
            (reply,) = await self.transport.gather_calls([call], timeout)
            if isinstance(reply, (*LOST, CollectiveError)) and not aborted:
                aborted = True
                with contextlib.suppress(Exception):  # the scheduler may be gone: the members time out
                    await self.client.scheduler.set_metadata(
                        keys=[self.fit_id, str(call[2]["generation"]), ABORT], value=b"1"
                    )
            return reply

        return await asyncio.gather(*(one(c) for c in calls))

    def resume(self, **kwargs) -> None:
        """As the parameter server's; the replicas also take the optimizer's hyperparameters of
        this call (``set_params(optimizer__...)`` between ``partial_fit`` calls)."""
        super().resume(**kwargs)
        buf = io.BytesIO()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        torch.save(groups, buf)
        current = [w for w in self.workers if w in self._current]
        replies = self.transport.call_all(
            [rpc_call(w, "adadamp_commit", CommitRequest(self.fit_id, groups=buf.getvalue())) for w in current]
        )
        lost = tuple(w for w, r in zip(current, replies) if isinstance(r, BaseException))
        if lost:  # they are re-set up (with the client's optimizer) when the group is formed again
            self._current -= set(lost)
            self._group = None
            self.members.refresh(force=True, lost=lost)

    def _step_vector(self, update: int) -> np.ndarray | None:
        """The :class:`~adadamp.records.StepVector` of update ``update`` (-1: none, only the step
        owed), encoded: the step owed, or else the update's own step where it was announced."""
        step = self._step_owed
        if step is None and self._announced is not None and self._announced[0] == update >= 0:
            step = self._announced
        if step is None:
            return None if update < 0 else StepVector(self.generation, update).encode()
        step_of, scale, settings = step
        return StepVector(self.generation, update, step_of, scale, tuple(settings)).encode()

    # ------------------------------------------------------------------ commits
    def _client_state(self) -> bytes:
        """The client's committed copy, as a replica's state."""
        return dump_state(self.flat, self._buffers, self.optimizer, self.loop.n_updates)

    def _set_commit(self, n_records: int) -> None:
        self._commit = Commit(copy.copy(self.loop), copy.deepcopy(self.damper), n_records)
        if self._payload_at != self.loop.n_updates:  # joiners start from this state
            self._payload, self._payload_at = self.module_payload(), self.loop.n_updates

    def _roll_back(self) -> None:
        logger.warning("no replica left after %d updates; continuing from the client's copy (update %d)",
                       self.loop.n_updates, self._commit.loop.n_updates)
        self.loop.__dict__.update(copy.copy(self._commit.loop).__dict__)
        self.damper.__dict__.update(copy.deepcopy(self._commit.damper).__dict__)
        self.sampler = Sampler(self.loop)
        self._step_owed = self._announced = None

    def sync(self, take_step: bool = True) -> None:
        """Take the pending step on every replica and load rank 0's state into the client's module
        and optimizer (``take_step=False``: drop the pending gradient instead: it was not finite)."""
        if not take_step:
            self._step_owed = None
        step = self._step_vector(-1)
        candidates = [w for w in self.workers if w in self._current]
        while candidates:
            source = candidates[0]
            calls = [
                rpc_call(w, "adadamp_commit", CommitRequest(self.fit_id, step, state=w == source, keep=self._keep_seconds),
                         serialized=("step",))
                for w in self.workers if w in self._current
            ]
            replies = self.transport.call_all(calls)
            by_worker = dict(zip([c[0] for c in calls], replies))
            lost = [w for w, r in by_worker.items() if isinstance(r, BaseException)]
            self._current -= set(lost)
            good = by_worker[source]
            if not isinstance(good, BaseException):
                load_state(CommitReply(**good).state, self.flat, self._buffers, self.optimizer, keep_groups=True)
                self._step_owed = None
                if self._epoch_updates is not None and self.loop.n_updates != self._commit.loop.n_updates:
                    self._set_commit(len(self._epoch_updates))  # the client's copy is at this update now
                if lost:
                    self.members.refresh(force=True, lost=tuple(lost))
                return
            candidates = [w for w in candidates if w in self._current]
        if self._step_owed is not None or self.loop.n_updates != self._commit.loop.n_updates:
            self._group = None  # formed again, from the client's copy
            raise ReplicasLost("every replica was lost before the client's copy could be brought up to date")

    # ------------------------------------------------------------------ training
    def gradient_round(self, batch: Batch) -> Totals:
        """The batch's mean gradient, all-reduced and kept pending on the replicas, in one update's
        round (steps 3-4 of the module docstring: each request names the batch, a
        :class:`~adadamp.wire.batches.BatchPlan`); returns its totals, with the squared norm of its
        mean gradient.  A lost worker: the next generation recomputes the update."""

        def one_round(_k: int) -> tuple[Totals | None, list[str]]:
            self._ensure_group()
            self._stage(batch.idx, batch.epoch)  # streamed data: its blocks where the shards are now
            lp, placement = self.loop, self.placement
            counts = dict.fromkeys(range(placement.n_shards), 0)
            counts.update({g: len(sub) for g, sub in placement.shards(batch.idx)})
            step = self._step_vector(lp.n_updates)
            requests, examples, layouts = [], {}, {}
            for k, w in enumerate(self.workers):
                held = np.flatnonzero(placement.holder == k)
                examples[w] = sum(counts[g] for g in held.tolist())
                plan = BatchPlan(
                    lp.seed, batch.start, batch.start + len(batch.idx), placement.n_shards, placement.n_blocks,
                    placement.block_size or 0, batch.size if batch.ahead is not None else 0, PREFETCH_BATCHES, held,
                )
                layouts[w] = plan.layout()
                values = plan.to_array(layout=self._layouts.get(w) != layouts[w])  # the layout once per placement
                requests.append(ShareRequest(w, 0, _NO_INDICES, batch.epoch, step=step, plan=values))
            totals, replied = Totals(), []
            t_sent = time.monotonic()
            replies, totals.send = self.transport.round(
                requests, batch.n_chunks, None, on_reply=_collect(totals, replied, examples),
                patient=self._patient(), expected=self._expected_round(len(batch.idx)), on_late=self._abort,
            )
            for q, reply in zip(requests, replies):  # a member that did not answer hears the layout again
                if isinstance(reply, BaseException):
                    self._layouts.pop(q.worker, None)
                else:
                    self._layouts[q.worker] = layouts[q.worker]
            dead, failed = triage(self.members, [q.worker for q in requests], replies, collectives=True)
            if self._aborted and not dead:  # every member answered after all: slow, not hung
                self._rounds.clear()  # the next rounds are held to this one's time
                self._rounds.append((time.monotonic() - t_sent, len(batch.idx)))
            self._aborted = False
            if (dead or failed) and replied and self._announced is not None:
                self._done_without(requests, dead, failed)
                dead, failed = [], []
            if not dead and not failed:
                r = replied[0]  # every member holds the same all-reduced totals
                if r.n != len(batch.idx):  # the members find their examples: they must find the client's batch
                    raise RuntimeError(f"update {lp.n_updates}: the members found {r.n} examples of the batch's "
                                       f"{len(batch.idx)} (shards {examples})")
                totals.n, totals.weight, totals.loss_sum = r.n, r.weight, r.loss_sum
                totals.chunk_sq_norm_sum, totals.n_chunks = r.chunk_sq_norm_sum, r.n_chunks
                totals.grad_sq_norm = r.grad_sq_norm
                self.grad_norm = math.sqrt(r.grad_sq_norm)  # before the replicas clip it (clip_grad_norm)
                self._step_owed = self._announced = None
                self._rounds.append((time.monotonic() - t_sent, len(batch.idx)))
                return totals, []
            lost, broken = [requests[k].worker for k in dead], [requests[k].worker for k in failed]
            logger.warning("update %d: lost %s, collective failed on %s; re-forming the group and recomputing",
                           lp.n_updates, lost, broken)
            self._current -= set(lost)
            self._group = None
            return None, lost

        return in_rounds(self.members, one_round, (
            f"update {self.loop.n_updates} failed in {1 + MAX_RECOMPUTES} rounds in a row: workers keep dying"
        ))

    def _done_without(self, requests: list, dead: list[int], failed: list[int]) -> None:
        """A round with an announced step that some members answered and others did not: the update
        is done.  An answer means the member's all-reduce completed, so every member's share is in
        its totals, and it takes the step after answering: recomputing the update would ask it for
        an update it is past.  The members that did not answer are no longer current (a survivor
        whose collective failed gets the state of one that answered when the group forms again);
        the lost leave the fit."""
        lost = [requests[k].worker for k in dead]
        behind = {requests[k].worker for k in (*dead, *failed)}
        logger.warning("update %d: lost %s, collective failed on %s after the all-reduce completed elsewhere; "
                       "the update stands, re-forming the group", self.loop.n_updates, lost,
                       [requests[k].worker for k in failed])
        self._current = {q.worker for q in requests} - behind
        self._group = None
        if lost:
            self.members.lost_in_rounds.extend(lost)
            self._standing = 1  # a group formed now holds the state after this update's step
            try:
                self.members.refresh(force=True, lost=tuple(lost))
            finally:
                self._standing = 0

    def _expected_round(self, batch_size: int) -> float | None:
        """What a round of ``batch_size`` examples is expected to take: the median of the last
        rounds', scaled up with a larger batch (None before any round: no bound but ``update_timeout``).
        The members answer together after their all-reduce, so a hung member cannot be told from
        the others' answers within the round (:meth:`Transport.round`)."""
        if not self._rounds:
            return None
        seconds = statistics.median(t for t, _ in self._rounds)
        return seconds * max(1.0, batch_size / statistics.median(n for _, n in self._rounds))

    def _abort(self, late: list[str]) -> None:
        """A round's member is late past the others' bound: abort the generation, so the members
        waiting for it in a collective give up within ``ABORT_POLL`` and answer (the late one is
        then lost, and the update recomputed by the next generation).  When every member answers
        after all (the whole group was slow), the next rounds are held to this round's time."""
        logger.warning("update %d: %s late past %.1f s; aborting all-reduce group %d", self.loop.n_updates, late,
                       lost_after(self._expected_round(0) or 0.0), self.generation)
        self._aborted = True
        with contextlib.suppress(Exception):  # the scheduler may be gone: the members time out
            self.client.sync(self.client.scheduler.set_metadata, keys=[self.fit_id, str(self.generation), ABORT],
                             value=b"1", callback_timeout=5.0)

    def finite(self, loss: float, total: Totals) -> bool:
        return finite_update(total.loss_sum, total.weight, total.grad_sq_norm)  # as the members decide

    def keep_last_finite(self) -> None:
        self.sync(take_step=False)  # the replicas hold the last finite weights

    def grad_sq_norm(self, total: Totals) -> float:
        return total.grad_sq_norm * (total.weight / total.n) ** 2  # per example: the mean of the workers' sums

    def step(self, plan) -> float:
        """Hand the step to the replicas: they take it with the next request."""
        lr, self._step_owed = self._handed_on(plan)
        return lr

    def skip_step(self) -> None:
        """The replicas owe the update's step all the same: each skips it, from the same
        all-reduced gradient (:meth:`~adadamp.worker.replica.Replica.take_step`)."""
        self._step_owed = (self.loop.n_updates, 1.0, group_settings(self.optimizer))

    def _handed_on(self, plan) -> tuple[float, tuple[int, float, list[float]]]:
        """``plan``'s learning rate and the running update's step as requests send it."""
        lr = apply_plan(self.optimizer, plan, scale_buffers=False)
        return lr, (self.loop.n_updates, float(plan.momentum_buffer_scale), group_settings(self.optimizer))

    def announce_step(self, batch: Batch) -> tuple | None:
        """Plan the update's step before its round, when no step is owed: the requests carry it and
        each member takes it right after its reply, while the client reads the replies and sends the
        next requests (:meth:`~adadamp.worker.replica.Replica.after_reply`): off the critical path."""
        if self._step_owed is not None or not self._announces:
            return None
        plan = self.damper.plan_update(batch.state, len(batch.idx), None)
        lr, self._announced = self._handed_on(plan)
        return plan, lr

    def _run_updates(self, updates: list[dict], on_update, end: float) -> None:
        """The epoch's updates; the client's module is up to date when it returns (also when a
        callback stops training).  An update undone (no replica left, also at the sync that ends the
        epoch or writes a checkpoint) is run again from the commit, and callbacks are not told of it
        twice."""
        lp = self.loop
        self._set_commit(len(updates))
        self._epoch_updates = updates  # a mid-epoch sync (a checkpoint) moves the commit to its update
        reported = lp.n_updates  # on_update_end: each update number once, in order

        def update() -> dict | None:
            try:
                return self.update()
            except RolledBack:
                del updates[self._commit.n_records:]
                return None

        def report(records: list[dict]) -> None:
            nonlocal reported
            if on_update is not None and lp.n_updates > reported:  # not again when recomputed
                reported = lp.n_updates
                on_update(records)

        while True:
            try:
                run_epoch(lp, update, updates, report, end)
                self.sync()
                return
            except StopTraining:
                self.sync()
                raise
            except ReplicasLost:  # the client's copy is the commit's: the epoch goes on from there
                self._roll_back()
                del updates[self._commit.n_records:]
            except NoWorkersError:
                self._roll_back()  # the client's copy is the commit's: the clock goes back with it
                raise


def _collect(totals: Totals, replied: list, examples: dict[str, int]):
    """A round's ``on_reply``: keep the replies, and each member's examples (``examples``) and
    compute time (the slowest member's is the update's)."""

    def add(request, reply) -> None:
        totals.measured(request.worker, examples[request.worker], reply.compute_time, reply.peak_memory)
        totals.digest = (totals.digest + reply.digest) % 2**64
        replied.append(reply)

    return add
