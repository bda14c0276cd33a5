"""Worker side: a warm model per fit and the gradient over resident data.

This module runs inside Dask worker processes and never imports the client
side.  A :class:`TrainerPlugin` installs a few RPC handlers on each worker; the
client calls them directly (``client.rpc(address)``), which costs one network
round trip instead of a scheduler-mediated task (docs/guide/performance.rst).  On ``tcp://``
workers the per-update gradient requests then bypass Dask's comm altogether:
the set-up opens a :class:`~adadamp.wire.channel.ChannelServer` whose thread
computes the gradients, off the worker's event loop, so heartbeats continue
while a gradient is computed.  Elsewhere gradients are Dask RPCs, computed on
one dedicated thread per worker process (or inline when they are quick).

Per fit the worker keeps (keyed by a fit id, so several fits can share a
worker): the module on its device with its parameters and gradients viewing
two flat buffers, the criterion, and the data blocks the client placed on it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import cloudpickle
import dask
import numpy as np
import torch
from distributed import WorkerPlugin
from distributed.protocol import to_serialize

from ..exceptions import UnknownFitError
from ..records import (
    Block,
    BlockMove,
    BlocksReply,
    ChannelOffer,
    CommitRequest,
    GradientReply,
    GradientRequest,
    GroupRequest,
    ReleaseReply,
    ReleaseRequest,
    SetupReply,
    SetupRequest,
    StepVector,
    TrainingKit,
    to_message,
)
from ..wire.channel import IDLE_TIMEOUT, ChannelServer, channel_host
from ..wire.parameters import bind_parameters, examples_independent, flatten_parameters, float_buffers, with_attributes
from ..wire.rpc import EXPECTED, failure_reply
from ..wire.shm import attach, attach_data
from . import groups as kept_groups
from .gradient import share_gradient
from .lifetime import tell_allocator
from .loading import ExampleLoader
from .replica import Replica
from .state import FitState

__all__ = ["TrainerPlugin"]

logger = logging.getLogger(__name__)

HANDLERS = ("adadamp_setup", "adadamp_data", "adadamp_gradient", "adadamp_release", "adadamp_group", "adadamp_commit")
REMOVE_WORKER = "remove-worker"  # the scheduler's message to every worker when it removes one
FORGET_AGAIN = (0.2, 1.0, 3.0)  # seconds after it: connections to the removed worker are dropped again
INLINE_SECONDS = 0.1  # gradients faster than this run on the worker's event loop
IDLE_SECONDS = IDLE_TIMEOUT  # a fit with no request for this long is dropped (its client is gone)


def _set_native_malloc() -> None:
    """Undo Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` inside this process.

    That setting pins glibc's mmap threshold at 128 KiB, so every tensor is a
    fresh mmap/munmap and PyTorch runs 1.5-2x slower.
    ``mallopt`` restores large thresholds at run time.
    """
    path = ctypes.util.find_library("c")
    if not path:
        return
    try:
        libc = ctypes.CDLL(path)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 2**20)
        libc.mallopt(m_trim_threshold, 128 * 2**20)
    except (OSError, AttributeError):  # not glibc
        pass


def _trim() -> None:
    """Return the heap's free memory to the system (glibc's ``malloc_trim``): blocks below the mmap
    threshold :func:`_set_native_malloc` raised live on the heap, and a streamed fit frees a
    window's worth of them at a time, which the process would otherwise keep (Dask counts it)."""
    path = ctypes.util.find_library("c")
    if path:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(path).malloc_trim(0)


class _ForgetRemovedWorkers:
    """The worker's ``remove-worker`` stream handler, which also drops this worker's connections to
    the removed worker, open and being opened (``ConnectionPool.remove``).

    Dask's own handler forgets where the removed worker's keys were, but a fetch already on its way
    to it goes on: connecting to a dead worker's port is refused and retried until
    ``distributed.comm.timeouts.connect`` (30 s by default), and a fetch can still start from a
    message the scheduler sent before it removed the worker.  A data placement whose blocks
    depend on keys the dead worker held then waited those 30 s (measured: 1 kill in 4-10 during the
    first placement of dask data, a fit of 35.6 s against 6.0 s).  Dropping the connections, at once
    and again over the next ``FORGET_AGAIN`` seconds, fails such a fetch within them, and the worker
    asks the scheduler where the keys are now.
    """

    def __init__(self, dask_worker, handle):
        self.dask_worker, self.handle = dask_worker, handle

    def __call__(self, worker: str, **message) -> None:
        self.handle(worker=worker, **message)
        reason = f"worker {worker} was removed from the cluster"
        self.dask_worker.rpc.remove(worker, reason=reason)
        loop = asyncio.get_running_loop()  # stream handlers run on the worker's event loop
        for delay in FORGET_AGAIN:
            loop.call_later(delay, functools.partial(self.dask_worker.rpc.remove, worker, reason=reason))


def _compute_thread_start() -> None:
    """Set up the calling thread to compute gradients: torch threads, and the batch scheduling policy.

    Under ``SCHED_BATCH`` (Linux; any user may choose it for own threads) a
    waking gradient thread does not preempt the thread that woke it.  On a
    machine shared with the client, the client's request to worker 0 would
    otherwise often hand the client's core to worker 0 before the request to
    worker 1 went out, and worker 1 started late (measured on 2 cores: the
    client's send took 0.34-0.47 ms on average with tails of 2-4 ms, and
    0.07-0.14 ms under ``SCHED_BATCH``).  CPU shares are unchanged.
    """
    torch.set_num_threads(TRAINER.nthreads)
    if hasattr(os, "SCHED_BATCH"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _answers_expected_failures(handler):
    """``handler``, answering its expected failures (:data:`~adadamp.wire.rpc.EXPECTED`: a lost
    peer, a fit this worker no longer holds) to the client with one WARNING line here, instead of
    raising them: Dask logs a handler's exception at ERROR with a traceback, which reads as a crash
    for a fault the client recovers from.  Other errors are raised as before."""

    @functools.wraps(handler)
    async def answer(self, **message):
        try:
            return await handler(self, **message)
        except EXPECTED as err:
            where = None if self.worker is None else self.worker.address
            logger.warning("%s of fit %s on %s: %s: %s (answered to the client, which recovers)", handler.__name__,
                           message.get("fit_id"), where, type(err).__name__, " ".join(str(err).split()))
            return failure_reply(err)

    return answer


class Trainer:
    """This worker process's fits, keyed by fit id (several fits may share a worker), and the
    handlers the client calls, one method per RPC (``adadamp_setup``, ``adadamp_gradient``, ...).

    One per process (:data:`TRAINER`): it outlives the plugin, which a client registers again when
    it finds another scheduler (Dask then tears the old plugin down and sets the new one up).  Gradients of all fits are
    computed on one thread (``executor``), so concurrent fits queue instead of competing for the
    worker's cores.
    """

    def __init__(self):
        self.fits: dict[str, FitState] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adadamp-compute")
        self.worker = None  # the Dask worker, once the plugin is set up
        self.host: str | None = None  # where this worker's channels listen (tcp:// workers)
        self.nthreads = 1
        #: What this process's set-ups used, counted for tests and diagnostics (``client.run``):
        #: ``setups``; ``shared_weights`` and ``shared_data`` (the client's shared memory mapped);
        #: ``channels`` (a gradient channel opened); all-reduce groups ``groups_formed`` and
        #: ``groups_reused`` (kept from an earlier fit), ``state_broadcasts`` (rank 0's state sent).
        self.stats: collections.Counter = collections.Counter()

    def attach(self, worker) -> None:
        """Set PyTorch up for ``worker`` and install the handlers (the plugin's set-up)."""
        _set_native_malloc()
        self.nthreads = max(1, int(getattr(worker.state, "nthreads", 1)))
        self.worker, self.host = worker, channel_host(worker.address)
        torch.set_num_threads(self.nthreads)  # the event loop thread (quick gradients)
        self.executor.submit(_compute_thread_start).result()
        for op in HANDLERS:
            worker.handlers[op] = getattr(self, op)
        handle = worker.stream_handlers.get(REMOVE_WORKER)
        if handle is not None and not isinstance(handle, _ForgetRemovedWorkers):
            worker.stream_handlers[REMOVE_WORKER] = _ForgetRemovedWorkers(worker, handle)

    def detach(self, worker) -> None:
        for op in HANDLERS:
            worker.handlers.pop(op, None)
        handle = worker.stream_handlers.get(REMOVE_WORKER)
        if isinstance(handle, _ForgetRemovedWorkers):
            worker.stream_handlers[REMOVE_WORKER] = handle.handle
        kept_groups.close()  # its peers may be closing too; destroyed before this process may exit

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _unpickle(self, payload: bytes, what: str):
        """``cloudpickle.loads``; a class whose module this worker cannot import is named with the fixes."""
        try:
            return cloudpickle.loads(payload)
        except ModuleNotFoundError as err:
            address = None if self.worker is None else self.worker.address
            raise ModuleNotFoundError(
                f"Worker {address} cannot import {err.name!r}, which {what} of this fit needs. Install it "
                f"where the workers run, send its file with client.upload_file(...), or have it pickled by value: "
                f"cloudpickle.register_pickle_by_value({err.name}) before the fit.",
                name=err.name,
            ) from err

    # ------------------------------------------------------------------ set-up and release
    async def adadamp_setup(self, **message) -> dict:
        """Build the fit's module; map the client's shared weights and this worker's gradient if possible.

        ``message``: a :class:`~adadamp.records.SetupRequest`; the reply is a
        :class:`~adadamp.records.SetupReply`.  With ``channel`` (and a ``tcp://`` worker) also open
        the fit's gradient channel; the reply carries its port and token.  ``dataset``: a lazy torch
        Dataset and how to load it (pickled), read here example by example.  ``replica`` (an
        all-reduce fit, whose payload also holds the optimizer): the worker keeps a
        :class:`~adadamp.worker.replica.Replica`; only the training data is mapped then.
        """
        setup = SetupRequest(**message)
        fit_id, shared, replica = setup.fit_id, setup.shared, setup.replica
        self.close_fit(fit_id)
        where = f"worker {None if self.worker is None else self.worker.address}"

        def build():
            module, criterion, device, *optimizer = self._unpickle(setup.payload, "the module, criterion or optimizer")
            device = torch.device(device)
            module = module.to(device)
            module.train()
            flat, grads = flatten_parameters(module)
            state = FitState(module, criterion, device, flat, grads, int(setup.n_total), buffers=float_buffers(module),
                             fuse=bool(setup.fuse) and examples_independent(module), kit=setup.kit or TrainingKit())
            if state.kit.compile is not None:  # compiled at the first forward pass, once per worker per fit
                state.compiled = torch.compile(module, **state.kit.compile)
            if setup.dataset is not None:
                state.loader = ExampleLoader(**self._unpickle(setup.dataset, "the Dataset"), where=where)
            mapped = None if shared is None or replica is not None else attach(shared, flat.numel())
            if replica is not None:
                data = attach_data(shared) if shared is not None and device.type == "cpu" else None
                if data is not None:
                    state.data.share(*data)
                state.replica = Replica(state, with_attributes(*optimizer), fit_id=fit_id, worker=self.worker,
                                        **to_message(replica))
            if mapped is not None:
                weights, gradient = (torch.from_numpy(a) for a in mapped)
                if device.type == "cpu":
                    state.flat, state.grads = bind_parameters(module, weights, gradient, copy_values=False)
                else:
                    state.shared_weights, state.shared_gradient = weights, gradient
                state.shared = True
                data = attach_data(shared) if device.type == "cpu" else None
                if data is not None:  # this worker reads the client's training data in place
                    state.data.share(*data)
            self.fits[fit_id] = state
            return state

        self._drop_idle_fits()
        state = await self._run(build)
        # a replica maps only the data: "shared" then says that the client need not send blocks
        reply = SetupReply(shared=bool(state.shared or (state.replica is not None and state.data.shared)),
                           shared_data=bool(state.data.shared), kept=None if replica is None else kept_groups.offer())
        self.stats.update(setups=1, shared_weights=int(state.shared), shared_data=int(bool(state.data.shared)))
        if setup.channel and self.host is not None:
            state.channel = ChannelServer(
                self.host,
                functools.partial(compute, state),
                n_weights=state.flat.numel(),
                n_buffers=sum(b.numel() for b in state.buffers),
                on_start=_compute_thread_start,
                max_indices=state.n_total,
                on_close=lambda: self.close_fit(fit_id, only=state),  # the client closed the channel, or died
                after_reply=lambda: state.replica is not None and state.replica.after_reply(),
            )
            reply.channel = ChannelOffer(state.channel.port, state.channel.token)
            self.stats.update(channels=1)
        return to_message(reply)

    def close_fit(self, fit_id: str, only: FitState | None = None) -> None:
        """Drop a fit's state (``only``: if it is still that state, not a newer set-up's)."""
        state = self.fits.get(fit_id)
        if state is None or (only is not None and state is not only):
            return
        self.fits.pop(fit_id, None)
        if state.channel is not None:
            state.channel.close()
        if state.replica is not None:
            state.replica.close()
        if state.loader is not None:
            state.loader.close()
        # The channel's and the replica's callbacks refer back to the state: without these cycles the
        # state, and with it the fit's mapping of the client's data, goes now, not at the next full
        # garbage collection (until then every finished fit's data stayed in /dev/shm: 183 MB per W1 fit).
        state.channel = state.replica = None
        if state.data.block_index:  # its blocks go now, and the heap they were on goes back to the system
            state.update_blocks([], list(state.data.block_index))
            _trim()

    def _fit(self, fit_id: str) -> FitState:
        state = self.fits.get(fit_id)
        if state is None:
            raise UnknownFitError(f"fit {fit_id} is not set up on this worker (never, or released or dropped as idle)")
        return state

    def _drop_idle_fits(self) -> None:
        """Drop fits whose client has sent nothing for ``IDLE_SECONDS`` (a client killed without a channel)."""
        now = time.monotonic()
        for fit_id, state in list(self.fits.items()):
            if now - state.last_used > IDLE_SECONDS:
                self.close_fit(fit_id, only=state)

    async def adadamp_release(self, **message) -> dict:
        """Drop a fit's state (``message``: a :class:`~adadamp.records.ReleaseRequest`; the reply
        is a :class:`~adadamp.records.ReleaseReply`)."""
        fit_id = ReleaseRequest(**message).fit_id
        reply = ReleaseReply(released=fit_id in self.fits)
        self.close_fit(fit_id)
        return to_message(reply)

    # ------------------------------------------------------------------ data
    @_answers_expected_failures
    async def adadamp_data(self, **message) -> dict:
        """Take and drop data blocks (``message``: a :class:`~adadamp.records.BlockMove`; the reply
        is a :class:`~adadamp.records.BlocksReply`)."""
        move = BlockMove(**message)

        def update():
            state = self._fit(move.fit_id)
            state.update_blocks(move.add, move.drop)
            if move.drop and not move.add:  # streamed blocks whose window passed: give their memory back
                _trim()
            return sorted(state.block_index)

        return to_message(BlocksReply(await self._run(update)))

    # ------------------------------------------------------------------ updates
    @_answers_expected_failures
    async def adadamp_gradient(self, **message) -> dict:
        """The gradient as a Dask RPC (workers without a channel; ``message``: a
        :class:`~adadamp.records.GradientRequest`; the reply is a :class:`~adadamp.records.GradientReply`)."""
        request = GradientRequest(**message)
        state = self._fit(request.fit_id)

        def run():
            r = compute(state, request)
            state.inline = r.compute_time < INLINE_SECONDS and state.replica is None  # collectives block
            reply = to_message(r)
            for key in ("grad", "buffers"):
                if reply[key] is not None:
                    reply[key] = to_serialize(np.array(reply[key]))  # a copy: the reply is sent after we return
            return reply

        # A short computation runs right on the event loop: handing it to the
        # compute thread and back costs two thread wake-ups (~2 ms on a busy
        # machine).  Long ones go to the thread, so heartbeats keep flowing.
        if state.inline:
            return run()
        return await self._run(run)

    @_answers_expected_failures
    async def adadamp_group(self, **message) -> dict:
        """Form an all-reduce fit's next group, or take the one kept from an earlier fit
        (``message``: a :class:`~adadamp.records.GroupRequest`; the reply is a
        :class:`~adadamp.records.GroupReply`)."""
        r = GroupRequest(**message)
        replica = self._fit(r.fit_id).replica
        reply = await self._run(replica.join, r.generation, r.rank, r.size, StepVector.decode(r.step), r.restore,
                                r.members, r.reuse, r.broadcast)
        self.stats.update(groups_formed=int(not reply.reused), groups_reused=int(reply.reused),
                          state_broadcasts=int(reply.broadcast))
        return to_message(reply)

    @_answers_expected_failures
    async def adadamp_commit(self, **message) -> dict:
        """Take an all-reduce fit's pending step (and the client's param groups); the replica's
        state if asked (``message``: a :class:`~adadamp.records.CommitRequest`; ``keep``: seconds to
        keep the group if the fit ends here; the reply is a :class:`~adadamp.records.CommitReply`)."""
        r = CommitRequest(**message)
        replica = self._fit(r.fit_id).replica
        return to_message(await self._run(replica.commit, StepVector.decode(r.step), r.state, r.groups, r.keep))


#: This process's fits and handlers.
TRAINER = Trainer()


class TrainerPlugin(WorkerPlugin):
    """Installs adadamp's RPC handlers (:class:`Trainer`'s methods) and sets PyTorch up for this worker.

    Registered once per client and scheduler (:func:`adadamp.cluster.ensure_plugin`); Dask
    hands it to workers that join or restart later, so they are ready too.
    """

    name = "adadamp-trainer"

    async def setup(self, worker) -> None:
        TRAINER.attach(worker)
        await tell_allocator(worker)

    def teardown(self, worker) -> None:
        TRAINER.detach(worker)


def load_block(fit_id: str, block: int, start: int, X, y) -> int:
    """Place a dask partition on this worker as block ``block`` of the fit (run as a task here).

    Dask hands the task the partition (moved from another worker, or recomputed from its
    lineage) and keeps it in this worker's memory; the fit keeps a view of it, not a copy.
    Returns the examples placed.
    """
    state = TRAINER.fits.get(fit_id)
    if state is None:
        raise KeyError(f"fit {fit_id} is not set up on this worker (set-up lost or released)")
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float32))
    y = np.ascontiguousarray(np.asarray(y))
    state.update_blocks([Block(block, np.arange(start, start + len(X)), X, y)], [], borrowed=True)
    return len(X)


def stream_block(fit_id: str, block: int, start: int, graph: bytes) -> int:
    """Compute block ``block`` of a streamed dask collection here, from its pickled tasks (its
    lineage: read from storage or generated) and its two keys, and place it for the fit;
    returns its examples."""
    tasks, keys = cloudpickle.loads(graph)
    X, y = dask.get(tasks, keys)  # in this thread: the block is read where it is trained on
    return load_block(fit_id, block, start, X, y)


def compute(state: FitState, request: GradientRequest) -> GradientReply:
    """One request: an all-reduce replica's update (the share's ``plan``: its
    :class:`~adadamp.wire.batches.BatchPlan` as a vector, the layout left out when it did not
    change), else the share's gradient sum (:func:`share_gradient`: ``in_reply`` sends it back in
    the reply even where it would go to shared memory; ``buffers``, the running statistics the
    share starts from; ``parts``, the shards of a request that has several)."""
    r = request.share
    ahead = np.zeros(0, dtype=np.int64) if r.ahead is None else np.asarray(r.ahead)
    if state.replica is not None:
        return state.replica.update(np.asarray(r.plan), request.n_chunks, r.epoch, np.asarray(r.step))
    buffers = None if request.buffers is None else np.asarray(request.buffers)
    parts = None if r.parts is None else np.asarray(r.parts)
    return share_gradient(state, request.weights, np.asarray(r.indices), request.n_chunks, r.seed, r.epoch, ahead,
                          r.in_reply, buffers, parts, loss_scale=float(request.loss_scale))
