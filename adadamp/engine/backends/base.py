"""What every backend is: the interface the fit loop and the estimator use, and the part of a fit
both ways of training share.

A backend is built for one ``fit`` call from the training state, the data and the cluster policy,
acquires its workers on ``__enter__`` and releases everything on ``__exit__``, whatever happened.
Both backends (:mod:`.parameter_server`, :mod:`.allreduce`) share here: the workers taking part
(:mod:`~adadamp.engine.membership`), the data placed on them in fixed shards
(:mod:`~adadamp.data.placement`), each update's batch (the damper names its size, the sampler
draws its examples), the steps of an update and its record, and the epoch loop
(:func:`adadamp.dampers.epoch.run_epoch`).  Each backend supplies how an update's gradient is
computed and where the step is taken (the hooks :class:`Backend` lists).  The update loop and the
hooks it calls are one contract, so they are one module; how many workers and shards the coming
batches want, and where the data blocks go, is decided between updates (:mod:`.sizing`, a base of
:class:`Backend`).
"""

from __future__ import annotations

import abc
import collections
import contextlib
import dataclasses
import hashlib
import logging
import math
import sys
import time
import uuid
from collections.abc import Callable
from typing import Self

import dask
import numpy as np
import torch
from distributed import Client

from ...cluster import embedded
from ...cluster import policy as cl
from ...cluster.adaptive import adapt, ensure_allocator
from ...dampers import BaseDamper, GradStats, TrainState
from ...dampers.clock import LoopState, Sampler
from ...dampers.epoch import run_epoch
from ...data import DataSource
from ...exceptions import ConvergenceError
from ...records import SetupReply, SetupRequest, TrainingKit, UpdateRecord, epoch_row
from ...wire import shm
from ...wire.channel import channel_host
from ...wire.parameters import trainable
from ...wire.precision import MIN_SCALE, LossScale
from ...wire.shm import SharedBuffers
from ...worker.plugin import TrainerPlugin
from ..aggregation import Totals
from ..membership import Membership
from ..speeds import Speeds
from ..transport import Transport, channels_enabled
from .sizing import Sizing

logger = logging.getLogger(__name__)

#: Batches a lazy Dataset's workers are asked to load ahead: with one, a worker whose loads
#: finished before the next request idled until it came (measured: 1.25x against 1.1x with two).
PREFETCH_BATCHES = 2

#: Updates whose median time clocks the schedule read ahead.
RECENT_UPDATES = 32


@dataclasses.dataclass
class Batch:
    """One update's batch: what the damper saw, the examples, their data epoch, the examples
    to load ahead (lazy Datasets), and the statistics the damper needs."""

    state: TrainState
    idx: np.ndarray
    epoch: int
    ahead: np.ndarray | None
    need: str | None
    n_chunks: int
    start: int = 0  #: the batch's first position in its data epoch's permutation
    size: int = 0  #: the batch size the damper asked for (the last batch of an epoch may have fewer)


def mark_base_lr(optimizer: torch.optim.Optimizer) -> None:
    """Remember each param group's learning rate, which the damper's factor scales."""
    for group in optimizer.param_groups:
        group.setdefault("adadamp_base_lr", group["lr"])
        group.pop("adadamp_scheduled_lr", None)  # set by an LRScheduler callback of this fit, if any


