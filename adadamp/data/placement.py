"""Where the training data lives: the examples cut into blocks, the blocks grouped into shards, each
shard held by one worker.

A batch is cut by shards, not by workers: shard ``g``'s examples of an update are gathered and
differentiated in one pass wherever shard ``g`` lives, and the client adds the shards' gradient
sums in shard order.  So an update's arithmetic depends on the number of shards, never on which
worker, or how many, computed them: a worker that dies hands its shards to the others and the
trajectory does not change by a single bit (``elasticity`` in the docs).  Rank ``k`` is
the ``k``-th worker of the fit; each worker holds ``n_shards // n_workers`` shards (the first ones
one more), or, with speed-based shares, a number of shards that makes the workers finish together
(:func:`shard_quotas`).  When the workers or their quotas change, :func:`plan_moves`
moves as few shards as possible (docs/guide/elasticity.rst).  Pure; no Dask.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ..wire.batches import shard_of_blocks

__all__ = ["Placement", "makespan", "plan_moves", "shard_of_blocks", "shard_quotas"]


def shard_quotas(n_shards: int, speeds: list[float], fixed: list[float] | None = None) -> list[int]:
    """The shards each worker holds so that all finish together: whole shards, each given in turn to
    the worker that would finish it first (the lower rank on a tie).

    Worker ``k`` holding ``h > 0`` shards takes ``fixed[k] + h / speeds[k]`` (``fixed``: its time per
    update whatever its share, 0 by default); one holding none takes no time (it gets no request).
    Without fixed times this greedy order minimises the slowest worker's time (the makespan of
    identical jobs on machines of speeds ``speeds``).  A worker too slow to finish even one shard
    (with its fixed time) before the others finish theirs gets none (it is a straggler,
    :mod:`adadamp.engine.speeds`).

    Examples
    --------
    >>> shard_quotas(16, [1.0, 1.0, 1.0, 0.5])  # a half-speed worker of four: 2 units of time each
    [5, 5, 4, 2]
    >>> shard_quotas(4, [1.0, 1.0, 1.0, 1.0]), shard_quotas(4, [1.0, 1.0, 1.0, 0.1])
    ([1, 1, 1, 1], [2, 1, 1, 0])
    >>> shard_quotas(16, [1.0, 1.0, 1.0, 0.5], fixed=[1.0, 1.0, 1.0, 2.0])  # its fixed time is slower too
    [5, 5, 5, 1]
    """
    fixed = [0.0] * len(speeds) if fixed is None else [float(f) for f in fixed]
    speeds = [max(float(s), 1e-12) for s in speeds]
    held = [0] * len(speeds)
    for _ in range(n_shards):
        k = min(range(len(speeds)), key=lambda i: (fixed[i] + (held[i] + 1) / speeds[i], i))
        held[k] += 1
    return held


def makespan(held: list[int], speeds: list[float], fixed: list[float] | None = None) -> float:
    """The time the slowest worker takes for ``held`` shards at ``speeds`` (shards per unit of time),
    each worker holding any also taking its ``fixed`` time (0 by default).

    >>> makespan([1, 1, 1, 1], [1.0, 1.0, 1.0, 0.5]), makespan([5, 5, 4, 2], [1.0, 1.0, 1.0, 0.5])
    (2.0, 5.0)
    """
    fixed = [0.0] * len(speeds) if fixed is None else fixed
    return max((f + h / max(float(s), 1e-12) for h, s, f in zip(held, speeds, fixed) if h), default=0.0)


def plan_moves(
    old: list[str | None], workers: list[str], n_shards: int, preferred: list[str | None] | None = None,
    quota: list[int] | None = None,
) -> tuple[np.ndarray, list[str], dict[str, list[int]], dict[str, list[int]]]:
    """Shards of the blocks owned by ``old`` (one name per block; None: not placed yet), and their holders.

    Each worker holds ``quota[k]`` shards (None: ``n_shards // len(workers)``, the first
    ``n_shards % len(workers)`` one more; with more workers than shards, the last ones hold none).  A shard stays with the
    worker that holds most of its blocks while that one is under quota, then goes to the worker
    where Dask holds most of its blocks (``preferred``), then to the first worker under quota.

    Returns
    -------
    shard_of : ndarray
        The shard of each block.
    holder : list of str
        The worker of each shard.
    add, drop : dict of str to list of int
        Per worker, the blocks it receives and the blocks it gives up.

    Examples
    --------
    >>> shard_of, holder, add, drop = plan_moves(["a", "a", "b", "b", "c", "c"], ["a", "c"], 3)  # b died
    >>> shard_of.tolist(), holder, add, drop
    ([0, 0, 1, 1, 2, 2], ['a', 'a', 'c'], {'a': [2, 3], 'c': []}, {'a': [], 'c': []})
    """
    n_blocks = len(old)
    shard_of = shard_of_blocks(n_blocks, n_shards)
    if quota is None:
        quota = [n_shards // len(workers) + (k < n_shards % len(workers)) for k in range(len(workers))]
    if sum(quota) != n_shards or len(quota) != len(workers):
        raise ValueError(f"quotas {quota} do not give {n_shards} shards to {len(workers)} workers")
    quota = dict(zip(workers, quota))
    holder: list[str | None] = [None] * n_shards
    count = dict.fromkeys(workers, 0)
    for where in (old, preferred):
        if where is None:
            continue
        for g in range(n_shards):
            votes = Counter(where[b] for b in np.flatnonzero(shard_of == g) if where[b] in quota)
            best = max(votes, key=lambda w: (votes[w], -workers.index(w)), default=None)
            if holder[g] is None and best is not None and count[best] < quota[best]:
                holder[g] = best
                count[best] += 1
    free = iter(w for w in workers for _ in range(quota[w] - count[w]))
    holder = [w if w is not None else next(free) for w in holder]
    add: dict[str, list[int]] = {w: [] for w in workers}
    drop: dict[str, list[int]] = {w: [] for w in workers}
    for b, was in enumerate(old):
        now = holder[shard_of[b]]
        if was != now:
            add[now].append(b)
            if was in drop:
                drop[was].append(b)
    return shard_of, holder, add, drop


class Placement:
    """The blocks of ``n_examples`` examples, their shards and the rank holding each.

    Blocks are ``n_examples / n_blocks`` examples each (rounded up), or the given ``lengths``
    (a dask collection's partitions).

    Examples
    --------
    >>> p = Placement(10, n_blocks=4)
    >>> p.block_size, p.n_blocks, p.rows(3)
    (3, 4, range(9, 10))
    >>> shard_of, holder, _, _ = plan_moves(p.names([]), ["a", "b"], n_shards=2)
    >>> p.assign(shard_of, holder, ["a", "b"])
    >>> [(g, idx.tolist()) for g, idx in p.shards(np.array([9, 0, 4, 7]))]
    [(0, [0, 4]), (1, [9, 7])]
    >>> p.holder.tolist()  # the rank holding each shard
    [0, 1]
    """

    def __init__(self, n_examples: int, n_blocks: int = 256, lengths: list[int] | None = None):
        self.n_examples = n_examples
        if lengths is None:
            self.block_size: int | None = math.ceil(n_examples / min(n_examples, n_blocks))
            self.n_blocks = math.ceil(n_examples / self.block_size)
            self.starts = np.arange(self.n_blocks, dtype=np.int64) * self.block_size
        else:
            self.block_size = None  # blocks of their own sizes: found by binary search
            self.n_blocks = len(lengths)
            self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.shard_of = np.zeros(self.n_blocks, dtype=np.int64)  # shard of each block
        self.holder = np.zeros(0, dtype=np.int64)  # rank of each shard
        self.owner = np.zeros(self.n_blocks, dtype=np.int64)  # rank of each block
        #: Streamed data (:class:`~adadamp.wire.batches.StreamOrder`): the blocks' shards follow the data epoch.
        self.order = None
        self.epoch = 0

    @property
    def n_shards(self) -> int:
        """The shards an update is cut into (0 before the first placement)."""
        return len(self.holder)

    def rows(self, block: int) -> range:
        stop = self.starts[block + 1] if block + 1 < self.n_blocks else self.n_examples
        return range(int(self.starts[block]), int(stop))

    def blocks_of(self, idx: np.ndarray) -> np.ndarray:
        """The block of each example index."""
        if self.block_size is not None:
            return idx // self.block_size
        return np.searchsorted(self.starts, idx, side="right") - 1

    def names(self, workers: list[str]) -> list[str | None]:
        """The owner of each block by name (None for all before the first placement)."""
        return [workers[k] for k in self.owner] if workers and self.n_shards else [None] * self.n_blocks

    def assign(self, shard_of: np.ndarray, holder: list[str], workers: list[str]) -> None:
        rank = {w: k for k, w in enumerate(workers)}
        if self.order is not None:  # streamed: each epoch deals its blocks to the shards anew
            shard_of = self.order.shard_of(self.epoch, len(holder))
        self.shard_of = np.asarray(shard_of, dtype=np.int64)
        self.holder = np.array([rank[w] for w in holder], dtype=np.int64)
        self.owner = self.holder[self.shard_of]

    def at_epoch(self, epoch: int) -> None:
        """Streamed data: the blocks' shards of data epoch ``epoch`` (no change otherwise)."""
        if self.order is not None and epoch != self.epoch:
            self.epoch = epoch
            self.shard_of = self.order.shard_of(epoch, self.n_shards)
            self.owner = self.holder[self.shard_of]

    def shards(self, idx: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Cut a batch by shards: ``(shard, indices)`` for every shard with any, in shard order
        (each shard's indices in the batch's order)."""
        shard = self.shard_of[self.blocks_of(idx)]
        return [(g, idx[shard == g]) for g in np.unique(shard).tolist()]
