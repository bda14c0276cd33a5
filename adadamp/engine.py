"""The client-side parameter server: one synchronous model update at a time.

The client owns the weights (one flat float32 buffer that the module's
parameters view) and the optimizer.  Each update (DESIGN.md §2-§3):

1. the damper names the batch size; the client draws that many example
   indices from one seeded permutation per data epoch, so the trajectory does
   not depend on how many workers there are (elastic-anchors §4.6);
2. the indices are routed to the workers holding those examples, and each
   worker gets the weights and its indices in one message: over the fit's
   socket (:mod:`adadamp.channel`) for ``tcp://`` workers, else a direct
   Dask RPC;
3. each worker returns the gradient SUM over its examples (plus the example
   count, the loss sum and, for AdaScale, chunk statistics);
4. the client sums in a fixed order, divides by the example count once, asks
   the damper for the learning-rate factor and momentum, and steps.

A worker that dies or times out loses only its share of one update: its data
blocks are placed again from the client's copy and its share is recomputed on
the survivors (dask-engine.md §4.2).  This module talks to Dask; it knows
nothing about scikit-learn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
import uuid
from typing import Self

import cloudpickle
import dask
import numpy as np
import torch
from distributed import Client
from distributed.comm.core import CommClosedError
from distributed.protocol import to_serialize

from . import cluster as cl
from . import shm
from ._worker import TrainerPlugin, bind_parameters, flatten_parameters, float_buffers
from .channel import Channel, WorkerError, tcp_host
from .dampers import BaseDamper, GradStats, TrainState
from .exceptions import ConvergenceError, NoWorkersError, SchedulerLostError
from .optimizer_plan import apply_plan
from .shm import SharedBuffers

logger = logging.getLogger(__name__)

MEMBERSHIP_INTERVAL = 0.5  # seconds between looks at the scheduler's worker list
HEAL_INTERVAL = 5.0  # seconds a shortfall of workers lasts before they are asked for again
SETUP_TRIES = 3  # failed set-ups after which a worker is left out of the fit
_LOST = (OSError, CommClosedError, asyncio.TimeoutError, TimeoutError, EOFError)


@dataclasses.dataclass
class LoopState:
    """The training clock and the sampler position (picklable, checkpointed).

    ``progress`` is the one epoch clock in examples: data examples, unless the
    damper reports another progress per update (AdaScale).
    """

    seed: int
    n_data: int
    n_updates: int = 0
    n_samples_seen: int = 0
    progress: float = 0.0
    data_epoch: int = 0
    position: int = 0
    last_loss: float | None = None

    @property
    def epoch(self) -> float:
        return self.progress / self.n_data

    def permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.data_epoch]).permutation(self.n_data)


class Engine:
    """Trains ``module`` on ``X, y`` held by the workers of ``client``.

    One engine lives for one ``fit``/``partial_fit`` call; everything that must
    outlive the call (module, optimizer, damper, :class:`LoopState`) belongs
    to the caller and is only borrowed here.
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
        X: np.ndarray,
        y: np.ndarray,
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
        self.X = X
        self.y = y
        self.policy = policy
        self.device = device
        self.fit_id = f"adadamp-{uuid.uuid4().hex}"
        n = len(X)
        self.block_size = math.ceil(n / min(n, n_blocks))
        self.n_blocks = math.ceil(n / self.block_size)
        self.block_owner = np.zeros(self.n_blocks, dtype=np.int64)
        self.workers: list[str] = []  # rank order = order of joining
        self.channels: dict[str, Channel] = {}
        self._payload = None
        self._last_refresh = -math.inf
        self._known: set[str] | None = None  # live workers at the last full refresh
        self._latest: dict | BaseException | None = None  # the membership watcher's latest report
        self._set_up: set[str] = set()  # workers that may hold this fit's state (released at the end)
        self._pending: tuple[list[str], object] | None = None  # joiners being set up in the background
        self._strikes: dict[str, int] = {}  # failed set-ups per worker; SETUP_TRIES: left out (quarantined)
        self._errors: dict[str, BaseException] = {}  # each worker's last failure, for the error message
        self._requested: int | None = None
        self._waited_for = 0
        self._live_names: set[str] = set()
        self._gone_names: set[str] = set()
        self._short_since = math.inf  # when fewer workers than requested were first seen
        self._last_heal = -math.inf
        for group in optimizer.param_groups:
            group.setdefault("adadamp_base_lr", group["lr"])
            group.pop("adadamp_scheduled_lr", None)  # set by an LRScheduler callback of this fit, if any

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
        self._payload = cloudpickle.dumps((self.module, self.criterion, self.device))
        self.flat, self.grads = flatten_parameters(self.module)
        self._buffers = float_buffers(self.module)
        self._shared = SharedBuffers.create(self.flat.numel(), dask.config.get("adadamp.shm-dir", shm.DEFAULT_DIR))
        if self._shared is not None:  # workers on this host read the weights in place
            stack.callback(self._shared.close)
            self.flat, _ = bind_parameters(self.module, torch.from_numpy(self._shared.weights), self.grads)
        stack.callback(self._own_storage)
        self.flat_np = self.flat.numpy()
        self.grads_np = self.grads.numpy()
        # The weights before the last two steps: ``_backups[_current]`` is filled during
        # this update's round, the other one holds the last weights with a finite loss.
        self._backups, self._current = [self.flat.clone(), self.flat.clone()], 0
        self.client.register_plugin(TrainerPlugin(), name=TrainerPlugin.name)
        stack.callback(self._release_workers)
        self._watcher = asyncio.run_coroutine_threadsafe(
            cl.watch_workers(self.client, MEMBERSHIP_INTERVAL, self._report), self.client.loop.asyncio_loop
        )
        stack.callback(self._watcher.cancel)
        self._refresh_membership(force=True)
        if self._shared is not None and self._shared.gradients:
            # Workers share this machine: the client's intra-op threads would only compete with
            # them (OpenMP threads spin after every parallel region), so step single-threaded.
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(1)
        if self.policy.scale and self.damper.follows_workers:
            self.policy = dataclasses.replace(self.policy, scale=False)  # B follows W: never size W from B
        if self.policy.scale:
            batch = self.damper.forecast_batch_size(self.loop.epoch) or self.damper.next_batch_size(self._train_state())
            self._scale_to(self.policy.wanted(int(batch)))

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _release_workers(self) -> None:
        """Close the channels and drop the fit's state on every worker that has it."""
        if self._pending is not None:  # let background set-ups finish, so that what they built is released
            with contextlib.suppress(Exception):
                self._pending[1].result(timeout=self.policy.update_timeout)
            self._pending = None
        for w in list(self.channels):
            self._forget(w)
        reachable = [w for w in self._set_up if not self._quarantined(w)]  # a hung one drops it when it wakes
        with contextlib.suppress(Exception):
            self._call_all([(w, "adadamp_release", {"fit_id": self.fit_id}) for w in reachable], timeout=5.0)
        self._set_up.clear()

    def _own_storage(self) -> None:
        """Give the parameters their own storage again, so the module pickles compactly and
        outlives the flat (possibly shared-memory) buffer."""
        for p in self.module.parameters():
            p.data = p.data.clone()
            p.grad = None

    # -------------------------------------------------------------- RPC fan-out
    def _call_all(self, calls: list[tuple[str, str, dict]], timeout: float | None = None):
        """Run ``(address, op, kwargs)`` RPCs concurrently; exceptions are returned."""
        if not calls:
            return []
        return self.client.sync(self._gather_calls, calls, timeout or self.policy.update_timeout)

    async def _gather_calls(self, calls, timeout):
        async def one(address, op, kwargs):
            try:
                rpc = self.client.rpc(address)
                reply = await asyncio.wait_for(getattr(rpc, op)(**kwargs), timeout)
            except RuntimeError as err:  # the client's connection pool closed under us
                if "closed" in str(err):
                    raise CommClosedError(str(err)) from err
                raise
            if reply is None:  # the worker closed while answering
                raise CommClosedError(f"{address} closed without answering {op}")
            return reply

        return await asyncio.gather(*(one(*c) for c in calls), return_exceptions=True)

    # --------------------------------------------------------------- membership
    def _refresh_membership(self, force: bool = False, lost: tuple[str, ...] = ()) -> None:
        """Drop lost workers, set up new ones, and rebalance the data blocks."""
        now = time.monotonic()
        set_up = self._pending is not None and self._pending[1].done()  # joiners ready: take them now
        if not force and not lost and not set_up:
            if now - self._last_refresh < MEMBERSHIP_INTERVAL:
                return
            latest = self._latest
            if isinstance(latest, dict) and set(latest) == self._known:
                self._last_refresh = now
                return  # nothing changed; lost workers show up on their channel or RPC at once
        self._last_refresh = now
        try:
            live = cl.live_workers(self.client)
        except _LOST as err:
            raise SchedulerLostError(
                f"The Dask scheduler is unreachable ({err!r}) after {self.loop.n_updates} model updates. "
                "A scheduler cannot be replaced during a fit: the estimator keeps the last good weights; "
                "start a new cluster and resume with checkpoint=... (or warm_start=True)."
            ) from err
        survivors = [w for w in self.workers if w in live and w not in lost]
        for w in set(self.workers) - set(survivors):
            self._forget(w)
        pending = self._pending[0] if self._pending else []
        joined = sorted(
            w for w in live if w not in self.workers and w not in lost and w not in pending and not self._quarantined(w)
        )
        # While training runs on other workers, joiners are set up in the background and take part
        # from the first look after their set-up is done (a slow set-up never stalls an update).
        background = not force and not lost and bool(survivors)
        ready, failed = [], []
        if self._pending and (self._pending[1].done() or not background):
            started, future = self._pending
            self._pending = None
            ready, failed = self._finish_setup(started, future.result())
        if joined:
            calls = self._setup_calls(joined)
            if background:
                future = asyncio.run_coroutine_threadsafe(
                    self._gather_calls(calls, self.policy.update_timeout), self.client.loop.asyncio_loop
                )
                self._pending = (joined, future)
                joined = []
            else:
                ok, bad = self._finish_setup(joined, self._call_all(calls, timeout=self.policy.update_timeout))
                joined, failed = ok, failed + bad
        for w in [w for w in ready if w not in live or w in lost]:  # set up, but gone meanwhile
            self._forget(w)
        joined = sorted({*joined, *(w for w in ready if w in live and w not in lost)})
        # Look again at the next interval if anyone was left out; else only when the membership changes.
        self._known = None if lost or failed or self._pending else set(live)
        names = {str(info.get("name")) for a, info in live.items() if a not in lost}
        self._gone_names = (self._gone_names | self._live_names) - names
        self._live_names = names
        new_workers = survivors + joined
        if not new_workers:
            self.workers = []
            candidates = [w for w in live if w not in lost]
            if candidates and all(self._quarantined(w) for w in candidates):
                errors = "; ".join(f"{w}: {self._errors.get(w)!r}" for w in candidates)
                raise NoWorkersError(
                    f"No worker could take part in the fit: each failed {SETUP_TRIES} set-ups or hung "
                    f"past update_timeout={self.policy.update_timeout} s ({errors}). The estimator keeps "
                    "its last good state; fix the workers (see their logs) and fit again."
                )
            self._wait_for_workers()
            self._refresh_membership(force=True)
        elif new_workers != self.workers:
            self._rebalance(new_workers)

    def _setup_calls(self, workers: list[str]) -> list[tuple[str, str, dict]]:
        """The set-up RPC of each worker (its shared-memory offer made now)."""
        calls = []
        for w in workers:
            kwargs = {"fit_id": self.fit_id, "payload": self._payload, "n_total": len(self.X)}
            # dask config adadamp.channels: False sends every round as Dask RPCs (a firewalled cluster)
            kwargs["channel"] = bool(dask.config.get("adadamp.channels", True)) and tcp_host(w) is not None
            if self._shared is not None:
                kwargs["shared"] = self._shared.offer(w)
            calls.append((w, "adadamp_setup", kwargs))
        self._set_up.update(workers)
        return calls

    def _finish_setup(self, workers: list[str], replies: list) -> tuple[list[str], list[str]]:
        """Connect the workers whose set-up succeeded; returns (ready, failed)."""
        for w, r in zip(workers, replies):
            if self._shared is not None and (isinstance(r, BaseException) or not r.get("shared")):
                self._shared.drop(w)  # another host: weights and gradients go over TCP
            if isinstance(r, BaseException):
                if not isinstance(r, _LOST):
                    raise r
                self._strike(w, r)
                logger.warning("worker %s could not be set up (%r); ignoring it for now", w, r)
            elif r.get("channel"):
                self._connect(w, r["channel"])
        failed = [w for w, r in zip(workers, replies) if isinstance(r, BaseException)]
        return [w for w in workers if w not in failed], failed

    def _strike(self, worker: str, error: BaseException, *, out: bool = False) -> None:
        """Count a failed set-up (``out``: a hang; leave the worker out of this fit at once)."""
        self._strikes[worker] = SETUP_TRIES if out else self._strikes.get(worker, 0) + 1
        self._errors[worker] = error
        if self._quarantined(worker):
            logger.warning("leaving worker %s out of this fit (%r)", worker, error)

    def _quarantined(self, worker: str) -> bool:
        return self._strikes.get(worker, 0) >= SETUP_TRIES

    def _report(self, latest: dict | BaseException) -> None:
        """The membership watcher's callback (client event loop)."""
        self._latest = latest

    def _connect(self, worker: str, offer: dict) -> None:
        try:
            self.channels[worker] = Channel(
                tcp_host(worker),
                offer["port"],
                offer["token"],
                self.flat.numel(),
                timeout=self.policy.update_timeout,
                n_buffers=sum(b.numel() for b in self._buffers),
            )
        except OSError as err:  # e.g. a firewall between client and worker: Dask RPCs still work
            logger.warning("no direct channel to %s (%r); its gradients go through Dask RPCs", worker, err)

    def _forget(self, worker: str) -> None:
        """Release what this engine holds for a worker that left (shared buffers, channel)."""
        if self._shared is not None:
            self._shared.drop(worker)
        channel = self.channels.pop(worker, None)
        if channel is not None:
            channel.close()

    def _wait_for_workers(self) -> None:
        timeout = self.policy.worker_timeout
        logger.warning("no live worker; waiting up to %.0f s for one", timeout)
        deadline = time.monotonic() + timeout
        while True:
            if self.policy.scale:
                self._heal(force=True)
            left = deadline - time.monotonic()
            try:
                self.client.wait_for_workers(1, timeout=max(0.1, min(HEAL_INTERVAL, left)))
                break
            except TimeoutError as err:
                if left <= HEAL_INTERVAL:
                    raise NoWorkersError(
                        f"All Dask workers are gone and none joined within worker_timeout={timeout} s "
                        f"(after {self.loop.n_updates} model updates). The estimator keeps the last good "
                        "weights; add workers to the cluster and call fit again with warm_start=True."
                    ) from err

    def _heal(self, force: bool = False) -> None:
        """Ask again for workers the cluster lost (preempted jobs, worker lifetimes)."""
        now = time.monotonic()
        if not force and (now - self._short_since < HEAL_INTERVAL or now - self._last_heal < HEAL_INTERVAL):
            return
        self._last_heal = now
        logger.info("%d of %d workers alive; asking the cluster again", len(self.workers), self._requested or 1)
        cl.heal(self.client, max(1, self._requested or 1), gone=self._gone_names)

    def _rebalance(self, new_workers: list[str]) -> None:
        """Give every worker a fair share of blocks, moving as few as possible."""
        old = [self.workers[k] for k in self.block_owner] if self.workers else [None] * self.n_blocks
        n_new = len(new_workers)
        quota = {w: self.n_blocks // n_new + (k < self.n_blocks % n_new) for k, w in enumerate(new_workers)}
        owner: list[str | None] = [None] * self.n_blocks
        count = dict.fromkeys(new_workers, 0)
        for b, w in enumerate(old):
            if w in quota and count[w] < quota[w]:
                owner[b] = w
                count[w] += 1
        free = iter(w for w in new_workers for _ in range(quota[w] - count[w]))
        for b in range(self.n_blocks):
            if owner[b] is None:
                owner[b] = next(free)
        add: dict[str, list] = {w: [] for w in new_workers}
        drop: dict[str, list] = {w: [] for w in new_workers}
        for b, (was, now) in enumerate(zip(old, owner)):
            if was != now:
                rows = slice(b * self.block_size, min((b + 1) * self.block_size, len(self.X)))
                add[now].append((b, np.arange(rows.start, rows.stop), self.X[rows], self.y[rows]))
                if was in drop:
                    drop[was].append(b)
        calls = [
            (w, "adadamp_data", {"fit_id": self.fit_id, "add": to_serialize(add[w]), "drop": drop[w]})
            for w in new_workers
            if add[w] or drop[w]
        ]
        replies = self._call_all(calls, timeout=max(60.0, self.policy.update_timeout))
        failed = tuple(c[0] for c, r in zip(calls, replies) if isinstance(r, BaseException))
        for (w, _, _), r in zip(calls, replies):
            if isinstance(r, BaseException) and not isinstance(r, _LOST):
                raise r
            if isinstance(r, BaseException):
                self._strike(w, r)
        self.workers = new_workers
        rank = {w: k for k, w in enumerate(new_workers)}
        self.block_owner = np.array([rank[w] for w in owner], dtype=np.int64)
        logger.info("workers: %d, blocks per worker: %s", n_new, sorted(quota.values()))
        if failed:
            self._refresh_membership(force=True, lost=failed)

    # ------------------------------------------------------------------ scaling
    def _scale_to(self, n: int) -> None:
        if n == self._requested:
            return
        live = list(self.workers) or list(cl.live_workers(self.client))
        if n < len(live) and self.workers:
            victims = self.workers[n:]
            self._rebalance(self.workers[:n])
            cl.retire(self.client, victims, n)
        elif n > len(live) and not cl.request_workers(self.client, n):
            logger.warning("the Dask client has no cluster to scale; using the workers it has")
            self.policy = dataclasses.replace(self.policy, scale=False)
            return
        logger.info("asked the cluster for %d workers (%d live)", n, len(live))
        self._requested = n

    def _wait_for_growth(self, wanted: int) -> None:
        """When the batch outgrows the cluster, wait (bounded, once) for the workers asked for."""
        if len(self.workers) >= wanted or self._waited_for >= wanted:
            return
        self._waited_for = wanted
        with contextlib.suppress(TimeoutError):
            self.client.wait_for_workers(wanted, timeout=self.policy.scale_wait)
        self._refresh_membership(force=True)

    # ------------------------------------------------------------------ training
    def _train_state(self) -> TrainState:
        lp = self.loop
        return TrainState(
            lp.n_updates, lp.n_samples_seen, lp.epoch, lp.n_data, max(1, len(self.workers)), loss=lp.last_loss
        )

    def _take(self, batch_size: int) -> np.ndarray:
        lp = self.loop
        if lp.position == 0 or not hasattr(self, "_perm") or self._perm_epoch != lp.data_epoch:
            self._perm, self._perm_epoch = lp.permutation(), lp.data_epoch
        idx = self._perm[lp.position : lp.position + batch_size]
        lp.position += len(idx)
        if lp.position >= lp.n_data:
            lp.position = 0
            lp.data_epoch += 1
        return idx

    def _gradients(self, idx: np.ndarray, n_chunks: int) -> dict:
        """Sum the workers' gradients over ``idx`` into ``self.grads_np``, recomputing lost shares.

        Sums run in rank order within each round, so the same workers give
        bitwise the same result.  Each reply is added as soon as it and the
        replies before it are in, and the weights are backed up once the first
        reply is in: both then overlap the slower workers' compute, on a core
        the first worker has just freed.
        """
        total = {"n": 0, "weight": 0.0, "loss_sum": 0.0, "chunk_sq_norm_sum": 0.0, "n_chunks": 0, "compute": 0.0,
                 "send": 0.0}
        backed_up = False

        def add(w: str, r: dict) -> None:
            nonlocal backed_up
            grad = self._shared.gradients[w] if r["grad"] is None else r["grad"]
            with np.errstate(invalid="ignore", over="ignore"):
                if total["n"] == 0:
                    np.copyto(self.grads_np, grad)
                else:
                    np.add(self.grads_np, grad, out=self.grads_np)
            if r.get("buffers") is not None:  # running statistics, averaged by examples
                weighted = r["buffers"] * r["n"]
                total["buffers"] = weighted if total["n"] == 0 else total["buffers"] + weighted
            for key in ("n", "loss_sum", "chunk_sq_norm_sum", "n_chunks"):
                total[key] += r[key]
            total["weight"] += r.get("weight", r["n"])  # the loss's normalizer: n, or the targets' class weights
            total["compute"] = max(total["compute"], r["compute_time"])
            if not backed_up:  # these weights, in case the next update's loss is not finite
                self._backups[self._current].copy_(self.flat)
                backed_up = True

        todo = [idx]
        for _attempt in range(1 + 10):
            if not self.workers:
                self._refresh_membership(force=True)
            owners = [(part, self.block_owner[part // self.block_size]) for part in todo]
            requests = []  # one per worker and round: (worker, rank, indices)
            for k, w in enumerate(self.workers):
                sub = np.concatenate([part[owner == k] for part, owner in owners])
                if len(sub):
                    requests.append((w, k, sub))
            replies, send_time = self._round(requests, n_chunks, on_reply=add)
            total["send"] += send_time
            todo, lost = [], []
            for (w, _, sub), r in zip(requests, replies):
                if isinstance(r, _LOST):
                    lost.append(w)
                    todo.append(sub)
                    if isinstance(r, asyncio.TimeoutError | TimeoutError):  # alive but hung (or far too slow)
                        self._strike(w, r, out=True)
                elif isinstance(r, WorkerError) and "more than 1 value per channel" in str(r):
                    raise ValueError(
                        f"A worker's share of update {self.loop.n_updates} was {len(sub)} example(s), too few for "
                        "the module's batch normalization in training mode. Shares follow where the data lives, "
                        "so raise the batch size or grads_per_worker (fewer workers per batch)."
                    ) from r
                elif isinstance(r, BaseException):
                    raise r
            if not todo:
                return total
            logger.warning("lost worker(s) %s during update %d; recomputing their share", lost, self.loop.n_updates)
            self._refresh_membership(force=True, lost=tuple(lost))
        raise NoWorkersError(f"update {self.loop.n_updates} failed on every retry: workers keep dying")

    def _round(self, requests: list[tuple[str, int, np.ndarray]], n_chunks: int, on_reply) -> tuple[list, float]:
        """Send every request, then collect the replies in request order; exceptions are returned.

        Returns the replies and the seconds spent writing the channel requests
        (with the weights, for workers that do not map them).

        Channel requests go out first, so the workers compute while any Dask
        RPCs (workers without a channel) run.  ``on_reply(worker, reply)`` runs for
        each good reply, in request order, as soon as that reply is in.
        """
        replies: list = [None] * len(requests)
        start = time.perf_counter()
        deadline = time.monotonic() + self.policy.update_timeout
        sent, rpc_calls, rpc_slots = set(), [], []
        for i, (w, k, sub) in enumerate(requests):
            seed = (self.loop.seed * 1_000_003 + self.loop.n_updates * 7919 + k) % 2**63
            weights = None if self._shared is not None and w in self._shared.gradients else self.flat_np
            channel = self.channels.get(w)
            if channel is None:
                kwargs = {"fit_id": self.fit_id, "indices": to_serialize(sub), "n_chunks": n_chunks, "seed": seed}
                kwargs["weights"] = None if weights is None else to_serialize(weights)
                rpc_calls.append((w, "adadamp_gradient", kwargs))
                rpc_slots.append(i)
                continue
            try:
                channel.send(sub, n_chunks, seed, weights)
                sent.add(i)
            except OSError as err:
                replies[i] = err
        send_time = time.perf_counter() - start
        for i, r in zip(rpc_slots, self._call_all(rpc_calls)):
            replies[i] = r
        for i, (w, _, _) in enumerate(requests):
            if i in sent:
                try:
                    replies[i] = vars(self.channels[w].receive(deadline))
                except (WorkerError, *_LOST) as err:
                    replies[i] = err
            if isinstance(replies[i], dict):
                on_reply(w, replies[i])
        return replies, send_time

    def update(self) -> dict:
        """One model update; returns its record for the history."""
        t_start = time.perf_counter()
        self._refresh_membership()
        state = self._train_state()
        batch_size = int(self.damper.next_batch_size(state))
        if batch_size < 1:
            raise ValueError(f"{type(self.damper).__name__} asked for batch size {batch_size}; it must be >= 1.")
        if self.policy.scale:
            ahead = self.damper.forecast_batch_size(state.epoch + self.policy.prescale_epochs) or 0
            self._scale_to(self.policy.wanted(max(batch_size, ahead)))
            self._wait_for_growth(self.policy.wanted(batch_size))
            if len(self.workers) < (self._requested or 0):
                self._short_since = min(self._short_since, time.monotonic())
                self._heal()
            else:
                self._short_since = math.inf
        idx = self._take(batch_size)
        n_chunks = 2 if self.damper.needs_grad_stats else 1
        t_sent = time.perf_counter()
        total = self._gradients(idx, n_chunks)
        t_back = time.perf_counter()

        n = total["n"]
        weight = total["weight"]  # = n unless the criterion's mean is class-weighted
        loss = total["loss_sum"] / weight
        if "buffers" in total:
            self._set_buffers(total["buffers"] / n)
        with np.errstate(invalid="ignore", over="ignore"):
            self.grads_np *= 1.0 / weight
        if not math.isfinite(loss) or not np.isfinite(self.grads_np).all():
            self.flat.copy_(self._backups[1 - self._current])
            raise ConvergenceError(
                f"Non-finite training loss ({loss}) at model update {self.loop.n_updates} with batch "
                f"size {len(idx)}. The estimator keeps the last finite weights; lower the learning "
                "rate (optimizer__lr) or the batch-size growth."
            )
        stats = None
        if self.damper.needs_grad_stats:
            g64 = self.grads_np.astype(np.float64)
            if weight != n:  # the statistics are per example: the mean of the workers' sums
                g64 *= weight / n
            stats = GradStats(
                n_samples=int(n),
                grad_sq_norm=float(g64 @ g64),
                chunk_sq_norm_sum=float(total["chunk_sq_norm_sum"]),
                n_chunks=int(total["n_chunks"]),
            )
        plan = self.damper.plan_update(state, int(n), stats)
        t_agg = time.perf_counter()

        self._current = 1 - self._current
        lr = apply_plan(self.optimizer, plan)
        self.optimizer.step()
        t_step = time.perf_counter()

        lp = self.loop
        lp.n_updates += 1
        lp.n_samples_seen += int(n)
        lp.progress += float(n if plan.progress is None else plan.progress)
        lp.last_loss = loss
        round_trip = t_back - t_sent
        return {
            "batch_size": int(n),
            "lr": lr,
            "n_workers": len(self.workers),
            "loss": loss,
            "compute_time": total["compute"],
            "comm_time": max(0.0, round_trip - total["compute"]),
            "send_time": total["send"],
            "aggregate_time": t_agg - t_back,
            "step_time": t_step - t_agg,
            "update_time": t_step - t_start,
        }

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
        target = (math.floor(lp.epoch + 1e-9) + 1) * lp.n_data
        updates = list(updates or [])
        earlier = sum(u["update_time"] for u in updates)
        while lp.progress < target - 1e-6:
            updates.append(self.update())
            if on_update is not None:
                on_update(updates)
        n = sum(u["batch_size"] for u in updates)
        return {
            "epoch": round(target / lp.n_data),
            "train_loss": sum(u["loss"] * u["batch_size"] for u in updates) / n,
            "batch_size": max(u["batch_size"] for u in updates),
            "lr": updates[-1]["lr"],
            "n_workers": updates[-1]["n_workers"],
            "n_updates": lp.n_updates,
            "n_samples_seen": lp.n_samples_seen,
            "dur": earlier + time.perf_counter() - start,
            "updates": updates,
        }
