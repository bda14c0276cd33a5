"""The parameter-server backend: the client holds the weights and steps; workers compute gradients.

Each update (DESIGN.md §2-§3):

1. the damper names the batch size; :mod:`~adadamp.dampers.clock` draws that many example
   indices from one seeded permutation per data epoch (the trajectory does not depend on how
   many workers there are, elastic-anchors §4.6);
2. :mod:`~adadamp.engine.placement` cuts the indices by shards (fixed groups of data blocks) and
   routes each shard to the worker holding it, and :mod:`~adadamp.engine.transport` sends each
   worker the weights and its shard's indices in one message;
3. each worker returns the gradient SUM over the shard's examples (plus the example count, the
   loss sum and the statistics the damper asked for);
4. :mod:`~adadamp.engine.aggregation` sums in shard order; the client divides once, asks the
   damper for the learning-rate factor and momentum, and steps.

A worker that dies or times out loses only its shards of one update: their data blocks are placed
again from the data source (the client's arrays, or a dask array's lineage) and the shards are
recomputed on the survivors (dask-engine.md §4.2).  The number of shards is not the number of
workers: it changes only between updates, with the batch size when the fit scales the cluster, and
otherwise only when more workers take part than there are shards, so a worker lost and replaced
changes no update by a single bit (issue 27).
This module talks to Dask; it knows nothing about scikit-learn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import math
import time
import uuid
from collections import Counter
from typing import Self

import cloudpickle
import dask
import numpy as np
import torch
from dask.utils import format_bytes
from distributed import Client

from .. import cluster as cl
from ..dampers import BaseDamper, GradStats, TrainState
from ..dampers.clock import LoopState, Sampler
from ..exceptions import ConvergenceError, NoWorkersError
from ..records import ShareRequest, UpdateRecord, epoch_row
from ..wire import shm
from ..wire.channel import tcp_host
from ..wire.optimizer_plan import apply_plan
from ..wire.parameters import bind_parameters, flatten_parameters, float_buffers, trainable
from ..wire.shm import SharedBuffers
from ..worker.plugin import TrainerPlugin
from .aggregation import GradientSum, Totals
from .data import ArrayData, DaskArrayData, DatasetData
from .membership import Membership
from .placement import plan_moves
from .transport import LOST, Transport, channels_enabled

logger = logging.getLogger(__name__)

#: Batches a lazy Dataset's workers are asked to load ahead: with one, a worker whose loads
#: finished before the next request idled until it came (measured: 1.25x against 1.1x with two).
PREFETCH_BATCHES = 2

#: Rounds in a row in which some share of one update is lost before the update is given up: each
#: round drops the lost workers, so this many means the workers keep dying as fast as they come.
MAX_RECOMPUTES = 10


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


def _mark_base_lr(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        group.setdefault("adadamp_base_lr", group["lr"])
        group.pop("adadamp_scheduled_lr", None)  # set by an LRScheduler callback of this fit, if any


def dropout_seed(seed: int, n_updates: int, part: int) -> int:
    """The random seed of shard ``part`` of update ``n_updates`` (dropout masks), on both backends."""
    return (seed * 1_000_003 + n_updates * 7919 + part) % 2**63


class ParameterServer:
    """Trains ``module`` on ``X, y`` held by the workers of ``client``.

    One instance lives for one ``fit``/``partial_fit`` call; everything that must outlive the
    call (module, optimizer, damper, :class:`LoopState`) belongs to the caller and is only
    borrowed here.  Use it as a context manager: entering acquires the workers, the shared
    memory and the channels, leaving releases them whatever happened.
    """

    def __init__(
        self,
        client: Client,
        *,
        module: torch.nn.Module,
        criterion: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        damper: BaseDamper,
        loop: LoopState,
        data: ArrayData | DaskArrayData | DatasetData,
        policy: cl.ClusterPolicy,
        device: str = "cpu",
        n_blocks: int = 256,
    ):
        self.client = client
        self.module = module
        self.criterion = criterion
        self.optimizer = optimizer
        self.damper = damper
        self.loop = loop
        self.data = data
        self.sampler = Sampler(loop)
        self.placement = data.placement(n_blocks)
        self._policy = policy
        self.device = device
        self.fit_id = f"adadamp-{uuid.uuid4().hex}"
        self.n_shards: int | None = None  # what each update is cut into (set at the first placement)
        self._bound = False  # the module's parameters are views of the flat buffers
        _mark_base_lr(optimizer)

    @property
    def workers(self) -> list[str]:
        return self.members.workers

    @property
    def policy(self) -> cl.ClusterPolicy:
        return self.members.policy

    # ------------------------------------------------------------------ set-up
    def __enter__(self) -> Self:
        """Acquire everything the fit needs; on any failure release what was acquired, then raise."""
        self._stack = contextlib.ExitStack()
        try:
            self._acquire(self._stack)
        except BaseException:
            self._stack.close()
            raise
        return self

    def _acquire(self, stack: contextlib.ExitStack) -> None:
        """Each resource is registered for release as soon as it is held (last in, first out)."""
        self._payload = self._module_payload()
        if isinstance(self.data, DatasetData):
            self._dataset_payload = self.data.payload(self.loop.seed)
        n_weights = sum(p.numel() for p in trainable(self.module))
        self._shared = SharedBuffers.create(n_weights, dask.config.get("adadamp.shm-dir", shm.DEFAULT_DIR))
        if self._shared is not None:
            stack.callback(self._shared.close)
            if isinstance(self.data, ArrayData) and torch.device(self.device).type == "cpu":
                self._shared.share_data(X=self.data.X, y=self.data.y)
        self._bind()
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
            self.client, self._policy, transport, setup=self._setup_kwargs, place=self._place,
            n_updates=lambda: self.loop.n_updates,
        )
        if self._policy.shared:  # as many workers as on a cluster of its own (the embedded one's start)
            self.members.limit = self._policy.first_workers(self.damper.forecast_batch_size(self.loop.epoch))
        self.transport = transport
        cl.register_worker_plugin(self.client, TrainerPlugin(), TrainerPlugin.name)
        stack.callback(self.members.release)
        watcher = self.members.watch()
        stack.callback(watcher.cancel)
        self.members.refresh(force=True)
        self._suspended = contextlib.ExitStack()  # what suspend() undoes: the client's torch threads
        stack.callback(lambda: self._suspended.close())
        self._single_threaded(self._suspended)
        self._size_cluster()

    def _module_payload(self) -> bytes:
        """What a worker's set-up builds its module from."""
        return cloudpickle.dumps((self.module, self.criterion, self.device))

    def _bind(self) -> None:
        """Make the module's parameters views of the fit's flat buffers (in shared memory when the
        workers on this host read the weights in place)."""
        self.flat, self.grads = flatten_parameters(self.module)
        if self._shared is not None:
            self.flat, _ = bind_parameters(self.module, torch.from_numpy(self._shared.weights), self.grads)
        self._buffers = float_buffers(self.module)
        self.flat_np = self.flat.numpy()
        self.grads_np = self.grads.numpy()
        # The weights before the last two steps: ``_backups[_current]`` is filled during
        # this update's round, the other one holds the last weights with a finite loss.
        self._backups, self._current = [self.flat.clone(), self.flat.clone()], 0
        self._bound = True

    def _single_threaded(self, stack: contextlib.ExitStack) -> None:
        if self._shared is not None and self._shared.gradients:
            # Workers share this machine: the client's intra-op threads would only compete with
            # them (OpenMP threads spin after every parallel region), so step single-threaded.
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(1)

    def _size_cluster(self) -> None:
        """The cluster policy of this damper, and the cluster sized for its first batch."""
        self.members.policy = self._policy
        if self._policy.scale and self.damper.follows_workers:
            self.members.policy = dataclasses.replace(self._policy, scale=False)  # B follows W: never size W from B
        batch = self.damper.forecast_batch_size(self.loop.epoch)  # None: the first update sizes the cluster
        if self.policy.scale and batch:
            self.members.scale_to(self.policy.wanted(int(batch)))

    def __exit__(self, *exc) -> None:
        self._stack.close()

    # ------------------------------------------------------------------ warm sessions
    def suspend(self) -> None:
        """End one call but keep the workers, their data and the channels for the next call on
        the same data (``partial_fit``): only the module gets its own storage back."""
        self._own_storage()
        self._suspended.close()  # the client's torch threads, as they were

    def resume(self, *, module, optimizer, damper, loop: LoopState) -> None:
        """Train ``module`` (a copy of the last call's model, the same architecture) next, with
        ``optimizer``, ``damper`` and ``loop``, on the workers and data already in place."""
        self.module, self.optimizer, self.damper, self.loop = module, optimizer, damper, loop
        self.sampler = Sampler(loop)
        _mark_base_lr(optimizer)
        self._bind()
        self._suspended = contextlib.ExitStack()
        self._single_threaded(self._suspended)
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

    def _setup_kwargs(self, worker: str) -> dict:
        """A worker's set-up RPC: the module and criterion, and its shared-memory offer (made now)."""
        kwargs = {"fit_id": self.fit_id, "payload": self._payload, "n_total": len(self.data)}
        kwargs["channel"] = channels_enabled() and tcp_host(worker) is not None
        if self._shared is not None:
            kwargs["shared"] = self._shared.offer(worker)
        if isinstance(self.data, DatasetData):
            kwargs["dataset"] = self._dataset_payload
        return kwargs

    def _place(self, new_workers: list[str]) -> dict[str, BaseException]:
        """Give every worker a fair share of the data blocks, moving as few as possible.

        Returns the workers that were lost while taking their blocks (other errors raise).
        """
        preferred = self.data.preferred(self.placement)  # where Dask holds a block already (dask data)
        n_shards = self._placement_shards(new_workers)
        shard_of, holder, add, drop = plan_moves(self.placement.names(self.workers), new_workers, n_shards, preferred)
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
        others); only the first placement and :meth:`_reshard`, between updates, set them."""
        if not self.n_shards:
            self.n_shards = self._target_shards(workers=new_workers)
        return self.n_shards

    def _target_shards(self, batch_size: int | None = None, workers: list[str] | None = None) -> int:
        """The shards an update of ``batch_size`` examples is cut into.

        Scaling the cluster: the workers the policy wants for the batch (the schedule decides, not
        the workers that came).  Otherwise the most workers this fit has had, or that the client's
        cluster plans (workers restarting included): never fewer when workers are lost, so a lost
        worker changes no update; more only when more workers take part than there are shards.
        """
        workers = self.workers if workers is None else workers
        if self.policy.scale:
            batch = batch_size or self.damper.forecast_batch_size(self.loop.epoch)
            if batch:
                return self.policy.wanted(int(batch))
        return max(self.n_shards or 0, len(workers), self.members.planned(), 1)

    def _reshard(self, batch_size: int) -> None:
        """Cut the coming updates into the shards :meth:`_target_shards` names (between updates only)."""
        n_shards = self._target_shards(batch_size)
        if n_shards != self.n_shards and self.workers:
            logger.info("update %d: %d shards (were %s)", self.loop.n_updates, n_shards, self.n_shards)
            self.n_shards = n_shards
            self.members.replace()

    def _check_memory(self, owner: list[str], workers: list[str]) -> None:
        """Refuse a fit's first placement when it gives a worker more examples than its
        ``memory_limit`` holds, before any block moves (a worker over its limit dies, restarts and
        dies again).  Later placements (a cluster that shrank), and a first one on a cluster that
        may still grow for the fit, only warn: the fit keeps its weights and may go on."""
        if isinstance(self.data, DatasetData):  # read example by example: nothing is placed
            return
        X, y = self.data.X, self.data.y
        per_example = sum(math.prod(a.shape[1:]) * np.dtype(a.dtype).itemsize for a in (X, y))
        examples = dict.fromkeys(workers, 0)
        for b, w in enumerate(owner):
            examples[w] += len(self.placement.rows(b))
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        for w in workers:
            limit = info.get(w, {}).get("memory_limit") or 0  # 0: no limit
            needed = examples[w] * per_example
            if limit and needed > limit:
                error = ValueError(
                    f"The training data needs {format_bytes(needed)} per worker on {len(workers)} worker(s) "
                    f"({examples[w]} examples of {per_example} bytes on {w}), more than its memory_limit "
                    f"of {format_bytes(limit)}. Use more workers, workers with a larger "
                    "memory_limit, or pass a torch Dataset as X (read example by example, never held whole)."
                )
                may_grow = self.policy.scale and len(workers) < self.policy.max_workers
                if getattr(self, "_placed", False) or may_grow:
                    logger.warning("%s", error)
                    return
                raise error

    # ------------------------------------------------------------------ training
    def _gradients(self, idx: np.ndarray, n_chunks: int, epoch: int, ahead: np.ndarray | None = None) -> Totals:
        """Sum the shards' gradients over ``idx`` into ``self.grads_np``, recomputing lost shards.

        ``idx`` is drawn in data epoch ``epoch``; ``ahead`` holds the next batches' examples
        (keys, :meth:`Sampler.peek`), which each worker may start loading (a lazy Dataset).

        Each shard is one request to the worker holding it (a worker holding several gets one
        request per shard, and their gradients come in the replies).  Each reply is added as soon
        as it and the shards before it are in, and the weights are backed up once the first reply
        is in: both then overlap the slower workers' compute, on a core the first worker has just
        freed.
        """
        summed = GradientSum(self.grads_np, self._shared)
        backed_up = False

        def add(request: ShareRequest, r) -> None:
            nonlocal backed_up
            summed.add(request.shard, request.worker, r)
            if not backed_up:  # these weights, in case the next update's loss is not finite
                self._backups[self._current].copy_(self.flat)
                backed_up = True

        todo = None  # the shards still to compute (None: all of them)
        buffers = self._buffer_values()  # the running statistics every shard starts from
        for _round in range(1 + MAX_RECOMPUTES):
            if not self.workers:
                self.members.refresh(force=True)
            shards = [(g, sub) for g, sub in self.placement.shards(idx) if todo is None or g in todo]
            if todo is None:
                summed.expect([g for g, _ in shards])
            # the shard of each example named ahead (only with the first round's requests)
            ahead_shard = None
            if ahead is not None and _round == 0:
                ahead_shard = self.placement.shard_of[self.placement.blocks_of(ahead % self.loop.n_data)]
            holders = [int(self.placement.holder[g]) for g, _ in shards]
            several = {k for k, count in Counter(holders).items() if count > 1}  # their gradients come in replies
            requests = [
                ShareRequest(
                    self.workers[k], dropout_seed(self.loop.seed, self.loop.n_updates, g), sub, epoch,
                    ahead=None if ahead_shard is None else ahead[ahead_shard == g],
                    shard=g, in_reply=k in several,
                )
                for k, (g, sub) in zip(holders, shards)
            ]
            replies, send_time = self.transport.round(
                requests, n_chunks, self.flat_np, on_reply=add, buffers=buffers
            )
            summed.totals.send += send_time
            todo, lost = set(), []
            for request, r in zip(requests, replies):
                w = request.worker
                if isinstance(r, LOST):
                    lost.append(w)
                    todo.add(request.shard)
                    if isinstance(r, asyncio.TimeoutError | TimeoutError):  # alive but hung (or far too slow)
                        self.members.strike(w, r, out=True)
                elif isinstance(r, BaseException):
                    raise r
            if not todo:
                return summed.totals
            lost = list(dict.fromkeys(lost))
            logger.warning("lost worker(s) %s during update %d; recomputing their shards", lost, self.loop.n_updates)
            self.members.refresh(force=True, lost=tuple(lost))
        raise NoWorkersError(
            f"update {self.loop.n_updates} lost a share in {1 + MAX_RECOMPUTES} rounds in a row: workers keep dying"
        )

    def _next_batch(self) -> Batch:
        """Look at the workers, ask the damper for the batch size (and size the cluster for it),
        and draw the batch's examples."""
        self.members.refresh()
        state = self.loop.train_state(len(self.workers))
        batch_size = int(self.damper.next_batch_size(state))
        if batch_size < 1:
            raise ValueError(f"{type(self.damper).__name__} asked for batch size {batch_size}; it must be >= 1.")
        if self.policy.scale:
            ahead = self.damper.forecast_batch_size(state.epoch + self.policy.prescale_epochs) or 0
            self.members.scale_for(batch_size, ahead)
        self._reshard(batch_size)
        epoch = self.loop.data_epoch
        idx = self.sampler.take(batch_size)
        ahead = None
        if isinstance(self.data, DatasetData):  # the next batches, if they are as large: loaded meanwhile
            ahead = self.sampler.peek(batch_size, PREFETCH_BATCHES)[: self.loop.n_data]
        need = self.damper.stats_level()
        n_chunks = 2 if need == "chunks" else 1  # "norm" is computed from the summed gradient
        return Batch(state, idx, epoch, ahead, need, n_chunks)

    def _diverged(self, loss: float, batch_size: int) -> ConvergenceError:
        return ConvergenceError(
            f"Non-finite training loss ({loss}) at model update {self.loop.n_updates} with batch "
            f"size {batch_size}. The estimator keeps the last finite weights; lower the learning "
            "rate (optimizer__lr) or the batch-size growth."
        )

    def _advance(self, n: int, plan, loss: float) -> None:
        """Move the training clock past one update of ``n`` examples."""
        lp = self.loop
        lp.n_updates += 1
        lp.n_samples_seen += int(n)
        lp.progress += float(n if plan.progress is None else plan.progress)
        lp.last_loss = loss

    def update(self) -> dict:
        """One model update; returns its record for the history."""
        t_start = time.perf_counter()
        batch = self._next_batch()
        t_sent = time.perf_counter()
        total = self._gradients(batch.idx, batch.n_chunks, batch.epoch, batch.ahead)
        t_back = time.perf_counter()

        n = total.n
        weight = total.weight  # = n unless the criterion's mean is class-weighted
        loss = total.loss_sum / weight
        if total.buffers is not None:
            self._set_buffers(total.buffers / n)
        with np.errstate(invalid="ignore", over="ignore"):
            self.grads_np *= 1.0 / weight
        if not math.isfinite(loss) or not np.isfinite(self.grads_np).all():
            self.flat.copy_(self._backups[1 - self._current])
            raise self._diverged(loss, len(batch.idx))
        stats = None
        if batch.need is not None:
            g64 = self.grads_np.astype(np.float64)
            if weight != n:  # the statistics are per example: the mean of the workers' sums
                g64 *= weight / n
            stats = GradStats(
                n_samples=int(n),
                grad_sq_norm=float(g64 @ g64),
                chunk_sq_norm_sum=float(total.chunk_sq_norm_sum),
                n_chunks=int(total.n_chunks),
            )
        plan = self.damper.plan_update(batch.state, int(n), stats)
        t_agg = time.perf_counter()

        self._current = 1 - self._current
        lr = apply_plan(self.optimizer, plan)
        self.optimizer.step()
        t_step = time.perf_counter()

        self._advance(n, plan, loss)
        return self._record(n, lr, loss, total, t_start, t_sent, t_back, t_agg, t_step)

    def _record(self, n, lr, loss, total: Totals, t_start, t_sent, t_back, t_agg, t_step) -> dict:
        """The update's row of ``history_`` from its clock readings."""
        round_trip = t_back - t_sent
        digests = {}
        if dask.config.get("adadamp.debug.digests", False):  # what the update used, and where it stepped to
            weights = hashlib.blake2b(self.flat_np.tobytes(), digest_size=8).digest()
            digests = {"examples_digest": total.digest, "weights_digest": int.from_bytes(weights, "little")}
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
            **digests,
        ).row()

    def sync(self) -> None:
        """Bring the client's module and optimizer up to date: they always are here (the client steps)."""

    def _buffer_values(self) -> np.ndarray | None:
        """The module's running statistics as one float32 vector, which every share starts from
        (None without any): a shard's statistics then do not depend on the worker computing it."""
        if not self._buffers:
            return None
        return torch.cat([b.detach().reshape(-1).float().cpu() for b in self._buffers]).numpy()

    def _set_buffers(self, values: np.ndarray) -> None:
        """The module's BatchNorm-style statistics: the workers' example-weighted mean (algorithms.md P17)."""
        offset = 0
        with torch.no_grad():
            for b in self._buffers:
                b.copy_(torch.from_numpy(values[offset : offset + b.numel()]).view_as(b))
                offset += b.numel()

    def run_epoch(self, updates: list | None = None, on_update=None) -> dict:
        """Updates until the epoch clock passes the next whole epoch.

        ``updates`` holds the records of this epoch's earlier updates when
        resuming mid-epoch; ``on_update(updates)`` runs after every update.
        """
        start = time.perf_counter()
        lp = self.loop
        target = lp.epoch_end()
        updates = list(updates or [])
        earlier = sum(u["update_time"] for u in updates)
        while lp.in_epoch(target):
            updates.append(self.update())
            if on_update is not None:
                on_update(updates)
        return epoch_row(
            round(target / lp.n_data), updates, lp.n_updates, lp.n_samples_seen, earlier + time.perf_counter() - start
        )
