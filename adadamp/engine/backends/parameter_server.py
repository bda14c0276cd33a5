"""The parameter-server backend: the client holds the weights and steps; workers compute gradients.

Each update (Holt & Sievert 2021, "Architecture": the client is the master node):

1. the damper names the batch size; :mod:`~adadamp.dampers.clock` draws that many example
   indices from one seeded permutation per data epoch (the trajectory does not depend on how
   many workers there are, :doc:`/guide/elasticity`);
2. :mod:`~adadamp.data.placement` cuts the indices by shards (fixed groups of data blocks) and
   routes each shard to the worker holding it, and :mod:`~adadamp.engine.transport` sends each
   worker the weights and its shard's indices in one message;
3. each worker returns the gradient SUM over the shard's examples (plus the example count, the
   loss sum and the statistics the damper asked for);
4. :mod:`~adadamp.engine.aggregation` sums in shard order; the client divides once, asks the
   damper for the learning-rate factor and momentum, and steps.

A worker that dies or times out loses only its shards of one update: their data blocks are placed
again from the data source (the client's arrays, or a dask array's lineage) and the shards are
recomputed on the survivors (:doc:`/guide/elasticity`).  The number of shards is not the number of
workers: it changes only between updates, with the batch size when the fit scales the cluster, and
otherwise only when more workers take part than there are shards, so a worker lost and replaced
changes no update by a single bit.
This module talks to Dask; it knows nothing about scikit-learn.
"""

from __future__ import annotations

import logging
import math
from collections import Counter

import cloudpickle
import numpy as np
import torch

from ...records import ShareRequest
from ...wire.averaging import update_average
from ...wire.batches import dropout_seed
from ...wire.optimizer_plan import apply_plan
from ...wire.parameters import bind_parameters, exact_squared_norm, flatten_parameters, float_buffers, trainable
from ...worker.gradient import flat_buffers, set_buffers
from ..aggregation import GradientSum, Totals
from .base import Backend, Batch
from .rounds import MAX_RECOMPUTES, in_rounds, triage

logger = logging.getLogger(__name__)


