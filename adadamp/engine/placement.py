"""Where the training data lives: the examples cut into blocks, each block held by one worker.

Rank ``k`` is the ``k``-th worker of the fit; a batch's indices are routed to the ranks that
hold their blocks.  When the workers change, :func:`plan_moves` gives every worker a fair share
of blocks while moving as few as possible (dask-engine.md §4.2).  Pure; no Dask.
"""

from __future__ import annotations

import math

import numpy as np


def plan_moves(
    old: list[str | None], workers: list[str], preferred: list[str | None] | None = None
) -> tuple[list[str], dict[str, list[int]], dict[str, list[int]]]:
    """New owners for the blocks owned by ``old`` (one name per block; None: not placed yet).

    Each worker gets ``n_blocks // len(workers)`` blocks, the first ``n_blocks % len(workers)``
    one more; a block stays where it is while its owner is under quota, then goes to its
    ``preferred`` worker (where Dask already holds it) while that one is under quota.

    Returns
    -------
    owner : list of str
        The worker of each block.
    add, drop : dict of str to list of int
        Per worker, the blocks it receives and the blocks it gives up.

    Examples
    --------
    >>> owner, add, drop = plan_moves(["a", "a", "a", "a"], ["a", "b"])
    >>> owner, add, drop
    (['a', 'a', 'b', 'b'], {'a': [], 'b': [2, 3]}, {'a': [2, 3], 'b': []})
    """
    n_blocks, n_new = len(old), len(workers)
    quota = {w: n_blocks // n_new + (k < n_blocks % n_new) for k, w in enumerate(workers)}
    owner: list[str | None] = [None] * n_blocks
    count = dict.fromkeys(workers, 0)
    for b, w in enumerate(old):
        if w in quota and count[w] < quota[w]:
            owner[b] = w
            count[w] += 1
    for b, w in enumerate(preferred or ()):
        if owner[b] is None and w in quota and count[w] < quota[w]:
            owner[b] = w
            count[w] += 1
    free = iter(w for w in workers for _ in range(quota[w] - count[w]))
    for b in range(n_blocks):
        if owner[b] is None:
            owner[b] = next(free)
    add: dict[str, list[int]] = {w: [] for w in workers}
    drop: dict[str, list[int]] = {w: [] for w in workers}
    for b, (was, now) in enumerate(zip(old, owner)):
        if was != now:
            add[now].append(b)
            if was in drop:
                drop[was].append(b)
    return owner, add, drop


class Placement:
    """The blocks of ``n_examples`` examples and the rank holding each.

    Blocks are ``n_examples / n_blocks`` examples each (rounded up), or the given ``lengths``
    (a dask collection's partitions).

    Examples
    --------
    >>> p = Placement(10, n_blocks=4)
    >>> p.block_size, p.n_blocks, p.rows(3)
    (3, 4, range(9, 10))
    >>> p.owner[:] = [0, 0, 1, 1]
    >>> [(rank, idx.tolist()) for rank, idx in p.shares([np.array([9, 0, 4])], n_ranks=2)]
    [(0, [0, 4]), (1, [9])]
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
        self.owner = np.zeros(self.n_blocks, dtype=np.int64)  # rank of each block

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
        return [workers[k] for k in self.owner] if workers else [None] * self.n_blocks

    def assign(self, owner: list[str], workers: list[str]) -> None:
        rank = {w: k for k, w in enumerate(workers)}
        self.owner = np.array([rank[w] for w in owner], dtype=np.int64)

    def shares(self, parts: list[np.ndarray], n_ranks: int) -> list[tuple[int, np.ndarray]]:
        """Route example indices to their ranks: ``(rank, indices)`` for every rank with any, in rank order."""
        owners = [(part, self.owner[self.blocks_of(part)]) for part in parts]
        out = []
        for k in range(n_ranks):
            sub = np.concatenate([part[owner == k] for part, owner in owners])
            if len(sub):
                out.append((k, sub))
        return out
