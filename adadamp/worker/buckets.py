"""The flat gradient cut into buckets, all-reduced while the backward pass still runs (runs on
the workers).

As PyTorch's DDP does: a bucket is a contiguous range of the flat gradient, launched as soon as the
backward pass has filled it, in the same order on every rank; each bucket is divided by the batch's
size as it arrives.  It holds only how one update's communication overlaps with compute, none of
the group's formation or recovery: the replica (:mod:`adadamp.worker.replica`) arms it on the
group of the update and disarms it when the update fails.
"""

from __future__ import annotations

import numpy as np
import torch

from ..wire.parameters import squared_norm


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
