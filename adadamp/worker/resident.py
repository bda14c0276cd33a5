"""The examples a worker holds for one fit, and gathering a share of an update from them.

Blocks come three ways.  Blocks the client sends are owned by the fit: they are kept concatenated
in one array, so a share is one ``index_select``.  A worker on the client's machine maps the
client's whole training data from shared memory instead (:mod:`adadamp.wire.shm`): it reads any
example there, so no block is placed on it, and a share is again one ``index_select``.  Blocks that are a dask collection's persisted
partitions are borrowed: Dask already holds each partition in this worker's memory, so the fit
keeps a view of it rather than a second copy (each example is held once), and a share is
gathered partition by partition.  Runs on the workers.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import torch

from ..records import Block

OWNED = -2  # the segment of the blocks the client sent
SHARED = -3  # the client's whole training data, mapped from shared memory (any example is read there)


class ResidentData:
    """The examples of a fit on one worker, on ``device``, indexed by their global index.

    A block is a run of consecutive examples; the index holds per block its first example, its
    segment and its first row there, so it grows with the blocks this worker holds, not with the
    ``n_total`` examples of the data set (a global index is found by binary search over the
    blocks' starts).

    Examples
    --------
    >>> data = ResidentData(n_total=6, device=torch.device("cpu"))
    >>> data.update([Block(0, np.arange(0, 3), np.zeros((3, 2), np.float32), np.arange(3))], [])
    >>> data.update([Block(1, np.arange(3, 6), np.ones((3, 2), np.float32), np.arange(3, 6))], [], borrowed=True)
    >>> X, y = data.gather(np.array([4, 1]))
    >>> X[:, 0].tolist(), y.tolist(), sorted(data.block_index)
    ([1.0, 0.0], [4, 1], [0, 1])
    """

    def __init__(self, n_total: int, device: torch.device):
        self.device = device
        self.n_total = int(n_total)
        self._blocks: dict[int, tuple[range, int, int]] = {}  # block -> (its examples, segment, first row)
        self._segments: dict[int, tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]] = {}
        self._reindex()

    @property
    def block_index(self) -> dict[int, range]:
        """The blocks held here and their global indices."""
        return {b: span for b, (span, _, _) in self._blocks.items()}

    @property
    def shared(self) -> bool:
        """Whether the client's training data is mapped here (blocks then come without data)."""
        return SHARED in self._segments

    def share(self, X: np.ndarray, y: np.ndarray) -> None:
        """The client's whole training data, mapped read-only; blocks placed later are views of it."""
        with warnings.catch_warnings():  # read-only: nothing here writes to it
            warnings.simplefilter("ignore", UserWarning)
            self._segments[SHARED] = (X, y, torch.from_numpy(X), torch.from_numpy(y))

    def update(self, add: list[Block], drop: list[int], borrowed: bool = False) -> None:
        """Add blocks and drop block numbers.

        ``borrowed``: the arrays are held by Dask on this worker already; keep views, not copies.
        A block's indices must be consecutive (``ValueError`` otherwise).
        """
        drop = set(drop)
        add = [(b.block, self._span(b.indices), b.X, b.y) for b in add]
        owned_kept = [b for b, (_, s, _) in self._blocks.items() if s == OWNED and b not in drop]
        rebuild = bool(add and not borrowed) or any(self._blocks.get(b, (None, None))[1] == OWNED for b in drop)
        for b in drop:
            _, segment, _ = self._blocks.pop(b, (None, None, None))
            if segment is not None and segment >= 0:  # a borrowed block is its own segment
                del self._segments[segment]
        if borrowed:
            for block, span, X, y in add:
                self._set(block, X, y)
                self._blocks[block] = (span, block, 0)
        if rebuild:
            self._rebuild_owned(owned_kept, [] if borrowed else add)
        self._reindex()

    def _span(self, idx) -> range:
        idx = np.asarray(idx, dtype=np.int64)
        start = int(idx[0]) if len(idx) else 0
        span = range(start, start + len(idx))
        if start < 0 or span.stop > self.n_total or not np.array_equal(idx, np.arange(span.start, span.stop)):
            raise ValueError(f"a block's examples must be consecutive indices in [0, {self.n_total})")
        return span

    def _rebuild_owned(self, kept: list[int], add) -> None:
        """One array of the owned blocks kept and added (one copy: the old one is dropped)."""
        old = self._segments.pop(OWNED, None)
        parts_X, parts_y, placed = [], [], []
        if old is not None and kept:
            for b in kept:
                span, _, row = self._blocks[b]
                parts_X.append(old[0][row : row + len(span)])
                parts_y.append(old[1][row : row + len(span)])
                placed.append((b, span))
        for block, span, X, y in add:
            parts_X.append(X)
            parts_y.append(y)
            placed.append((block, span))
        row = 0
        for block, span in placed:
            self._blocks[block] = (span, OWNED, row)
            row += len(span)
        if parts_X:
            self._set(OWNED, np.concatenate(parts_X), np.concatenate(parts_y))

    def _set(self, segment: int, X: np.ndarray, y: np.ndarray) -> None:
        with warnings.catch_warnings():  # Dask's partitions may be read-only; nothing here writes to them
            warnings.simplefilter("ignore", UserWarning)
            X_dev = torch.from_numpy(X).to(self.device)
            y_dev = torch.from_numpy(y).to(self.device)
        self._segments[segment] = (X, y, X_dev, y_dev)

    def _reindex(self) -> None:
        """The blocks' starts, in order, with each one's end, segment and first row (for :meth:`gather`)."""
        held = sorted((span.start, span.stop, segment, row, b) for b, (span, segment, row) in self._blocks.items() if span)
        self._starts, self._stops, self._segment_of, self._first_row, self._block_ids = (
            np.array(column, dtype=np.int64) for column in (zip(*held) if held else ([], [], [], [], []))
        )

    def block_of(self, indices: np.ndarray) -> np.ndarray:
        """The block of each global index, -1 where it is not held here."""
        indices = np.asarray(indices, dtype=np.int64)
        if not len(self._starts):
            return np.full(len(indices), -1, dtype=np.int64)
        pos = np.searchsorted(self._starts, indices, side="right") - 1
        inside = (pos >= 0) & (indices < self._stops[np.maximum(pos, 0)])
        return np.where(inside, self._block_ids[np.maximum(pos, 0)], -1)

    def gather(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs and targets of ``indices`` on the device, in the indices' order.

        Several segments (borrowed partitions, owned blocks): one ``index_select`` per segment, then
        the rows put back in the indices' order, so a share's gradient sums in the same order on
        any worker, however that worker came to hold the blocks."""
        indices = np.asarray(indices, dtype=np.int64)
        if self.shared:  # the client's whole data is mapped here: any example, by its index
            if len(indices) and (indices.min() < 0 or indices.max() >= self.n_total):
                raise KeyError(f"examples outside [0, {self.n_total}) asked of the mapped data")
            _, _, X, y = self._segments[SHARED]
            rows_t = torch.from_numpy(indices)
            return X.index_select(0, rows_t).to(self.device), y.index_select(0, rows_t).to(self.device)
        pos = np.searchsorted(self._starts, indices, side="right") - 1  # the block each one falls in
        absent = pos < 0
        pos[absent] = 0
        if len(self._starts):
            absent |= indices >= self._stops[pos]
        else:
            absent[:] = True
        if absent.any():
            raise KeyError(f"examples {indices[absent][:5].tolist()} are not resident on this worker")
        segments = self._segment_of[pos]
        rows = self._first_row[pos] + indices - self._starts[pos]
        if len(indices) == 0:
            some = next(iter(self._segments.values()))
            return some[2][:0], some[3][:0]
        if (segments == segments[0]).all():  # one segment: one index_select
            _, _, X_dev, y_dev = self._segments[int(segments[0])]
            rows_t = torch.from_numpy(rows).to(self.device)
            return X_dev.index_select(0, rows_t), y_dev.index_select(0, rows_t)
        order = np.argsort(segments, kind="stable")
        by_segment = segments[order]
        cuts = [0, *(np.flatnonzero(by_segment[1:] != by_segment[:-1]) + 1).tolist(), len(order)]
        rows_t = torch.from_numpy(rows[order]).to(self.device)
        parts_X, parts_y = [], []
        for a, b in itertools.pairwise(cuts):
            _, _, X_dev, y_dev = self._segments[int(by_segment[a])]
            parts_X.append(X_dev.index_select(0, rows_t[a:b]))
            parts_y.append(y_dev.index_select(0, rows_t[a:b]))
        back = torch.from_numpy(np.argsort(order, kind="stable")).to(self.device)  # segment order -> indices' order
        return torch.cat(parts_X).index_select(0, back), torch.cat(parts_y).index_select(0, back)
