"""A worker's replica of the module and optimizer in an all-reduce fit (runs on the workers).

Each update every member computes the gradient SUM over its share, all-reduces the sums, the
example counts, the loss and the damper's statistics with ``torch.distributed`` (gloo on CPU,
NCCL on CUDA devices), divides once by the batch's total (bucket by bucket as they arrive, where
every example weighs the same) and keeps the mean gradient *pending* for its step.  Where the
client's damper plans the step from this update's statistics, the next request carries the plan
and the step is taken when it arrives (the plan costs no extra round trip).  Where the plan reads
nothing of the round (a constant batch, GeoDamp), the update's own request *announces* its step
and the member takes it right after its reply, while the client reads the replies and sends the
next requests: the step leaves the critical path.  Members take the same step on the same
numbers, so the replicas stay bitwise identical.

Gradients are all-reduced in buckets while the backward pass still runs (as PyTorch's DDP
does): a bucket is a contiguous range of the flat gradient, launched as soon as the backward
pass has filled it, in the same order on every rank.

Membership: a group is one *generation* with its own rendezvous keys (the pattern of
torchft's Manager), kept in the scheduler and reached over Dask's comm (:class:`SchedulerStore`).
Forming one, the members first take the step they may still owe, then rank 0 (a member of the
last generation, or the client's committed copy) broadcasts weights, running statistics and
optimizer state, so a joiner starts from them (no more bytes than the model's state can hold: gloo
authenticates no peer).  Before that, every pair of a new gloo group proves itself with a tag keyed
by a secret from the rendezvous (:meth:`Replica._check_pairs`): a stranger taken for a peer fails the
group within ``PAIR_CHECK`` seconds, and it is formed again.  A collective that fails (a peer died,
or hung past the timeout) raises :class:`~adadamp.exceptions.CollectiveError` and drops the
pending gradient; the client forms the next generation without the lost worker and recomputes the update (unless another member
answered: its all-reduce completed, every share is in it and it stepped, so the update stands).
Steps are numbered, so none is applied twice.  A group in step with its peers when the fit ends is kept for the next
fit on the same workers (:mod:`adadamp.worker.groups`), which takes it over after a handshake.

One module because the replica, its group membership, its buckets and the scheduler-held store
share one failure protocol (a failed collective undoes the update's running statistics and
drops the group); split, each part would need the others' state to undo.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from distributed.comm import get_address_host
from distributed.utils import sync

from ..exceptions import CollectiveError
from ..records import CommitReply, GradientReply, GroupReply, StepVector, examples_digest, finite_update
from ..wire.batches import BATCH_VALUES, BatchPlan, epoch_permutation
from ..wire.optimizer_plan import apply_settings
from ..wire.parameters import squared_norm, trainable
from . import groups
from .gradient import examples, flat_buffers, set_buffers, shards_sum, weights_are_counts
from .state import FitState

if TYPE_CHECKING:
    from distributed import Worker


logger = logging.getLogger(__name__)

#: Seconds a collective runs before its members start looking for a failed peer every as often.
ABORT_POLL = 0.2
#: The store key that marks a generation given up (by a member whose collective failed, or by the
#: client when a member is lost while the group forms).
ABORT = "abort"
#: The longest pause between two looks at the rendezvous for a peer's keys.  Members reach the
#: rendezvous up to tens of milliseconds apart (a busy core); looks double from 1 ms up to this, so
#: a peer's keys are seen at most this late.  Each look is one small scheduler call.
RENDEZVOUS_POLL = 0.01
_FAILED_GROUPS: list = []  # groups left after a failure (never destroyed: their threads may still wait)

#: Seconds a new gloo group's members have to prove every pair a member's (:meth:`Replica._check_pairs`),
#: instead of the collective timeout: a stranger that took a pair is found this soon and the group is
#: formed again.  The check is one message each way per pair once every pair is connected: 0.4 ms
#: median on two local workers of the idle 2-core machine, 23 ms at most with four busy processes.
PAIR_CHECK = 5.0
#: The store key prefix of the members' per-generation secrets (one per member: ``secret/<rank>``).
SECRET = "secret"

#: The most a replica's state can hold: its weights and running statistics, and per parameter at
#: most this many more copies of them in the optimizer's state (momentum 1, Adam 2, AMSGrad 3)...
STATE_COPIES = 8
#: ... plus this many bytes of ``torch.save`` records per tensor, and 1 MiB.
STATE_RECORD_BYTES = 4096


def step_vector(generation: int, update: int, step_of: int, buffer_scale: float, settings: list[float]) -> np.ndarray:
    """What an all-reduce request carries besides the indices (:class:`~adadamp.records.StepVector`, encoded).

    Examples
    --------
    >>> step_vector(2, 7, 6, 1.0, [0.1, 0.9]).tolist()
    [2.0, 7.0, 6.0, 1.0, 0.1, 0.9]
    """
    return StepVector(generation, update, step_of, buffer_scale, tuple(settings)).encode()


def collective_backend(device: torch.device | str) -> str:
    """The ``torch.distributed`` backend for replicas on ``device``: NCCL for CUDA, else gloo.

    Examples
    --------
    >>> collective_backend("cpu"), collective_backend("cuda:1")
    ('gloo', 'nccl')
    """
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


class SchedulerStore(dist.Store):
    """One generation's rendezvous: ``torch.distributed`` store keys in the Dask scheduler's metadata
    (``set_metadata``: "small amounts of data ... for administrative purposes"), reached over the
    worker's own connection to the scheduler.

    So nothing listens for it: only who can talk to the scheduler (whom Dask trusts with running
    code on the workers anyway) can read a member's address, plant a key or join the group, and on
    a TLS cluster the rendezvous is encrypted with the rest of Dask's comm.  Gloo calls ``set``,
    ``get`` and ``wait`` while it forms the group (from the thread that builds it, never the
    worker's event loop); the members use ``set`` and ``check`` for ``abort``.  A wait polls: a
    generation's keys are a few hundred bytes per member, written once.
    """

    def __init__(self, worker: Worker, keys: tuple[str, ...], timeout: float):
        super().__init__()
        self._worker, self._keys, self._timeout = worker, list(keys), timeout
        self._seen: dict = {}  # the entries read so far: a generation's keys are written once

    def _call(self, op: str, **kwargs):
        try:
            return sync(self._worker.loop, getattr(self._worker.scheduler, op), callback_timeout=self._timeout,
                        **kwargs)
        except OSError as err:  # the scheduler is gone (or slow): as a store that stopped answering
            raise dist.DistStoreError(f"rendezvous {'/'.join(self._keys)}: {op} failed: {err!r}") from err

    def _entries(self) -> dict:
        entries = self._call("get_metadata", keys=self._keys, default=None) or {}
        self._seen.update(entries)
        return entries

    def set(self, key: str, value) -> None:
        self._call("set_metadata", keys=[*self._keys, key], value=bytes(value))

    def check(self, keys: list[str]) -> bool:
        entries = self._entries()
        return all(k in entries for k in keys)

    def get(self, key: str) -> bytes:
        return self._wait_for([key])[key]

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._wait_for(keys, None if timeout is None else timeout.total_seconds())

    def _wait_for(self, keys: list[str], timeout: float | None = None) -> dict:
        if all(k in self._seen for k in keys):  # gloo asks for each peer's address in turn: one look for all
            return self._seen
        start = time.monotonic()
        deadline = start + (self._timeout if timeout is None else timeout)
        delay = 0.001
        while True:
            entries = self._entries()
            if all(k in entries for k in keys):
                return entries
            if ABORT in entries:  # a member (or the client) gave this generation up: so does its rendezvous
                raise dist.DistStoreError(f"rendezvous {'/'.join(self._keys)}: aborted while waiting for {keys}")
            if time.monotonic() > deadline:
                missing = [k for k in keys if k not in entries]
                raise dist.DistStoreError(f"rendezvous {'/'.join(self._keys)}: no {missing} in {deadline - start:.0f} s")
            time.sleep(delay)
            delay = min(2 * delay, RENDEZVOUS_POLL)


def gloo_group(store: dist.Store, rank: int, size: int, host: str, timeout: datetime.timedelta):
    """A gloo group whose sockets listen on ``host`` (the worker's Dask address: the interface its
    peers reach it on), or on the interfaces ``GLOO_SOCKET_IFNAME`` names where it is set.

    Gloo's own default is the interface of the machine's host name, whatever the cluster uses;
    binding a device to an address goes through ``_Options``, as torch's own gloo tests do.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, size, options)


class Buckets:
    """The flat gradient cut into buckets that are all-reduced during the backward pass.

    Buckets follow the parameters in reverse (the order the backward pass fills them); the first
    is small (``first_bytes``) so communication starts early, the others up to ``bucket_bytes``
    (DDP's 1 MB and 25 MB).  Hooks fire after a parameter's gradient is accumulated; a bucket is
    launched when all its parameters are in and every bucket before it was launched.
    """

    def __init__(self, params: list[torch.nn.Parameter], grads: torch.Tensor, bucket_bytes: int, first_bytes: int):
        self.grads = grads
        sizes = [p.numel() for p in params]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
        self.ranges: list[tuple[int, int]] = []
        self.members: list[int] = []
        bucket_of: dict[int, int] = {}
        limit, lo, hi, count = first_bytes, None, None, 0
        for i in reversed(range(len(params))):
            lo, hi = int(starts[i]), hi if hi is not None else int(starts[i] + sizes[i])
            bucket_of[i] = len(self.ranges)
            count += 1
            if (hi - lo) * grads.element_size() >= limit or i == 0:
                self.ranges.append((lo, hi))
                self.members.append(count)
                limit, hi, count = bucket_bytes, None, 0
        self._next = 0
        self._hooks = [
            p.register_post_accumulate_grad_hook(lambda _p, b=bucket_of[i]: self._filled(b)) for i, p in enumerate(params)
        ]
        self.group = None
        self._armed = False
        self._statistic = None
        self._works: list = []
        self._error: BaseException | None = None

    def start(self, group, statistic=None) -> None:
        """Launch buckets on ``group`` as the coming backward pass fills them, each read into
        ``statistic`` (:class:`~adadamp.worker.gradient.ChunkStatistic`) first."""
        self.group, self._armed, self._works, self._error = group, True, [], None
        self._statistic = statistic
        self._count = [0] * len(self.ranges)
        self._next = 0

    @property
    def launched(self) -> int:
        """Buckets launched so far in this update (by the backward pass, before :meth:`finish`)."""
        return self._next

    def _filled(self, bucket: int) -> None:
        if not self._armed:
            return
        self._count[bucket] += 1
        while self._next < len(self.ranges) and self._count[self._next] == self.members[self._next]:
            self._launch()

    def _launch(self) -> None:
        lo, hi = self.ranges[self._next]
        self._next += 1
        try:
            if self._statistic is not None:  # before the all-reduce overwrites the local sum
                self._statistic.read(lo, hi)
            self._works.append((self.group.allreduce([self.grads[lo:hi]]), lo, hi))
        except RuntimeError as err:  # a hook must not raise into autograd: reported by finish()
            self._error = err

    def disarm(self) -> None:
        self._armed, self._works, self._statistic = False, [], None

    def flush(self) -> None:
        """Launch the buckets the backward pass did not fill (unused parameters, an empty share), in order.

        The backward pass is over, so its statistic has read what it still needed."""
        self._statistic = None
        while self._next < len(self.ranges):
            self._launch()

    def finish(self, wait, arrived=None) -> None:
        """Launch what :meth:`flush` would, ``wait(work)`` for every bucket and, as each comes in,
        call ``arrived(lo, hi)`` with its range (while the later buckets are still on the wire)."""
        try:
            self.flush()
            for work, lo, hi in self._works:
                wait(work)
                if arrived is not None:
                    arrived(lo, hi)
        finally:
            self._armed, self._works = False, []
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self.group = None  # a group kept for a later fit must go when it is dropped, not at a garbage collection


class _MeanOfBuckets:
    """Divides each all-reduced bucket of the gradient sum by the batch's size and adds up its
    squared norm, as :meth:`Buckets.finish` hands it over: the division and the norm of all but
    the last bucket overlap the later buckets' all-reduce (after it, they cost a pass over the
    whole gradient each: ~10 and ~9 ms at 50M parameters on one core).  Elementwise, so the
    mean is bitwise the one divided at once; the norm sums per bucket (float32 reductions within
    one, about 1e-7 relative from a norm taken at once)."""

    def __init__(self, grads: torch.Tensor, batch_n: int):
        self.grads, self.scale, self.sq_norm = grads, 1.0 / batch_n, 0.0

    def __call__(self, lo: int, hi: int) -> None:
        part = self.grads[lo:hi]
        part.mul_(self.scale)
        self.sq_norm += squared_norm(part)


class Replica:
    """This worker's copy of an all-reduce fit's module (in ``state``) and optimizer.

    ``applied`` counts the updates whose step this replica has taken (its weights are the
    weights after that many updates); ``pending`` is the update whose mean gradient sits in the
    flat gradient buffer, waiting for its step.  ``worker``: the Dask worker that holds it (the
    groups' rendezvous goes over its connection to the scheduler).
    """

    def __init__(self, state: FitState, optimizer: torch.optim.Optimizer, *, fit_id: str, worker: Worker | None,
                 timeout: float, bucket_mb: float, applied: int):
        self.state = state
        self.optimizer = optimizer
        self.fit_id = fit_id
        self.worker = worker
        self.timeout = datetime.timedelta(seconds=timeout)
        self.backend = collective_backend(state.device)
        self.applied = int(applied)
        self.pending: int | None = None
        self.announced: StepVector | None = None  # the pending update's own step, sent with its request
        self._perm, self._perm_key = None, None  # the data epoch's permutation, cached
        self._layout: tuple[int, ...] | None = None  # the batch plans' layout the client sent last
        self.group = None
        self.generation: int | None = None
        self.rank, self.size = 0, 1
        self._prefix: dist.Store | None = None  # the current generation's rendezvous
        self._group_store: dist.Store | None = None  # the store the group was formed with (a kept one's: older)
        self._members: tuple[str, ...] = ()  # the group's workers in rank order
        self._keep = 0.0  # seconds to keep the group after the fit (set by a commit, cleared by an update)
        _warm_up()
        mb = 2**20
        self.buckets = Buckets(trainable(state.module), state.grads, int(bucket_mb * mb), min(mb, int(bucket_mb * mb)))

    # ------------------------------------------------------------------ the group
    def join(self, generation: int, rank: int, size: int, step: StepVector | None, restore: bytes | None,
             members: tuple[str, ...] = (), reuse: str | None = None, broadcast: bool = True) -> GroupReply:
        """Form generation ``generation``'s group as ``rank`` of ``size`` and take rank 0's state.

        ``step`` is the step this replica may still owe (taken first, if it was not); ``restore``
        (rank 0 only) is the client's committed state, used when no member of the last
        generation remains.  ``members``: the group's workers in rank order.  ``reuse``: the key
        of a group kept from an earlier fit (:mod:`adadamp.worker.groups`) that every member
        offered: taken instead of forming one.  ``broadcast`` False: every member was set up from
        the same state (the client knows), so rank 0 sends none.
        """
        with self.state.lock:
            return self._join(generation, rank, size, step, restore, tuple(members), reuse, broadcast)

    def _join(self, generation, rank, size, step, restore, members, reuse, broadcast) -> GroupReply:
        start = time.perf_counter()
        self.take_announced()
        self.take_step(step, strict=False)  # a joiner owes nothing: it takes rank 0's state below
        self._keep = 0.0
        held = [self.group, self._group_store]  # the last generation's group: its peers may be gone
        self.group = self._group_store = self.buckets.group = None
        groups.release(held)
        try:
            store = self._prefix = SchedulerStore(self.worker, (self.fit_id, str(generation)),
                                                  self.timeout.total_seconds())
            if reuse is not None:
                kept = groups.take(reuse, members, self.timeout.total_seconds())
                if kept is None or kept.rank != rank:
                    raise RuntimeError(f"the group {reuse} kept from an earlier fit is gone")
                self._group_store = kept.store
                self.group, self.generation, self.rank, self.size = kept.group, generation, rank, size
                self._handshake()
            else:
                groups.drop()  # the members changed: another group forms on this worker
                self._group_store = store
                if self.backend == "nccl":  # untested here (no GPU on the development machine)
                    group = self._abortable(lambda: dist.ProcessGroupNCCL(store, rank, size))
                else:
                    store.set(f"{SECRET}/{rank}", os.urandom(16))  # before its address: peers see both at once
                    host = get_address_host(self.worker.address)
                    group = self._abortable(lambda: gloo_group(store, rank, size, host, self.timeout))
                self.group, self.generation, self.rank, self.size = group, generation, rank, size
                if self.backend == "gloo":
                    self._check_pairs(store)
            self._members = members
            if restore is not None:
                self.load(restore)
            if broadcast or restore is not None:
                self._broadcast_state()
        except RuntimeError as err:
            failure = str(err)
        else:
            return GroupReply(self.applied, time.perf_counter() - start, reused=reuse is not None,
                              broadcast=bool(broadcast or restore is not None))
        self._drop_group(abort=True)  # also when no group was built: the peers still wait in the rendezvous
        raise CollectiveError(f"forming generation {generation} failed on rank {rank}: {failure}")

    def _handshake(self) -> None:
        """Check, over a group kept from an earlier fit, that every member took it for this fit and
        generation (two fits that both found it kept could each have taken it on some members):
        the largest and the smallest of the members' tags must be this member's."""
        digest = hashlib.blake2b(f"{self.fit_id}/{self.generation}".encode(), digest_size=8).digest()
        tag = int.from_bytes(digest, "little") >> 2  # 62 bits: its negation fits too
        both = torch.tensor([tag, -tag], dtype=torch.int64, device=self._comm_device())
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._wait(self.group.allreduce([both], options))
        if both.tolist() != [tag, -tag]:
            raise RuntimeError("the kept group was taken by another fit on some members")

    def _check_pairs(self, store: SchedulerStore) -> None:
        """Check, before anything else is sent over a gloo group just formed, that each pair's peer
        is the member the rendezvous named, within ``PAIR_CHECK`` seconds.

        Gloo's listener takes the first connection that sends a pair's sequence number (a small
        integer) for that pair, so a local process that connects to a member's new port before the
        peer does is taken for it, and the first collective waits for the collective timeout.  Each
        member sends each peer (an all-to-all: one message per pair) a tag keyed by its own secret,
        written to the scheduler-held rendezvous that no stranger reads, and checks the tag each
        peer sent it: a stranger cannot make one, and the tag it receives is worth nothing for
        another pair or generation.
        """
        secrets = store._wait_for([f"{SECRET}/{r}" for r in range(self.size)])  # seen with the peers' addresses
        mine = secrets[f"{SECRET}/{self.rank}"]
        sent = torch.tensor([_pair_tag(mine, p) for p in range(self.size)], dtype=torch.int64)
        received = torch.zeros(self.size, dtype=torch.int64)
        self._wait(self.group.alltoall_base(received, sent, [], []), PAIR_CHECK, "checking its pairs")
        strangers = [p for p in range(self.size)
                     if p != self.rank and received[p].item() != _pair_tag(secrets[f"{SECRET}/{p}"], self.rank)]
        if strangers:
            raise RuntimeError(f"the peers of ranks {strangers} are not the members the rendezvous named")

    def _abortable(self, build):
        """``build()`` the group in a thread of its own, and give it up when the generation is
        aborted (a peer died in the rendezvous: the client or a peer set ``abort``) or the
        collective timeout passed.

        A peer that dies before writing its rendezvous keys is noticed by the store's waits
        (:class:`SchedulerStore` looks for ``abort`` too); one that dies after, while the group's
        sockets connect, only from here.  The abandoned thread ends with its own timeout at the
        latest; a group it still builds is kept aside, never used.
        """
        done, box = threading.Event(), {}

        def run():
            try:
                box["group"] = build()
            except BaseException as err:  # noqa: BLE001 -- handed to the waiting thread
                box["error"] = err
            finally:
                done.set()

        threading.Thread(target=run, name=f"adadamp-rendezvous-{self.fit_id}", daemon=True).start()
        try:
            self._until_done(done, "forming its group")
        except RuntimeError:
            _FAILED_GROUPS.append((box, self._prefix))  # whatever the thread still builds stays aside
            raise
        if "error" in box:
            raise box["error"]
        return box["group"]

    def _broadcast_state(self) -> None:
        """Rank 0's weights, running statistics and optimizer state to every member."""
        device = self._comm_device()
        blob = self.dump() if self.rank == 0 else b""
        length = torch.tensor([len(blob)], dtype=torch.int64, device=device)
        self._wait(self.group.broadcast(length, 0))
        if self.rank == 0:
            data = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
        else:
            n, most = int(length.item()), self.max_state_bytes()
            if not 0 < n <= most:  # checked before allocating: gloo's peers are not authenticated
                raise RuntimeError(f"rank 0 announced {n} bytes of state; this model's state holds at most {most}")
            data = torch.empty(n, dtype=torch.uint8, device=device)
        self._wait(self.group.broadcast(data, 0))
        if self.rank != 0:
            self.load(data.cpu().numpy().tobytes())

    def max_state_bytes(self) -> int:
        """The most bytes :meth:`dump` can write for this model (``STATE_COPIES``)."""
        tensors = [*self.state.module.parameters(), *self.state.buffers]
        weights = sum(t.numel() * t.element_size() for t in tensors)
        return STATE_COPIES * (weights + STATE_RECORD_BYTES * len(tensors)) + 2**20

    def _comm_device(self) -> torch.device:
        return self.state.device if self.backend == "nccl" else torch.device("cpu")

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
        apply_settings(self.optimizer, step.settings, step.buffer_scale)
        self.optimizer.step()
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
            indices, parts, ahead = self._examples_of(plan, epoch, update)
            X, y = examples(state, indices, epoch, ahead)
            overlap = self.size > 1  # the buckets read the chunk statistics before they launch
            before = flat_buffers(state.buffers) if state.buffers else None  # what a failed update leaves
            try:
                sums, running = self._shard_sums(X, y, n_chunks, parts, overlap, before)
                computed = time.perf_counter()  # what follows is the all-reduce the backward pass did not hide
            except BaseException:
                self._fail(before)  # buckets may be in flight: this group is spent
                raise
            # the batch's mean is its sum over its size when the criterion weighs every example
            # alike: each bucket is divided (and its norm taken) as it arrives, off the critical path
            batch_n = plan.stop - plan.start
            mean = _MeanOfBuckets(state.grads, batch_n) if overlap and weights_are_counts(state.criterion) else None
            failure = None
            try:
                totals, running = self._reduce(overlap, sums, running, mean)
            except RuntimeError as err:  # a peer died, hung past the timeout, or left the group
                failure = str(err)  # (not kept: the error's frames hold this group's work)
            if failure is not None:
                self._fail(before)
                raise CollectiveError(f"update {update}, rank {self.rank} of generation {generation}: {failure}")
            n_total, weight_total, loss_total, sq_total, chunks_total = totals.cpu().tolist()
            if state.buffers:
                set_buffers(state.buffers, running / max(n_total, 1.0))
            if mean is not None and weight_total == batch_n:
                sq_norm = mean.sq_norm
            else:  # weighted examples (or members that did not find the batch: the client says so)
                if mean is not None:
                    state.grads.mul_(batch_n)  # the buckets' division undone
                with np.errstate(invalid="ignore", over="ignore"):
                    state.grads.mul_(1.0 / weight_total if weight_total else 0.0)
                sq_norm = squared_norm(state.grads)
            self.pending = update
            if announced and finite_update(loss_total, weight_total, sq_norm):  # as the client decides
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
            )

    def _examples_of(self, plan: BatchPlan, epoch: int, update: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The plan's examples of this member's shards (in shard order), one ``(dropout seed, count)``
        row per shard with any (the seeds of update ``update``), and the keys it may load ahead.
        The client checks that the members' counts add up to its batch."""
        n = self.state.data.n_total
        if self._perm_key != (plan.seed, epoch, n):
            self._perm, self._perm_key = epoch_permutation(plan.seed, epoch, n), (plan.seed, epoch, n)
        indices, counts = plan.indices(self._perm, self.state.data.block_of)
        parts = np.column_stack([plan.dropout_seeds(update), counts])[counts > 0]
        return indices, parts, plan.ahead(n, epoch, self._perm)

    def _shard_sums(
        self, X, y, n_chunks: int, parts: np.ndarray, overlap: bool, start: torch.Tensor | None
    ) -> tuple[list[float], torch.Tensor | None]:
        """The gradient sum over this member's shards, in ``state.grads`` (:func:`shards_sum`; the
        last shard's backward pass launches the buckets when ``overlap``); returns the scalars to
        all-reduce (examples, weight, loss sum, chunk statistics) and the running statistics
        weighted by each shard's examples."""
        parts = parts if len(parts) else np.zeros((1, 2), dtype=np.int64)  # no shard: a zero gradient
        before_last = (lambda statistic: self.buckets.start(self.group, statistic)) if overlap else None
        return shards_sum(self.state, X, y, n_chunks, parts, start, before_last)

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

    def _wait(self, work, timeout: float | None = None, what: str = "a collective") -> None:
        """Wait for a collective (at most ``timeout`` seconds, the collective timeout by default),
        and give it up when another member's failed.

        A peer that dies is noticed at once only by the members it talks to directly; the others
        would wait for the collective timeout.  So a member whose collective fails says so in the
        generation's store (``abort``), and a member still waiting after ``ABORT_POLL`` looks there
        every ``ABORT_POLL`` seconds.  A normal collective never looks.
        """
        done = threading.Event()
        work.get_future().add_done_callback(lambda _: done.set())
        self._until_done(done, f"generation {self.generation}: {what}", timeout)
        work.wait()  # done: raises the collective's error, if it failed

    def _until_done(self, done: threading.Event, what: str, timeout: float | None = None) -> None:
        """Wait for ``done``, looking every ``ABORT_POLL`` for the generation's ``abort``; raise
        when it is there (a peer failed or was lost) or ``timeout`` (the collective timeout) passed."""
        limit = self.timeout.total_seconds() if timeout is None else min(timeout, self.timeout.total_seconds())
        deadline = time.monotonic() + limit
        while not done.wait(ABORT_POLL):
            if self._prefix.check([ABORT]):
                raise RuntimeError(f"{what}: given up, a peer failed or was lost")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not done within {limit:g} s")

    def _fail(self, running: torch.Tensor | None) -> None:
        """An update failed: leave its group, and put back the running statistics it started
        from (its forward passes moved them; the update is recomputed from the same state)."""
        if running is not None:
            set_buffers(self.state.buffers, running)
        self._drop_group()

    def _drop_group(self, abort: bool = False) -> None:
        """Leave a group after a failure: tell the other members (``abort`` in the generation's
        store) and keep the group object alive, aside: its threads may still wait on a peer until
        the timeout, and destroying it would wait for them.  ``abort``: say so also when no group
        was formed (a failed rendezvous)."""
        self.buckets.disarm()
        group, self.group, self.pending = self.group, None, None
        if group is not None:  # the stores too: the group's C++ side uses the one it was formed with
            _FAILED_GROUPS.append((group, self._group_store, self._prefix))
        if (group is not None or abort) and self._prefix is not None:
            with contextlib.suppress(Exception):  # the scheduler may be gone
                self._prefix.set(ABORT, b"1")

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


def _pair_tag(secret: bytes, peer: int) -> int:
    """What a member keyed by ``secret`` sends rank ``peer`` to prove itself (:meth:`Replica._check_pairs`)."""
    return int.from_bytes(hashlib.blake2b(str(peer).encode(), key=secret, digest_size=8).digest(), "little", signed=True)


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
