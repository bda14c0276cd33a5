"""How an update's batch is named, the same on both sides of the connection.

The examples of an update are a slice of one seeded permutation per data epoch
(:func:`epoch_permutation`); they are cut by shards, each shard a run of data blocks
(:func:`shard_of_blocks`), and each shard's dropout masks come from :func:`dropout_seed`.  The
client draws batches from these (:mod:`adadamp.dampers.clock`, :mod:`adadamp.data.placement`);
an all-reduce member computes its own shards' examples (and their dropout seeds) from a
:class:`BatchPlan`, so a request carries three integers instead of every example index, and the
placement only when it changed.  Streamed data (:class:`StreamOrder`) has its own order of
examples and of blocks' shards per data epoch.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

__all__ = ["BATCH_VALUES", "LAYOUT_VALUES", "WINDOW", "BatchPlan", "StreamOrder", "dropout_seed", "epoch_permutation",
           "next_keys", "shard_of_blocks"]


def epoch_permutation(seed: int, data_epoch: int, n: int) -> np.ndarray:
    """The order of the ``n`` examples in data epoch ``data_epoch`` of a fit seeded ``seed``."""
    return np.random.default_rng([seed, data_epoch]).permutation(n)


def next_keys(seed: int, n: int, data_epoch: int, position: int, batch_size: int, batches: int,
              perm: np.ndarray | None = None, permute=None) -> np.ndarray:
    """The examples of the ``batches`` batches of ``batch_size`` that start at ``position`` of data
    epoch ``data_epoch``, as keys ``data_epoch * n + index`` (a batch never straddles two epochs).

    ``perm``: this epoch's permutation when the caller holds it already; ``permute(epoch)``: an
    epoch's order when it is not :func:`epoch_permutation` (streamed data).

    Examples
    --------
    >>> keys = next_keys(0, 5, 0, 0, 2, batches=4)  # 2 + 2 + 1 (the end of epoch 0), then 2 of epoch 1
    >>> (keys // 5).tolist()
    [0, 0, 0, 0, 0, 1, 1]
    """
    keys = []
    for _ in range(batches):
        if perm is None:
            perm = epoch_permutation(seed, data_epoch, n) if permute is None else permute(data_epoch)
        stop = min(position + batch_size, n)
        keys.append(perm[position:stop] + data_epoch * n)
        position = stop
        if position >= n:
            position, data_epoch, perm = 0, data_epoch + 1, None
    return np.concatenate(keys).astype(np.int64) if keys else np.zeros(0, dtype=np.int64)


def shard_of_blocks(n_blocks: int, n_shards: int) -> np.ndarray:
    """The shard of each block: ``n_shards`` runs of consecutive blocks, the first
    ``n_blocks % n_shards`` one block longer.

    Examples
    --------
    >>> shard_of_blocks(5, 2).tolist()
    [0, 0, 0, 1, 1]
    """
    sizes = [n_blocks // n_shards + (g < n_blocks % n_shards) for g in range(n_shards)]
    return np.repeat(np.arange(n_shards, dtype=np.int64), sizes)


def dropout_seed(seed: int, n_updates: int, part: int) -> int:
    """The random seed of shard ``part`` of update ``n_updates`` (dropout masks), on both backends."""
    return (seed * 1_000_003 + n_updates * 7919 + part) % 2**63


#: The values of a plan that change with every batch (:meth:`BatchPlan.to_array`): start, stop, ahead size.
BATCH_VALUES = 3
#: The layout's values before its shard ids: seed, shards, blocks, block size, ahead batches.
LAYOUT_VALUES = 5


@dataclasses.dataclass
class BatchPlan:
    """An all-reduce member's part of one update, described rather than listed.

    The batch is ``epoch_permutation(seed, data_epoch, n)[start:stop]``; the member computes the
    examples of its shards in the batch, one forward and backward pass per shard (shard ``g``'s
    dropout masks seeded by :func:`dropout_seed` of the update), and may load the next
    ``ahead_batches`` batches of ``ahead_size`` examples of its shards meanwhile (lazy Datasets).
    On the wire it is one int64 vector (:meth:`to_array`): the batch's three values, and the
    :meth:`layout` (the seed, the placement and the member's shards) only when it changed since
    the member last heard it, so a request costs the same few bytes whatever the batch and shards.
    """

    seed: int  #: the fit's seed (the permutation's)
    start: int  #: the batch's first position in the data epoch's permutation
    stop: int  #: one past its last
    n_shards: int  #: the shards the batch is cut into
    n_blocks: int  #: the data's blocks (runs of consecutive examples), grouped into shards
    block_size: int  #: examples per block; 0: blocks of their own sizes (a dask collection's partitions)
    ahead_size: int  #: the next batches' size (0: nothing to load ahead)
    ahead_batches: int  #: how many of them
    shards: np.ndarray  #: int64: every shard the member holds

    def layout(self) -> tuple[int, ...]:
        """What stays the same from batch to batch until the data is placed again."""
        return (int(self.seed), int(self.n_shards), int(self.n_blocks), int(self.block_size),
                int(self.ahead_batches), *np.asarray(self.shards, dtype=np.int64).tolist())

    def to_array(self, layout: bool = True) -> np.ndarray:
        """The plan as one int64 vector: start, stop and ahead size, then (``layout``) the :meth:`layout`.

        Examples
        --------
        >>> plan = BatchPlan(7, 10, 26, 4, 8, 16, 16, 2, np.array([1, 3]))
        >>> plan.to_array(layout=False).tolist()
        [10, 26, 16]
        >>> BatchPlan.from_array(plan.to_array(layout=False), plan.layout()) == plan
        True
        """
        values = [self.start, self.stop, self.ahead_size, *(self.layout() if layout else ())]
        return np.array(values, dtype=np.int64)

    @classmethod
    def from_array(cls, values: np.ndarray, layout: tuple[int, ...] | None = None) -> BatchPlan:
        """The plan :meth:`to_array` wrote; ``layout``: the one the member heard last, for a vector
        without its own.  ``ValueError`` on a vector that is not a plan, or has no layout."""
        values = np.asarray(values, dtype=np.int64).tolist()
        if len(values) > BATCH_VALUES:
            if len(values) < BATCH_VALUES + LAYOUT_VALUES:
                raise ValueError(f"a batch plan has 3 or at least 8 values, not {len(values)}")
            layout = tuple(values[BATCH_VALUES:])
        elif len(values) < BATCH_VALUES or layout is None:
            raise ValueError(f"a batch plan of {len(values)} values and no layout heard before")
        seed, n_shards, n_blocks, block_size, ahead_batches = layout[:LAYOUT_VALUES]
        start, stop, ahead_size = values[:BATCH_VALUES]
        return cls(seed, start, stop, n_shards, n_blocks, block_size, ahead_size, ahead_batches,
                   np.array(layout[LAYOUT_VALUES:], dtype=np.int64))

    def __eq__(self, other) -> bool:
        return isinstance(other, BatchPlan) and self.to_array().tolist() == other.to_array().tolist()

    def dropout_seeds(self, n_updates: int) -> np.ndarray:
        """Each of the member's shards' dropout seed in update ``n_updates`` (as the client's :func:`dropout_seed`)."""
        return np.array([dropout_seed(self.seed, n_updates, g) for g in self.shards.tolist()], dtype=np.int64)

    def indices(self, perm: np.ndarray, block_of, shard_of: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The member's examples in the batch, shard after shard (each in the batch's order), and
        the example count of each of its shards.

        ``perm``: the data epoch's permutation (:func:`epoch_permutation`); ``block_of(indices)``:
        the block of each index (-1 where it is not held here), used when blocks have their own
        sizes; ``shard_of``: each block's shard (None: :func:`shard_of_blocks`; streamed data:
        :meth:`StreamOrder.shard_of` of the data epoch).
        """
        idx = perm[self.start : self.stop]
        if self.block_size:
            block = idx // self.block_size
        else:
            block = np.asarray(block_of(idx), dtype=np.int64)
        held = block >= 0
        shard = np.full(len(idx), -1, dtype=np.int64)
        shard[held] = (shard_of_blocks(self.n_blocks, self.n_shards) if shard_of is None else shard_of)[block[held]]
        mine = [idx[shard == g] for g in self.shards.tolist()]
        counts = np.array([len(m) for m in mine], dtype=np.int64)
        return (np.concatenate(mine) if mine else idx[:0]), counts

    def ahead(self, n: int, data_epoch: int, perm: np.ndarray | None = None) -> np.ndarray:
        """The keys of the next batches' examples in this member's shards (uniform blocks only)."""
        if not self.ahead_size or not self.block_size:
            return np.zeros(0, dtype=np.int64)
        position, epoch = (self.stop, data_epoch) if self.stop < n else (0, data_epoch + 1)
        keys = next_keys(self.seed, n, epoch, position, self.ahead_size, self.ahead_batches,
                         perm if epoch == data_epoch else None)[:n]
        shard = shard_of_blocks(self.n_blocks, self.n_shards)[(keys % n) // self.block_size]
        return keys[np.isin(shard, self.shards)]


#: Blocks per window of the streamed order (dask config ``adadamp.stream.window``).
WINDOW = 8


@dataclasses.dataclass(frozen=True)
class StreamOrder:
    """The streamed order of a fit seeded ``seed`` over blocks of ``lengths`` examples
    (:mod:`adadamp.data.streaming`: a permutation of the blocks cut into windows of ``window``,
    each window's examples shuffled together), the same on the client and on the all-reduce
    members, which find their examples of a batch from it.

    Examples
    --------
    >>> order = StreamOrder(0, (3, 3, 2, 2), window=2)
    >>> perm = order.permutation(0)
    >>> sorted(perm.tolist()) == list(range(10))  # every example once
    True
    >>> [sorted(set(order.block_of(perm[:5]).tolist())) == sorted(order.windows(0)[0]) for _ in "x"]
    [True]
    >>> order.shard_of(0, 2).tolist().count(0), order.shard_of(0, 2).tolist().count(1)  # two blocks each
    (2, 2)
    """

    seed: int
    lengths: tuple[int, ...]
    window: int = WINDOW

    def __post_init__(self):
        object.__setattr__(self, "lengths", tuple(int(n) for n in self.lengths))  # a list, as it crossed the RPC

    @functools.cached_property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)

    @property
    def n_blocks(self) -> int:
        return len(self.lengths)

    def block_order(self, epoch: int) -> np.ndarray:
        """The blocks of data epoch ``epoch`` in the order it visits them."""
        return np.random.default_rng([self.seed, epoch, 1]).permutation(self.n_blocks)

    def windows(self, epoch: int) -> list[list[int]]:
        """The blocks of each window of ``epoch``, in order."""
        order = self.block_order(epoch).tolist()
        return [order[i : i + self.window] for i in range(0, len(order), self.window)]

    def permutation(self, epoch: int) -> np.ndarray:
        """The examples of data epoch ``epoch`` in order: each window's examples shuffled together."""
        parts = []
        for k, blocks in enumerate(self.windows(epoch)):
            idx = np.concatenate([np.arange(self.starts[b], self.starts[b] + self.lengths[b]) for b in blocks])
            parts.append(np.random.default_rng([self.seed, epoch, 2, k]).permutation(idx))
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def shard_of(self, epoch: int, n_shards: int) -> np.ndarray:
        """The shard of each block in ``epoch``: its place in the block order modulo ``n_shards``."""
        shard = np.empty(self.n_blocks, dtype=np.int64)
        shard[self.block_order(epoch)] = np.arange(self.n_blocks, dtype=np.int64) % max(1, n_shards)
        return shard

    def block_of(self, idx: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, np.asarray(idx, dtype=np.int64), side="right") - 1

    def window_of(self, epoch: int) -> np.ndarray:
        """The window of each block in ``epoch``."""
        where = np.empty(self.n_blocks, dtype=np.int64)
        where[self.block_order(epoch)] = np.arange(self.n_blocks, dtype=np.int64) // self.window
        return where

    def needed(self, epoch: int, idx: np.ndarray) -> tuple[list[int], tuple[int, list[int]]]:
        """The blocks of the windows a batch ``idx`` of ``epoch`` draws from, and the next window
        after them as ``(its epoch, its blocks)`` (the first of the next epoch after the last)."""
        windows = self.windows(epoch)
        used = sorted(set(self.window_of(epoch)[self.block_of(idx)].tolist())) if len(idx) else [0]
        now = [b for k in used for b in windows[k]]
        last = used[-1]
        nxt = (epoch, windows[last + 1]) if last + 1 < len(windows) else (epoch + 1, self.windows(epoch + 1)[0])
        return now, nxt
