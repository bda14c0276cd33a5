"""A dask collection bigger than the workers' memory, streamed through them a few blocks at a time.

The order of data epoch ``e`` (:class:`~adadamp.wire.batches.StreamOrder`), seeded by the fit's seed and ``e`` alone,
so it is the same on any number of workers and after any loss:

1. the blocks (the collection's partitions along axis 0) in a random order;
2. that order cut into windows of ``window`` consecutive blocks;
3. the examples of each window shuffled together; the epoch is the windows one after another.

Every example comes once per epoch.  The statistical cost against a full shuffle: the examples of
a batch come from the ``window`` blocks of its window rather than from the whole data set, so
blocks that are not alike (data sorted by a label or by time) give batches less varied than a full
shuffle's; a larger window (dask config ``adadamp.stream.window``) costs memory, not time.  This
is PyTorch's ``DataLoader`` over a sharded dataset with a shuffle buffer, made exact and seeded.

Each block's shard in epoch ``e`` is its place in the block order modulo the number of shards, so
a window's blocks spread evenly over the shards and the workers holding them.  A worker holds the
blocks of its shards in the windows of the current batch and in the next window (read ahead while
the current one trains): three windows at most, for a batch smaller than a window; a block is computed from its lineage on the worker that trains on it
(:func:`adadamp.worker.plugin.stream_block`), so a lost worker's blocks are simply computed again
where its shards go.  Pure but for :class:`StreamedDaskData`'s task submission.
"""

from __future__ import annotations

import logging

import cloudpickle
import dask
import dask.core
import numpy as np
from dask.base import tokenize
from dask.optimization import cull
from distributed import Client, Future

from ..records import BlockMove
from ..wire.batches import WINDOW, StreamOrder
from ..wire.lost import LOST
from ..worker.plugin import stream_block
from .placement import Placement
from .sources import DataSource, Transport, _data_call, _lost_ones, wait_for_tasks

logger = logging.getLogger(__name__)

#: The windows a worker holds blocks of at most (a batch smaller than a window): the one or two
#: the current batch draws from (it may straddle two) and the next.
WINDOWS_HELD = 3


def window() -> int:
    """The blocks per window of the streamed order (dask config ``adadamp.stream.window``)."""
    value = dask.config.get("adadamp.stream.window", WINDOW)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"dask config adadamp.stream.window={value!r}: give a whole number of blocks >= 1.")
    return value


class StreamedDaskData(DataSource):
    """A dask array ``X`` and its targets ``y`` (lazy, chunked along axis 0 alike) that stay where
    they live: each block is computed on the worker that trains on it when its window comes, and
    dropped when the window has passed.  Nothing is persisted; the client holds each block's
    graph (culled, pickled once) and which worker holds which block."""

    def __init__(self, client: Client, X, y, window: int = WINDOW):
        self.client, self.X, self.y = client, X, y
        self.lengths = [int(n) for n in X.chunks[0]]
        self.window = window
        self._graphs: dict[int, bytes] = {}
        self._tasks: dict | None = None  # the whole graph of X and y, optimized
        self._keys: tuple[list, list] = ([], [])  # each block's key in X and in y
        self.loaded: dict[str, set[int]] = {}  # worker -> the blocks it holds
        self.pending: dict[tuple[str, int], Future] = {}  # (worker, block) -> its loading task

    def __len__(self) -> int:
        return int(sum(self.lengths))

    def token(self) -> str:
        return tokenize(self.X, self.y, "streamed", self.window)

    def order(self, seed: int) -> StreamOrder:
        return StreamOrder(int(seed), tuple(self.lengths), self.window)

    def placement(self, n_blocks: int = 256) -> Placement:
        return Placement(len(self), lengths=self.lengths)

    def bytes_per_example(self) -> None:
        """None: the blocks come and go with their windows (:data:`WINDOWS_HELD` of them at most)."""
        return

    def move(self, transport: Transport, placement: Placement, add: dict, drop: dict, timeout: float) -> dict:
        """Nothing moves when the shards do: :meth:`stage` computes the blocks where they are trained."""
        return {}

    def _graph(self, block: int) -> bytes:
        """Block ``block``'s inputs and targets as the tasks that make them and their two keys,
        pickled (made once from the whole graph, optimized and materialized once)."""
        if self._tasks is None:
            X, y = dask.optimize(self.X, self.y)
            self._tasks = {**dict(X.__dask_graph__()), **dict(y.__dask_graph__())}
            self._keys = (list(dask.core.flatten(X.__dask_keys__())), list(dask.core.flatten(y.__dask_keys__())))
        if block not in self._graphs:
            keys = [self._keys[0][block], self._keys[1][block]]
            tasks, _ = cull(self._tasks, keys)
            self._graphs[block] = cloudpickle.dumps((tasks, keys))
        return self._graphs[block]

    def stage(self, transport: Transport, placement: Placement, workers: list[str], epoch: int,
              idx: np.ndarray, timeout: float) -> None:
        """Before a round of batch ``idx`` (drawn in data epoch ``epoch``): the blocks of its
        windows computed on their holders (waited for), the next window's started, and the blocks
        of windows passed dropped.  A worker that left meanwhile is skipped: its request fails,
        and its shards' blocks are computed again where they go."""
        order: StreamOrder = placement.order
        now, (next_epoch, upcoming) = order.needed(epoch, idx)
        n_shards = placement.n_shards
        owner = {b: workers[placement.holder[placement.shard_of[b]]] for b in now}
        shard_next = order.shard_of(next_epoch, n_shards)
        ahead = {b: workers[placement.holder[shard_next[b]]] for b in upcoming}
        wanted: dict[str, set[int]] = {w: set() for w in workers}
        for b, w in [*owner.items(), *ahead.items()]:
            wanted[w].add(b)
        for w in [w for w in self.loaded if w not in wanted]:  # a worker that left the fit
            self.loaded.pop(w)
        for (w, b), f in list(self.pending.items()):
            if b not in wanted.get(w, ()):
                f.cancel()
                del self.pending[(w, b)]
        drops = {w: sorted(held - wanted[w]) for w, held in self.loaded.items() if held - wanted[w]}
        if drops:
            calls = [_data_call(w, BlockMove(transport.fit_id, [], blocks)) for w, blocks in drops.items()]
            _lost_ones(calls, transport.call_all(calls, timeout=timeout))
            for w, blocks in drops.items():
                self.loaded[w] -= set(blocks)
        for b, w in [*owner.items(), *ahead.items()]:
            if b in self.loaded.get(w, ()) or (w, b) in self.pending:
                continue
            self.pending[(w, b)] = self.client.submit(
                stream_block, transport.fit_id, b, int(order.starts[b]), self._graph(b),
                workers=[w], allow_other_workers=False, pure=False,
                priority=1 if b in owner else 0,
            )
        wait_for_tasks(self.client, [(w, self.pending[(w, b)]) for b, w in owner.items() if (w, b) in self.pending],
                       timeout)
        self._collect()

    def _collect(self) -> None:
        """Move the finished loads into ``loaded``; raise a load's error (a lost worker's excepted)."""
        for (w, b), f in list(self.pending.items()):
            if f.status == "finished":
                self.loaded.setdefault(w, set()).add(b)
            elif f.status == "error":
                err = f.exception()
                if not isinstance(err, LOST):
                    self.release()
                    raise err
            else:
                continue
            f.release()
            del self.pending[(w, b)]

    def release(self) -> None:
        """Cancel the loads still running; the workers drop their blocks with the fit."""
        for f in self.pending.values():
            f.cancel()
        self.pending.clear()
        self.loaded.clear()
