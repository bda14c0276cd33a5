"""A worker's replica of the module and optimizer in an all-reduce fit (runs on the workers).

Each update every member computes the gradient SUM over its share, all-reduces the sums, the
example counts, the loss and the damper's statistics with ``torch.distributed`` (gloo on CPU,
NCCL on CUDA devices), divides once by the batch's total (bucket by bucket as they arrive, where
every example weighs the same: :mod:`adadamp.worker.buckets`) and keeps the mean gradient
*pending* for its step.  Where the client's damper plans the step from this update's statistics,
the next request carries the plan and the step is taken when it arrives (the plan costs no extra
round trip).  Where the plan reads nothing of the round (a constant batch, GeoDamp), the update's
own request *announces* its step and the member takes it right after its reply, while the client
reads the replies and sends the next requests: the step leaves the critical path.  Members take
the same step on the same numbers, so the replicas stay bitwise identical.

The group a replica all-reduces in is one membership *generation*, formed and left by
:class:`~adadamp.worker.generation.GroupMember` (this class's base).  A collective that fails (a
peer died, or hung past the timeout) raises :class:`~adadamp.exceptions.CollectiveError`; the
update puts back the running statistics it moved and drops the pending gradient, and the client
forms the next generation without the lost worker and recomputes the update (unless another
member answered: its all-reduce completed, every share is in it and it stepped, so the update
stands).  Steps are numbered, so none is applied twice.  A group in step with its peers when the
fit ends is kept for the next fit on the same workers (:mod:`adadamp.worker.groups`).

This module is what a replica does per update and per step, and the state it hands a joiner;
the group's formation is :mod:`adadamp.worker.generation`, its rendezvous
:mod:`adadamp.worker.rendezvous`, the bucketed all-reduce :mod:`adadamp.worker.buckets`.
"""

from __future__ import annotations

import io
import logging
import math
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..exceptions import CollectiveError
from ..records import CommitReply, GradientReply, StepVector, examples_digest, finite_update
from ..wire.averaging import update_average
from ..wire.batches import BATCH_VALUES, BatchPlan, StreamOrder, epoch_permutation
from ..wire.optimizer_plan import apply_settings
from ..wire.parameters import squared_norm, trainable
from ..wire.precision import LossScale
from . import groups
from .buckets import Buckets, _MeanOfBuckets
from .generation import GroupMember, collective_backend
from .gradient import examples, flat_buffers, set_buffers, shards_sum, weights_are_counts
from .memory import peak_since_last
from .state import FitState

if TYPE_CHECKING:
    from distributed import Worker

#: ``Buckets`` and ``collective_backend`` live in :mod:`.buckets` and :mod:`.generation`; importable here too.
__all__ = ["Buckets", "Replica", "collective_backend", "dump_state", "load_state", "step_vector"]

logger = logging.getLogger(__name__)


def step_vector(generation: int, update: int, step_of: int, buffer_scale: float, settings: list[float]) -> np.ndarray:
    """What an all-reduce request carries besides the indices (:class:`~adadamp.records.StepVector`, encoded).

    Examples
    --------
    >>> step_vector(2, 7, 6, 1.0, [0.1, 0.9]).tolist()
    [2.0, 7.0, 6.0, 1.0, 0.1, 0.9]
    """
    return StepVector(generation, update, step_of, buffer_scale, tuple(settings)).encode()


