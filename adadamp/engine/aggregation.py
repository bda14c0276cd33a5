"""Where the workers' gradients are summed: in shard order, into the client's gradient buffer.

Each worker returns the gradient SUM over one shard of the batch (and the example count, the loss
sum and the statistics the damper asked for); the client adds the shards in shard order as they
come in and divides once, by the batch's total, when the round is complete (Holt & Sievert 2021,
"Architecture", steps 3-4: the master aggregates the workers' gradients and updates the model).
Float addition is not associative, so the order is fixed by the shards and never by the workers:
the same batch gives bitwise the same sum whichever workers, and how many, computed it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..records import GradientReply
from ..wire.shm import SharedBuffers


@dataclass
class Totals:
    """What one update's replies add up to (the gradient itself is summed in place)."""

    n: int = 0
    weight: float = 0.0  # the loss's normalizer: the examples, or the targets' class weights
    loss_sum: float = 0.0
    chunk_sq_norm_sum: float = 0.0
    n_chunks: int = 0
    compute: float = 0.0  # the slowest worker's compute time (all its shards)
    send: float = 0.0  # seconds spent writing the requests
    buffers: np.ndarray | None = None  # running statistics weighted by examples (BatchNorm)
    digest: int = 0  # records.examples_digest of the examples summed
    grad_sq_norm: float | None = None  # of the mean gradient, where the workers computed it (all-reduce)
    #: per worker: the examples it computed and its compute seconds (all its shards; the speeds' measurements)
    per_worker: dict[str, list] = dataclasses.field(default_factory=dict)
    #: per worker: its peak memory in the update (bytes; the largest of its replies')
    memory: dict[str, int] = dataclasses.field(default_factory=dict)

    def measured(self, worker: str, n: int, seconds: float, peak_memory: int = 0) -> None:
        """Count ``n`` examples computed in ``seconds`` by ``worker``, at a peak of ``peak_memory``
        bytes; ``compute`` is the slowest's time."""
        mine = self.per_worker.setdefault(worker, [0, 0.0])
        mine[0] += int(n)
        mine[1] += seconds
        self.compute = max(self.compute, mine[1])
        self.memory[worker] = max(self.memory.get(worker, 0), int(peak_memory))


class GradientSum:
    """Adds the shards' replies into ``grads`` (the client's flat gradient buffer) in shard order.

    :meth:`expect` names the update's shards; a reply that arrives before the shards ahead of it
    (a lost shard recomputed in a later round) waits, copied, until they are in.  A reply may hold
    several shards (speed-based shares): it is named by its first shard, and :meth:`redo` names the
    replies that replace a lost one.
    """

    def __init__(self, grads: np.ndarray, shared: SharedBuffers | None):
        self.grads = grads
        self.shared = shared
        self.totals = Totals()
        self._order: list[int] = []
        self._added = 0
        self._waiting: dict[int, GradientReply] = {}

    def expect(self, shards: list[int]) -> None:
        """The shards of this update, in the order they are added."""
        self._order = list(shards)

    def redo(self, lost: list[int], again: list[int]) -> None:
        """The replies named ``lost`` will not come; those named ``again`` (recomputing their shards)
        come instead, in shard order with the rest from the first lost one on (none of those was
        added yet).  A shard recomputed alone keeps its place: the same order, the same sum."""
        at = min(self._order.index(g) for g in lost)
        self._order[at:] = sorted([g for g in self._order[at:] if g not in lost] + list(again))

    def add(self, shard: int, worker: str, r: GradientReply) -> None:
        """Add shard ``shard``'s reply from ``worker`` (its gradient may be in shared memory)."""
        self.totals.measured(worker, r.n, r.compute_time, r.peak_memory)
        grad = self.shared.gradients[worker] if r.grad is None else r.grad
        if self._order[self._added] != shard:  # buffers are reused by the next reply: keep a copy
            self._waiting[shard] = dataclasses.replace(r, grad=np.array(grad))
            return
        self._fold(r, grad)
        while self._added < len(self._order) and self._order[self._added] in self._waiting:
            r = self._waiting.pop(self._order[self._added])
            self._fold(r, r.grad)

    def _fold(self, r: GradientReply, grad: np.ndarray) -> None:
        t = self.totals
        with np.errstate(invalid="ignore", over="ignore"):
            if self._added == 0:
                np.copyto(self.grads, grad)
            else:
                np.add(self.grads, grad, out=self.grads)
        if r.buffers is not None:  # running statistics, averaged by examples
            weighted = r.buffers * r.n
            t.buffers = weighted if t.buffers is None else t.buffers + weighted
        t.n += r.n
        t.loss_sum += r.loss_sum
        t.chunk_sq_norm_sum += r.chunk_sq_norm_sum
        t.n_chunks += r.n_chunks
        t.weight += r.weight
        t.digest = (t.digest + r.digest) % 2**64
        self._added += 1