class Backend(Sizing, abc.ABC):
    """Trains ``module`` on ``data`` held by the workers of ``client``, for one ``fit`` call.

    Everything that must outlive the call (module, optimizer, damper, :class:`LoopState`) belongs
    to the caller and is only borrowed here.  Use it as a context manager: entering acquires the
    workers, the shared memory and the channels, leaving releases them whatever happened.

    Parameters
    ----------
    client : distributed.Client
        The cluster trained on (the fit loop publishes its progress there too).
    module, criterion, optimizer : torch objects
        The model, its loss and its optimizer (the client's copies).
    damper : BaseDamper
        Names each update's batch size, learning-rate factor and momentum.
    loop : LoopState
        The training clock, advanced by every update.
    data : DataSource
        Where the training examples come from.
    policy : ClusterPolicy
        How many workers to use and how long to wait for them.
    device : str, default="cpu"
        Where the workers compute.
    n_blocks : int, default=256
        The data blocks the examples are cut into for placement.
    kit : TrainingKit, default=None
        Precision and gradient clipping (None: float32, no clipping).

    Notes
    -----
    A new way of training subclasses this class and is registered under a name
    (:func:`~adadamp.engine.backends.registry.register_backend`); the base acquires the workers,
    places the data, draws each batch and runs the update loop, and calls these hooks:

    - :meth:`module_payload` and :meth:`bind` (required) when the backend is entered (and
      ``bind`` again on :meth:`resume`);
    - :meth:`setup_request` and :meth:`setup_reply` for each worker set up (optional: extend
      them with ``super()``);
    - each update, in order: :meth:`announce_step` (optional), :meth:`gradient_round`,
      :meth:`finite` (then :meth:`keep_last_finite` when it is not, or :meth:`skip_step` when
      loss scaling skips it), :meth:`grad_sq_norm` when the damper asks for statistics,
      :meth:`step` unless the step was announced, and
      :meth:`stepped_weights` (optional) for the debugging digests;
    - :meth:`sync` (required) before a checkpoint mid-epoch or a stop.

    Class attribute ``lends``: whether workers no fit wants may be lent to its fits.
    """

    client: Client

    def __init__(
        self,
        client: Client,
        *,
        module: torch.nn.Module,
        criterion: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        damper: BaseDamper,
        loop: LoopState,
        data: DataSource,
        policy: cl.ClusterPolicy,
        device: str = "cpu",
        n_blocks: int = 256,
        kit: TrainingKit | None = None,
    ):
        self.client = client
        self.module = module
        self.criterion = criterion
        self.optimizer = optimizer
        self.damper = damper
        self.loop = loop
        self.data = data
        self.sampler = Sampler(loop, data.order(loop.seed))
        self.placement = data.placement(n_blocks)
        self.placement.order = self.sampler.order
        self._policy = policy
        self.device = device
        self.fit_id = f"adadamp-{uuid.uuid4().hex}"
        self.n_shards: int | None = None  # what each update is cut into (set at the first placement)
        self.speeds = Speeds()  # each worker's measured throughput (speed-based shares, stragglers)
        self._recent = collections.deque(maxlen=RECENT_UPDATES)  # seconds of the latest updates (the schedule's clock)
        self._lent_times: dict[tuple[int, int], collections.deque] = {}  # update seconds by (batch, lent workers)
        self._resizing: int | None = None  # the batch the workers are being sized for (between updates)
        self._bound = False  # the module's parameters are views of the backend's buffers
        self.kit = kit or TrainingKit()
        self.grad_norm: float | None = None  # the last update's mean gradient's norm before clipping
        mark_base_lr(optimizer)
        self._scaler = LossScale(optimizer) if self.kit.scales_loss else None

    # ------------------------------------------------------------------ the hooks a backend implements
    # What a new backend (register_backend) supplies; the base calls them, in this order.
    @abc.abstractmethod
    def module_payload(self) -> bytes:
        """What a worker's set-up builds its module from (the bytes go in every worker's
        :class:`~adadamp.records.SetupRequest`).

        Called when the backend is entered, before any worker is set up.  Must return a pickle the
        workers read: the module, the criterion and the device, and whatever else this backend's
        workers need (the all-reduce's replicas take the optimizer too).
        """

    @abc.abstractmethod
    def bind(self) -> None:
        """Set up the client's flat weights and gradients (``self.flat``, ``self.grads``) and the
        module's float buffers (``self._buffers``).

        Called when the backend is entered, before any worker is set up, and by :meth:`resume`
        with a warm call's module.  Sets ``self._bound`` when the module's parameters become views
        of the flat buffers (leaving the backend gives them their own storage again).
        """

    def setup_request(self, worker: str) -> SetupRequest:
        """A worker's set-up: the module and criterion, and its shared-memory offer (made now).

        Called for each worker joining the fit, before its set-up RPC.  A backend whose workers
        need more adds its settings to ``super().setup_request(worker)``.
        """
        return SetupRequest(
            self.fit_id, self._payload, len(self.data),
            channel=channels_enabled() and channel_host(worker) is not None,
            shared=None if self._shared is None else self._shared.offer(worker),
            dataset=self._dataset_payload,
            fuse=self.policy.shares == "speed",
            kit=self.kit,
        )

    def setup_reply(self, worker: str, reply: SetupReply) -> None:
        """What a worker's set-up reply says beyond the shared memory and the channel.

        Called for each worker whose set-up succeeded; a backend reading more of the reply calls
        ``super().setup_reply(worker, reply)`` first.  A worker set up again in a fit (back at its
        address after a cut link or a restart) is a fresh process: what was measured of it before
        goes, and its first reply warms up again (:meth:`_patient`).
        """
        self.speeds.forget(worker)

    def announce_step(self, batch: Batch) -> tuple | None:
        """Plan ``batch``'s step before its round and hand it on with the requests; returns the
        plan and the learning rate, or None (the default): the step is planned after the round.

        Called at the start of each update whose damper reads nothing of the round
        (``batch.need`` is None).  When it returns a plan, :meth:`step` is not called.
        """
        return None

    @abc.abstractmethod
    def gradient_round(self, batch: Batch) -> Totals:
        """Compute the batch's gradient on the workers and average it; returns the batch's totals.

        Called once per update, after the batch is drawn.  Must recompute the shares of workers
        lost meanwhile (:func:`~adadamp.engine.backends.rounds.in_rounds`) and leave the mean
        gradient where :meth:`finite`, :meth:`grad_sq_norm` and :meth:`step` read it.
        """

    @abc.abstractmethod
    def finite(self, loss: float, total: Totals) -> bool:
        """Whether the update's loss and mean gradient are finite.

        Called after each :meth:`gradient_round`; False: :meth:`keep_last_finite` is called and the
        fit raises :class:`~adadamp.exceptions.ConvergenceError`.
        """

    @abc.abstractmethod
    def keep_last_finite(self) -> None:
        """Go back to the weights before the update whose loss or gradient was not finite.

        Called when :meth:`finite` said False, before the fit raises.
        """

    @abc.abstractmethod
    def grad_sq_norm(self, total: Totals) -> float:
        """The squared norm of the mean gradient per example (the damper's statistics).

        Called after the round of each update whose damper asked for statistics.
        """

    @abc.abstractmethod
    def step(self, plan) -> float:
        """Take (or hand on to the workers) the step ``plan`` describes (the damper's learning-rate
        factor and momentum); returns the learning rate.

        Called after each update's round, unless :meth:`announce_step` planned the step.
        """

    def skip_step(self) -> None:
        """Skip the update's step: its gradient was not finite at its loss scale
        (``precision="16-mixed"``).

        Called instead of :meth:`step` (unless the step was announced).  The default does nothing:
        the weights stay where they are.
        """

    def stepped_weights(self) -> np.ndarray | None:
        """The weights after the update's step, where the client holds them (None, the default:
        it does not).

        Called after each step when ``adadamp.debug.digests`` is set (the record's ``weights_digest``).
        """
        return None

    @abc.abstractmethod
    def sync(self) -> None:
        """Bring the client's module and optimizer up to date.

        Called before a checkpoint is written mid-epoch, and when a fit is interrupted.
        """

    # ------------------------------------------------------------------ the workers
    @property
    def workers(self) -> list[str]:
        """The workers taking part now, in rank order."""
        return self.members.workers

    @property
    def policy(self) -> cl.ClusterPolicy:
        """The cluster policy in force (the estimator's, without scaling when the damper follows the workers)."""
        return self.members.policy

    def _patient(self) -> set[str]:
        """The workers that have not answered an update of this fit yet: only ``update_timeout``
        gives up on them (:meth:`Transport.round`)."""
        return {w for w in self.workers if w not in self.speeds.answered}

    # ------------------------------------------------------------------ set-up
    def __enter__(self) -> Self:
        """Acquire everything the fit needs; on any failure release what was acquired, then raise."""
        self._stack = contextlib.ExitStack()
        try:
            self._acquire(self._stack)
        except BaseException:
            self._stack.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc) -> None:
        """Release everything acquired (the release callbacks see whether the fit failed)."""
        self._stack.__exit__(*exc)

    def _acquire(self, stack: contextlib.ExitStack) -> None:
        """Each resource is registered for release as soon as it is held (last in, first out)."""
        self._payload = self.module_payload()
        self._dataset_payload = self.data.setup_payload(self.loop.seed)
        n_weights = sum(p.numel() for p in trainable(self.module))
        root = dask.config.get("adadamp.shm-dir", shm.DEFAULT_DIR)
        keep = float(dask.config.get(shm.KEEP_DATA, shm.KEEP_DATA_SECONDS))
        self._shared = SharedBuffers.create(n_weights, root, keep_data=keep)
        if self._shared is not None:  # a clean fit keeps its data files for the next
            stack.push(lambda failed, *_, shared=self._shared: shared.close(clean=failed is None))
            arrays = self.data.shared_arrays()
            if arrays is not None and torch.device(self.device).type == "cpu":
                self._shared.share_data(X=arrays[0], y=arrays[1])
        self.bind()
        stack.callback(self._own_storage)
        transport = Transport(
            self.client,
            self.fit_id,
            self._shared,
            self._policy.update_timeout,
            n_weights=n_weights,
            n_buffers=sum(b.numel() for b in self._buffers),
        )
        self.members = Membership(
            self.client, self._policy, transport, setup=self.setup_request, place=self._place,
            n_updates=lambda: self.loop.n_updates, prefer=lambda batch_size: self.damper.workers_for(batch_size),
            on_setup=self.setup_reply,
        )
        self.members.limit = self._first_workers()  # on any cluster: as many workers as the first batch wants
        self.transport = transport
        ensure_allocator(self.client)  # first: a worker with a lifetime tells it when it retires at its set-up
        cl.ensure_plugin(self.client, TrainerPlugin, TrainerPlugin.name, register=cl.register_worker_plugin)
        if self._policy.scale:  # the cluster follows the sum of the wants of the fits sharing it
            if self._policy.shared:  # the embedded cluster: bounded by the machine, its workers kept while it runs
                adapt(self.client.cluster, maximum=embedded.max_workers(), idle=math.inf)
            else:  # bounded by the fits' max_workers, idle workers kept for adadamp.cluster.idle-timeout
                adapt(getattr(self.client, "cluster", None))
        stack.callback(self.members.release)
        # Declared as scaling whether or not this process can adapt the cluster: a fit in joblib's
        # processes or on a Dask worker holds no cluster object, and the adaptive of the process that
        # made the cluster sizes it for the wants of every fit the scheduler's allocator holds.
        self.members.allocate(self.members.limit, scaled=self._policy.scale)
        watcher = self.members.watch()
        stack.callback(watcher.cancel)
        self.members.refresh(force=True)
        self._suspended = contextlib.ExitStack()  # what suspend() undoes: the client's torch threads
        stack.callback(lambda: self._suspended.close())
        self._single_threaded(self._suspended)
        self._size_cluster()

    def _single_threaded(self, stack: contextlib.ExitStack) -> None:
        if self._shared is not None and self._shared.gradients:
            # Workers share this machine: the client's intra-op threads would only compete with
            # them (OpenMP threads spin after every parallel region), so step single-threaded.
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(1)

    # ------------------------------------------------------------------ warm sessions
    def suspend(self) -> None:
        """End one call but keep the workers, their data and the channels for the next call on
        the same data (``partial_fit``, :class:`~adadamp.engine.session.KeptBackend`): only the
        module gets its own storage back."""
        self._own_storage()
        self._suspended.close()  # the client's torch threads, as they were
        self.members.grant.release()  # other fits may take the workers meanwhile

    def resume(self, *, module, optimizer, damper, loop: LoopState) -> None:
        """Train ``module`` (a copy of the last call's model, the same architecture) next, with
        ``optimizer``, ``damper`` and ``loop``, on the workers and data already in place."""
        self.module, self.optimizer, self.damper, self.loop = module, optimizer, damper, loop
        self.sampler = Sampler(loop, self.sampler.order)
        mark_base_lr(optimizer)
        self._scaler = LossScale(optimizer) if self.kit.scales_loss else None
        self.bind()
        self._suspended = contextlib.ExitStack()
        self._single_threaded(self._suspended)
        self.members.grant.declare(self._first_workers(), self._first_workers())
        self._size_cluster()

    def _own_storage(self) -> None:
        """Give the parameters their own storage again, so the module pickles compactly and
        outlives the flat (possibly shared-memory) buffer."""
        if not self._bound:
            return
        for p in self.module.parameters():
            p.data = p.data.clone()
            p.grad = None
        self._bound = False

    # ------------------------------------------------------------------ one update
    @property
    def loss_scale(self) -> float:
        """What the workers multiply the loss by this update (1.0 but with ``precision="16-mixed"``)."""
        return 1.0 if self._scaler is None else self._scaler.value

    def _skips(self, finite: bool) -> bool:
        """Whether the update's step is skipped: with loss scaling, when its gradient was not
        finite (the scale is halved; as GradScaler does, one decision from the whole batch's
        gradient).  A scale that fell below :data:`~adadamp.wire.precision.MIN_SCALE` stops the fit."""
        if self._scaler is None:
            return False
        self._scaler.update(found_inf=not finite)
        if self._scaler.value < MIN_SCALE:
            raise ConvergenceError(
                f"The gradient was not finite at any loss scale down to {MIN_SCALE:g} (precision='16-mixed', "
                f"update {self.loop.n_updates}): every step is skipped. Lower the learning rate "
                "(optimizer__lr), or use precision='bf16-mixed' or '32-true'."
            )
        return not finite

    def _next_batch(self) -> Batch:
        """Look at the workers, ask the damper for the batch size (and size the cluster for it),
        and draw the batch's examples."""
        self.members.refresh()
        self._follow_speeds()
        running = self.members.running()
        own = len(self.workers) - len(self._lent_workers())
        state = self.loop.train_state(own, self._worker_budget(running), min(running, self.policy.max_workers))
        batch_size = int(self.damper.next_batch_size(state))
        if batch_size < 1:
            raise ValueError(f"{type(self.damper).__name__} asked for batch size {batch_size}; it must be >= 1.")
        self._resize(batch_size)
        epoch, start = self.loop.data_epoch, self.loop.position
        idx = self.sampler.take(batch_size)
        ahead = None
        if self.data.reads_ahead:  # the next batches, if they are as large: loaded meanwhile
            ahead = self.sampler.peek(batch_size, PREFETCH_BATCHES)[: self.loop.n_data]
        need = self.damper.stats_level()  # "norm" is computed from the summed gradient
        # chunk statistics: each shard is a sample when the batch is cut into several, else a share's halves
        n_chunks = 0 if need != "chunks" else 1 if (self.n_shards or 1) > 1 and len(idx) > 1 else 2
        return Batch(state, idx, epoch, ahead, need, n_chunks, start, batch_size)

    def update(self) -> dict:
        """One model update; returns its row of the history (the damper is shown its record and
        adds its reasons, :meth:`~adadamp.dampers.BaseDamper.explain`)."""
        t_start = time.perf_counter()
        self.members.lost_in_rounds.clear()
        self.grad_norm = None
        scale = self.loss_scale  # this update's (the step's decision moves it)
        batch = self._next_batch()
        announced = self.announce_step(batch) if batch.need is None else None  # the plan reads nothing of the round
        t_sent = time.perf_counter()
        total = self.gradient_round(batch)
        t_back = time.perf_counter()
        self.speeds.observe_update(self.workers, total.per_worker)
        n = total.n
        loss = total.loss_sum / total.weight  # weight = n unless the criterion's mean is class-weighted
        finite = self.finite(loss, total)
        skipped = self._skips(finite)
        if not finite and not skipped:
            self.keep_last_finite()
            raise self._diverged(loss, len(batch.idx))
        if skipped:  # the weights stay; the examples were seen
            if announced is None:
                self.skip_step()
            plan, lr, t_agg = None, float(self.optimizer.param_groups[0]["lr"]), time.perf_counter()
        elif announced is None:
            plan = self.damper.plan_update(batch.state, int(n), self._stats(batch, total))
            t_agg = time.perf_counter()
            lr = self.step(plan)
        else:
            (plan, lr), t_agg = announced, time.perf_counter()
        t_step = time.perf_counter()
        self.loop.advance(n, None if plan is None else plan.progress, loss)
        self._recent.append(t_step - t_start)
        record = self._record(n, lr, loss, total, t_start, t_sent, t_back, t_agg, t_step)
        if self.kit.clip_grad_norm is not None:
            record.grad_norm = self.grad_norm
        if self._scaler is not None:
            record.skipped, record.loss_scale = int(skipped), scale
        self._time_lent(batch.size, int(n), record.lent or 0, t_step - t_start)
        self.damper.observe(record)
        return {**record.row(), **self.damper.explain()}

    def _stage(self, idx: np.ndarray, epoch: int) -> None:
        """Before each round of a batch drawn in data epoch ``epoch``: streamed data's blocks for
        it computed where its shards are (:meth:`DataSource.stage`; nothing for placed data)."""
        if self.placement.order is None:
            return
        self.placement.at_epoch(epoch)
        self.data.stage(self.transport, self.placement, self.workers, epoch, idx, max(60.0, self.policy.update_timeout))

    def _stats(self, batch: Batch, total: Totals) -> GradStats | None:
        """The round's statistics the damper asked for (None: it asked for none)."""
        return None if batch.need is None else GradStats(
            n_samples=int(total.n), grad_sq_norm=self.grad_sq_norm(total),
            chunk_sq_norm_sum=float(total.chunk_sq_norm_sum), n_chunks=int(total.n_chunks))

    def _diverged(self, loss: float, batch_size: int) -> ConvergenceError:
        return ConvergenceError(
            f"Non-finite training loss ({loss}) at model update {self.loop.n_updates} with batch "
            f"size {batch_size}. The estimator keeps the last finite weights; lower the learning "
            "rate (optimizer__lr) or the batch-size growth."
        )

    def _record(self, n, lr, loss, total: Totals, t_start, t_sent, t_back, t_agg, t_step) -> UpdateRecord:
        """The update's record from its clock readings."""
        round_trip = t_back - t_sent
        digests = {}
        if dask.config.get("adadamp.debug.digests", False):  # what the update used, and where it stepped to
            digests["examples_digest"] = total.digest
            weights = self.stepped_weights()
            if weights is not None:
                digests["weights_digest"] = int.from_bytes(
                    hashlib.blake2b(weights.tobytes(), digest_size=8).digest(), "little"
                )
        return UpdateRecord(
            batch_size=int(n),
            lr=lr,
            n_workers=len(set(self.placement.holder.tolist())),  # the workers holding shards
            loss=loss,
            compute_time=total.compute,
            comm_time=max(0.0, round_trip - total.compute),
            send_time=total.send,
            aggregate_time=t_agg - t_back,
            step_time=t_step - t_agg,
            update_time=t_step - t_start,
            sent_bytes=self.transport.round_bytes[0],
            received_bytes=self.transport.round_bytes[1],
            shares=[int(total.per_worker.get(w, (0,))[0]) for w in self.workers],
            peak_memory=[total.memory.get(w, 0) for w in self.workers],
            stragglers=self.speeds.stragglers(self.workers),
            lost=len(set(self.members.lost_in_rounds)),
            lent=len(self._lent_workers()),
            **digests,
        )

    # ------------------------------------------------------------------ epochs
    def run_epoch(self, updates: list[dict] | None = None, on_update: Callable[[list[dict]], None] | None = None) -> dict:
        """Model updates until the epoch clock passes the next whole epoch; returns the epoch's row.

        ``updates`` holds the records of this epoch's earlier updates when resuming mid-epoch;
        ``on_update(updates)`` runs after every update.
        """
        start = time.perf_counter()
        lp = self.loop
        target = lp.epoch_end()
        updates = list(updates or [])
        earlier = sum(u["update_time"] for u in updates)
        self._run_updates(updates, on_update, target)
        return epoch_row(
            round(target / lp.n_data), updates, lp.n_updates, lp.n_samples_seen, earlier + time.perf_counter() - start
        )

    def _run_updates(self, updates: list[dict], on_update, end: float) -> None:
        """The epoch's updates, appended to ``updates``."""
        run_epoch(self.loop, self.update, updates, on_update, end)