class Replica(GroupMember):
    """This worker's copy of an all-reduce fit's module (in ``state``) and optimizer.

    ``applied`` counts the updates whose step this replica has taken (its weights are the
    weights after that many updates); ``pending`` is the update whose mean gradient sits in the
    flat gradient buffer, waiting for its step.  ``worker``: the Dask worker that holds it (the
    groups' rendezvous goes over its connection to the scheduler).
    """

    def __init__(self, state: FitState, optimizer: torch.optim.Optimizer, *, fit_id: str, worker: Worker | None,
                 timeout: float, bucket_mb: float, applied: int, stream: dict | None = None):
        super().__init__(fit_id=fit_id, worker=worker, timeout=timeout, device=state.device)
        self.state = state
        self.optimizer = optimizer
        self.applied = int(applied)
        self.pending: int | None = None
        self.pending_finite = True  # whether the pending gradient is finite (a float16 fit skips its step if not)
        self.pending_epoch = 0  # the data epoch of the pending update's batch (weight averaging starts at one)
        self.announced: StepVector | None = None  # the pending update's own step, sent with its request
        self._perm, self._perm_key = None, None  # the data epoch's permutation, cached
        self._shard_of: np.ndarray | None = None  # streamed data: the blocks' shards in that epoch
        self.stream = None if stream is None else StreamOrder(**stream)  # streamed data's order
        self._layout: tuple[int, ...] | None = None  # the batch plans' layout the client sent last
        _warm_up()
        mb = 2**20
        self.buckets = Buckets(trainable(state.module), state.grads, int(bucket_mb * mb), min(mb, int(bucket_mb * mb)))

    # ------------------------------------------------------------------ state
    def dump(self) -> bytes:
        return dump_state(self.state.flat, self.state.buffers, self.optimizer, self.applied)

    def load(self, blob: bytes) -> None:
        self.applied = load_state(blob, self.state.flat, self.state.buffers, self.optimizer)
        self.pending = self.announced = None

    def take_step(self, step: StepVector | None, strict: bool = True) -> None:
        """Take the step ``step`` names unless it was taken already (steps are numbered).

        ``strict``: a replica that cannot take it (no pending gradient for that update) raises.
        """
        if step is None or step.step_of < 0:
            return
        update = step.step_of
        if self.applied > update:
            return  # taken before the last request failed
        if self.applied != update or self.pending != update:
            if not strict:
                return
            raise RuntimeError(f"replica at update {self.applied} (pending {self.pending}) cannot take step {update}")
        if self.state.kit.scales_loss:  # as the client decides from the same all-reduced gradient
            LossScale(self.optimizer).update(found_inf=not self.pending_finite)
            if not self.pending_finite:  # skipped: the weights, buffers and settings stay
                self.applied, self.pending = update + 1, None
                return
        apply_settings(self.optimizer, step.settings, step.buffer_scale)
        clip = self.state.kit.clip_grad_norm
        if clip is not None:  # every replica holds the same mean gradient: the same clip
            torch.nn.utils.clip_grad_norm_(trainable(self.state.module), clip)
        self.optimizer.step()
        if self.state.kit.averaging is not None:
            update_average(self.optimizer, trainable(self.state.module), self.state.kit.averaging, self.pending_epoch)
        self.applied, self.pending = update + 1, None

    def take_announced(self) -> None:
        """Take the step the pending update's request announced, if it is not taken yet (the
        reply went over Dask, not a channel: then before whatever the replica does next)."""
        step, self.announced = self.announced, None
        self.take_step(step)

    def after_reply(self) -> None:
        """Take the announced step right after the update's reply went out (the channel's thread
        calls it): the step runs while the client reads the replies and sends the next requests,
        instead of after the next request arrives.  A step that raises is put back: the next
        request takes it again and sends the error to the client (a lost channel would look like a
        lost worker and the update would be recomputed, to fail the same way)."""
        with self.state.lock:
            step = self.announced
            try:
                self.take_announced()
            except Exception:  # noqa: BLE001 -- raised again where the client hears it
                self.announced = step

    # ------------------------------------------------------------------ one update
    def update(self, plan: np.ndarray, n_chunks: int, epoch: int, step: np.ndarray) -> GradientReply:
        """Take the step still owed, compute the gradient sum of this member's shards and all-reduce
        the batch's; keep the step ``step`` announces for this update, to take after the reply.

        ``plan`` (:meth:`BatchPlan.to_array`) names the batch (a slice of data epoch ``epoch``'s
        permutation) and, when they changed since the last request, this member's shards; the
        member finds their examples and dropout seeds itself.  Each shard is its own forward and backward
        pass, starting from the update's running statistics, as on the parameter server: a shard's
        gradient, dropout masks and BatchNorm statistics do not depend on how many shards this
        member computes.
        """
        state = self.state
        with state.lock:
            state.last_used = time.monotonic()
            start = time.perf_counter()
            plan, step, announced = self._begin_update(plan, step)
            update = step.update
            indices, parts, ahead = self._examples_of(plan, epoch, update)
            X, y = examples(state, indices, epoch, ahead)
            overlap = self.size > 1  # the buckets read the chunk statistics before they launch
            before = flat_buffers(state.buffers) if state.buffers else None  # what a failed update leaves
            batch_n = plan.stop - plan.start
            scale = self._loss_scale(batch_n)
            try:
                sums, running = self._shard_sums(X, y, n_chunks, parts, overlap, before, scale)
                computed = time.perf_counter()  # what follows is the all-reduce the backward pass did not hide
            except BaseException:
                self._fail(before)  # buckets may be in flight: this group is spent
                raise
            # the batch's mean is its sum over its size when the criterion weighs every example
            # alike: each bucket is divided (and its norm taken) as it arrives, off the critical path
            mean = _MeanOfBuckets(state.grads, batch_n) if overlap and weights_are_counts(state.criterion) else None
            totals, running = self._all_reduce(step, overlap, sums, running, mean, before)
            n_total, weight_total, loss_total, sq_total, chunks_total = totals.cpu().tolist()
            if state.buffers:
                set_buffers(state.buffers, running / max(n_total, 1.0))
            sq_norm = self._mean_gradient(mean, batch_n, weight_total)
            if scale != 1.0:  # unscaled, as GradScaler.unscale_ (the statistics were already)
                with np.errstate(invalid="ignore", over="ignore"):
                    state.grads.mul_(float(np.float32(1.0 / scale)))
                sq_norm = squared_norm(state.grads)
            self.pending, self.pending_epoch = update, epoch
            self.pending_finite = finite_update(loss_total, weight_total, sq_norm)
            if announced and (self.pending_finite or state.kit.scales_loss):  # as the client decides
                self.announced = step
            return GradientReply(
                n=int(n_total),
                loss_sum=loss_total,
                chunk_sq_norm_sum=sq_total,
                n_chunks=int(chunks_total),
                compute_time=computed - start,  # loading, the step and the gradient
                grad=None,
                buffers=None,
                weight=weight_total,
                grad_sq_norm=sq_norm if math.isfinite(sq_norm) else math.inf,
                digest=examples_digest(indices),  # this member's examples (the client adds them up)
                peak_memory=peak_since_last(state.device),
            )

    def _begin_update(self, plan: np.ndarray, step: np.ndarray) -> tuple[BatchPlan, StepVector, bool]:
        """Decode the request's ``plan`` and ``step``, check that this replica is in the request's
        generation, and take the steps owed before the update; returns the plan, the step and
        whether the step is the update's own (announced: taken after the reply)."""
        sent_layout = len(plan) > BATCH_VALUES
        plan = BatchPlan.from_array(plan, self._layout)
        if sent_layout:  # kept first: the client sends it again after any failed request
            self._layout = plan.layout()
        step = StepVector.decode(step)
        generation, update = step.generation, step.update
        if self.group is None or generation != self.generation:
            raise CollectiveError(f"rank {self.rank} is not in generation {generation} (at {self.generation})")
        self._keep = 0.0  # an update in flight: the group is no longer known to be in step
        self.take_announced()
        announced = step.step_of == update  # this update's own step, to take after the reply
        self.take_step(None if announced else step)
        if self.applied != update:
            raise RuntimeError(f"replica at update {self.applied} asked for update {update}")
        return plan, step, announced

    def _all_reduce(self, step: StepVector, overlap: bool, sums: list[float], running: torch.Tensor | None,
                    mean: _MeanOfBuckets | None, before: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`_reduce`, or, when the collective fails, put back the running statistics
        (``before``), drop the group's work and raise :class:`CollectiveError`."""
        failure = None
        try:
            return self._reduce(overlap, sums, running, mean)
        except RuntimeError as err:  # a peer died, hung past the timeout, or left the group
            failure = str(err)  # (not kept: the error's frames hold this group's work)
        self._fail(before)
        raise CollectiveError(f"update {step.update}, rank {self.rank} of generation {step.generation}: {failure}")

    def _mean_gradient(self, mean: _MeanOfBuckets | None, batch_n: int, weight_total: float) -> float:
        """Make ``state.grads`` the batch's mean gradient (the buckets divided it already when
        every example weighs the same); returns its squared norm."""
        grads = self.state.grads
        if mean is not None and weight_total == batch_n:
            return mean.sq_norm
        # weighted examples (or members that did not find the batch: the client says so)
        if mean is not None:
            grads.mul_(batch_n)  # the buckets' division undone
        with np.errstate(invalid="ignore", over="ignore"):
            grads.mul_(1.0 / weight_total if weight_total else 0.0)
        return squared_norm(grads)

    def _examples_of(self, plan: BatchPlan, epoch: int, update: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The plan's examples of this member's shards (in shard order), one ``(dropout seed, count)``
        row per shard with any (the seeds of update ``update``), and the keys it may load ahead.
        The client checks that the members' counts add up to its batch."""
        n = self.state.data.n_total
        if self.stream is not None:  # streamed: the epoch's windowed order, and its blocks' shards
            if self._perm_key != (plan.seed, epoch, n, plan.n_shards):
                self._perm = self.stream.permutation(epoch)
                self._shard_of = self.stream.shard_of(epoch, plan.n_shards)
                self._perm_key = (plan.seed, epoch, n, plan.n_shards)
        elif self._perm_key != (plan.seed, epoch, n):
            self._perm, self._perm_key = epoch_permutation(plan.seed, epoch, n), (plan.seed, epoch, n)
        indices, counts = plan.indices(self._perm, self.state.data.block_of, self._shard_of)
        parts = np.column_stack([plan.dropout_seeds(update), counts])[counts > 0]
        return indices, parts, plan.ahead(n, epoch, self._perm)

    def _loss_scale(self, batch_n: int) -> float:
        """What this member multiplies its loss sum by: ``precision="16-mixed"``'s loss scale (kept in
        the optimizer's first param group, moved by :meth:`take_step` on every replica alike) over
        the batch size, as the parameter server's workers do; 1.0 without loss scaling."""
        if not self.state.kit.scales_loss:
            return 1.0
        return float(LossScale(self.optimizer).value) / max(1, batch_n)

    def _shard_sums(
        self, X, y, n_chunks: int, parts: np.ndarray, overlap: bool, start: torch.Tensor | None, scale: float = 1.0,
    ) -> tuple[list[float], torch.Tensor | None]:
        """The gradient sum over this member's shards, in ``state.grads`` (:func:`shards_sum`; the
        last shard's backward pass launches the buckets when ``overlap``); returns the scalars to
        all-reduce (examples, weight, loss sum, chunk statistics) and the running statistics
        weighted by each shard's examples."""
        parts = parts if len(parts) else np.zeros((1, 2), dtype=np.int64)  # no shard: a zero gradient
        before_last = (lambda statistic: self.buckets.start(self.group, statistic)) if overlap else None
        return shards_sum(self.state, X, y, n_chunks, parts, start, before_last, scale=scale)

    def _reduce(self, overlap: bool, scalars: list[float], running: torch.Tensor | None,
                mean: _MeanOfBuckets | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """All-reduce the gradient (what the buckets did not yet), the scalars and the running
        statistics weighted by the shards' examples; returns the last two, summed.  ``mean``
        takes each bucket of the gradient as it arrives."""
        state, device = self.state, self._comm_device()
        works = []
        if overlap:
            self.buckets.flush()
        elif self.size > 1:
            works.append(self.group.allreduce([state.grads]))
        # launched behind the gradient's last buckets, not after them: one collective's latency
        # less per update (every member launches in the same order, so the sums are the same)
        totals = torch.tensor(scalars, dtype=torch.float64, device=device)
        works.append(self.group.allreduce([totals]))
        if running is not None:
            running = running.to(device)
            works.append(self.group.allreduce([running]))
        if overlap:
            self.buckets.finish(self._wait, mean)
        for work in works:  # (a failure above spends the group: what is still in flight goes with it)
            self._wait(work)
        return totals, running

    def _fail(self, running: torch.Tensor | None) -> None:
        """An update failed: leave its group, and put back the running statistics it started
        from (its forward passes moved them; the update is recomputed from the same state)."""
        if running is not None:
            set_buffers(self.state.buffers, running)
        self._drop_group()

    def commit(self, step: StepVector | None, state: bool, groups: bytes | None = None, keep: float = 0.0) -> CommitReply:
        """Take the pending step (the end of an epoch or of the fit); return the state if asked.

        ``groups``: the client's param groups (``torch.save``d, without the parameters): a warm
        call changed the optimizer's hyperparameters (``set_params(optimizer__...)``).  ``keep``:
        seconds to keep the group for a later fit if this fit ends before its next update.
        """
        with self.state.lock:
            self.state.last_used = time.monotonic()
            self.take_announced()
            self.take_step(step)
            self.pending = None
            if groups is not None:
                for group, new in zip(self.optimizer.param_groups, torch.load(io.BytesIO(groups), weights_only=True)):
                    group.update({k: v for k, v in new.items() if k != "params"})
            self._keep = float(keep)
            return CommitReply(self.applied, self.dump() if state else None)

    def close(self) -> None:
        """Leave the fit; a group in step with its peers (the fit's last request was a commit that
        asked to keep it) is kept on this worker for a later fit (:mod:`adadamp.worker.groups`)."""
        self.buckets.close()
        idle = self.state.lock.acquire(blocking=False)  # not while an update runs (a client gone mid-update)
        try:
            held, self.group = [self.group, self._group_store], None
            if idle:
                self._group_store = None
                if held[0] is not None and self._keep > 0 and self.backend == "gloo" and self._members:
                    groups.keep(groups.KeptGroup(f"{self.fit_id}/{self.generation}", *held, self._members, self.rank,
                                                 self.timeout.total_seconds()), self._keep,
                                loop=None if self.worker is None else self.worker.loop)
                else:  # not kept: let it go off the fit's release
                    groups.release(held)
        finally:
            if idle:
                self.state.lock.release()


def dump_state(flat: torch.Tensor, buffers: list[torch.Tensor], optimizer, applied: int) -> bytes:
    """A replica's state as bytes (``torch.save``): weights, running statistics, optimizer state and
    the update count.  Replicas broadcast it to joiners; the client's committed copy is one too."""
    buf = io.BytesIO()
    torch.save({
        "flat": flat.detach().cpu(),
        "buffers": [b.detach().cpu() for b in buffers],
        "optimizer": optimizer.state_dict(),
        "applied": int(applied),
    }, buf)
    return buf.getvalue()


def load_state(blob: bytes, flat: torch.Tensor, buffers: list[torch.Tensor], optimizer,
               keep_groups: bool = False) -> int:
    """Load what :func:`dump_state` wrote (``weights_only``); returns its update count.

    ``keep_groups``: keep the optimizer's own param groups (the client's: its learning-rate
    schedule), taking only the per-parameter state.
    """
    saved = torch.load(io.BytesIO(blob), weights_only=True)
    with torch.no_grad():
        flat.copy_(saved["flat"])
        for b, v in zip(buffers, saved["buffers"]):
            b.copy_(v)
    state = saved["optimizer"]
    if keep_groups:
        state["param_groups"] = optimizer.state_dict()["param_groups"]
    optimizer.load_state_dict(state)
    return int(saved["applied"])


def _warm_up() -> None:
    """Pay, at set-up, what a process pays the first time it builds an optimizer and steps it
    (torch imports ``torch._dynamo``: 0.6-0.9 s here), so the first update does not."""
    param = torch.zeros(1, requires_grad=True)
    param.grad = torch.zeros(1)
    torch.optim.SGD([param], lr=0.0).step()