class ParameterServer(Backend):
    """Trains ``module`` on ``data`` held by the workers of ``client``: the client holds the
    weights and steps; each update, the workers get the weights and return their shards'
    gradient sums (the parameters: :class:`~adadamp.engine.backends.base.Backend`).  Workers no
    fit wants are lent to it (with speed shares): a worker joins or leaves between two updates at
    the cost of its blocks' placement, where the all-reduce's group would form again."""

    lends = True

    def module_payload(self) -> bytes:
        """What a worker's set-up builds its module from."""
        return cloudpickle.dumps((self.module, self.criterion, self.device))

    def bind(self) -> None:
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
        lost_keys: list[int] = []  # the first shards of the last round's lost requests
        buffers = self._buffer_values()  # the running statistics every shard starts from

        def one_round(k: int) -> tuple[Totals | None, list[str]]:
            nonlocal todo
            self._stage(idx, epoch)  # streamed data: its blocks where the shards are now
            shards = [(g, sub) for g, sub in self.placement.shards(idx) if todo is None or g in todo]
            units = self._units(shards)
            if todo is None:
                summed.expect([unit[0][0] for unit in units])
            else:
                summed.redo(lost_keys, [unit[0][0] for unit in units])
            # the shard of each example named ahead (only with the first round's requests)
            ahead_shard = None
            if ahead is not None and k == 0:
                ahead_shard = self.placement.shard_of[self.placement.blocks_of(ahead % self.loop.n_data)]
            holders = [int(self.placement.holder[unit[0][0]]) for unit in units]
            several = {h for h, count in Counter(holders).items() if count > 1}  # their gradients come in replies
            requests = [self._request(h, unit, epoch, ahead, ahead_shard, h in several) for h, unit in zip(holders, units)]
            replies, send_time = self.transport.round(
                requests, n_chunks, self.flat_np, on_reply=add, buffers=buffers, patient=self._patient(),
                loss_scale=self._share_scale(len(idx)),
            )
            summed.totals.send += send_time
            lost, _ = triage(self.members, [q.worker for q in requests], replies)
            lost_keys[:] = [requests[i].shard for i in lost]
            todo = {g for i in lost for g, _ in units[i]}
            if not todo:
                return summed.totals, []
            workers = list(dict.fromkeys(requests[i].worker for i in lost))
            logger.warning("lost worker(s) %s during update %d; recomputing their shards", workers, self.loop.n_updates)
            return None, workers

        return in_rounds(self.members, one_round, (
            f"update {self.loop.n_updates} lost a share in {1 + MAX_RECOMPUTES} rounds in a row: workers keep dying"
        ))

    def _units(self, shards: list[tuple[int, np.ndarray]]) -> list[list[tuple[int, np.ndarray]]]:
        """The requests of a round: one per shard, or (speed-based shares) one per worker with all
        the shards it holds, so its shards are one message and (examples independent) one pass."""
        if self.policy.shares != "speed":
            return [[shard] for shard in shards]
        by_holder: dict[int, list] = {}
        for g, sub in shards:
            by_holder.setdefault(int(self.placement.holder[g]), []).append((g, sub))
        return sorted(by_holder.values(), key=lambda unit: unit[0][0])

    def _request(self, holder: int, unit: list, epoch: int, ahead, ahead_shard, in_reply: bool) -> ShareRequest:
        """The request computing ``unit``'s shards (``(shard, indices)`` pairs) on worker ``holder``."""
        first = unit[0][0]
        seeds = [dropout_seed(self.loop.seed, self.loop.n_updates, g) for g, _ in unit]
        parts = None
        if len(unit) > 1:
            parts = np.array([(seed, len(sub)) for seed, (_, sub) in zip(seeds, unit)], dtype=np.int64)
        return ShareRequest(
            self.workers[holder], seeds[0], unit[0][1] if len(unit) == 1 else np.concatenate([sub for _, sub in unit]),
            epoch, ahead=None if ahead_shard is None else ahead[np.isin(ahead_shard, [g for g, _ in unit])],
            shard=first, in_reply=in_reply, parts=parts,
        )

    def gradient_round(self, batch: Batch) -> Totals:
        """The shards' gradient sums added into ``self.grads_np``, then divided once (and unscaled,
        ``precision="16-mixed"``); the running statistics set to the workers' example-weighted mean."""
        total = self._gradients(batch.idx, batch.n_chunks, batch.epoch, batch.ahead)
        self._batch_epoch = batch.epoch  # weight averaging starts at a data epoch
        if total.buffers is not None:
            self._set_buffers(total.buffers / total.n)
        with np.errstate(invalid="ignore", over="ignore"):
            self.grads_np *= 1.0 / total.weight
            if self._scaler is not None:
                self.grads_np *= np.float32(1.0 / self._share_scale(len(batch.idx)))
        return total

    def _share_scale(self, batch_size: int) -> float:
        """What the workers multiply their loss sums by (``precision="16-mixed"``): the loss scale
        over the batch size, so that the float16 gradients of a worker's backward pass are those of
        a single process's scaled mean loss over the batch (GradScaler's overflow, whatever the
        split), 1.0 without loss scaling."""
        return 1.0 if self._scaler is None else self.loss_scale / max(1, batch_size)

    def finite(self, loss: float, total: Totals) -> bool:
        return math.isfinite(loss) and bool(np.isfinite(self.grads_np).all())

    def keep_last_finite(self) -> None:
        self.flat.copy_(self._backups[1 - self._current])

    def grad_sq_norm(self, total: Totals) -> float:
        scale = total.weight / total.n  # the statistics are per example: the mean of the workers' sums
        return float(exact_squared_norm(self.grads)) * scale * scale

    def stepped_weights(self) -> np.ndarray:
        return self.flat_np

    def step(self, plan) -> float:
        """The client steps (after clipping the mean gradient, ``clip_grad_norm``; then the weights'
        average moves, ``weight_averaging``)."""
        self._current = 1 - self._current
        lr = apply_plan(self.optimizer, plan)
        if self.kit.clip_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(trainable(self.module), self.kit.clip_grad_norm)
            self.grad_norm = float(norm)
        self.optimizer.step()
        if self.kit.averaging is not None:
            update_average(self.optimizer, trainable(self.module), self.kit.averaging, self._batch_epoch)
        return lr

    def sync(self) -> None:
        """Bring the client's module and optimizer up to date: they always are here (the client steps)."""

    def _buffer_values(self) -> np.ndarray | None:
        """The module's running statistics as one float32 vector, which every share starts from
        (None without any): a shard's statistics then do not depend on the worker computing it."""
        return flat_buffers(self._buffers).numpy() if self._buffers else None

    def _set_buffers(self, values: np.ndarray) -> None:
        """The module's BatchNorm-style statistics: the workers' example-weighted mean."""
        set_buffers(self._buffers, torch.from_numpy(values))
