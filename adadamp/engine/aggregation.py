"""Where the workers' gradients are summed: in rank order, into the client's gradient buffer.

Each worker returns the gradient SUM over its share (and the example count, the loss sum and
the statistics the damper asked for); the client adds the replies in rank order as they come in
(so the same workers give bitwise the same sum) and divides once, by the batch's total, when the
round is complete (DESIGN.md §2-§3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..records import GradientReply
from ..shm import SharedBuffers


@dataclass
class Totals:
    """What one update's replies add up to (the gradient itself is summed in place)."""

    n: int = 0
    weight: float = 0.0  # the loss's normalizer: the examples, or the targets' class weights
    loss_sum: float = 0.0
    chunk_sq_norm_sum: float = 0.0
    n_chunks: int = 0
    compute: float = 0.0  # the slowest worker's compute time
    send: float = 0.0  # seconds spent writing the requests
    buffers: np.ndarray | None = None  # running statistics weighted by examples (BatchNorm)


class GradientSum:
    """Adds replies into ``grads`` (the client's flat gradient buffer)."""

    def __init__(self, grads: np.ndarray, shared: SharedBuffers | None):
        self.grads = grads
        self.shared = shared
        self.totals = Totals()

    def add(self, worker: str, r: GradientReply) -> None:
        t = self.totals
        grad = self.shared.gradients[worker] if r.grad is None else r.grad
        with np.errstate(invalid="ignore", over="ignore"):
            if t.n == 0:
                np.copyto(self.grads, grad)
            else:
                np.add(self.grads, grad, out=self.grads)
        if r.buffers is not None:  # running statistics, averaged by examples
            weighted = r.buffers * r.n
            t.buffers = weighted if t.n == 0 else t.buffers + weighted
        t.n += r.n
        t.loss_sum += r.loss_sum
        t.chunk_sq_norm_sum += r.chunk_sq_norm_sum
        t.n_chunks += r.n_chunks
        t.weight += r.weight
        t.compute = max(t.compute, r.compute_time)
