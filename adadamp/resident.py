"""The examples a worker holds for one fit, and gathering a share of an update from them.

Blocks come three ways.  Blocks the client sends are owned by the fit: they are kept concatenated
in one array, so a share is one ``index_select``.  A worker on the client's machine maps the
client's whole training data from shared memory instead (:mod:`adadamp.shm`): placing a block
on it sends only the block's number, and a share is again one ``index_select``.  Blocks that are a dask collection's persisted
partitions are borrowed: Dask already holds each partition in this worker's memory, so the fit
keeps a view of it rather than a second copy (each example is held once), and a share is
gathered partition by partition.  Runs on the workers.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import torch

ABSENT = -1  # an example this worker does not hold
OWNED = -2  # the segment of the blocks the client sent
SHARED = -3  # the client's whole training data, mapped from shared memory (this worker uses its blocks)


class ResidentData:
    """The examples of a fit on one worker, on ``device``, indexed by their global index.

    Examples
    --------
    >>> data = ResidentData(n_total=6, device=torch.device("cpu"))
    >>> data.update([(0, np.arange(0, 3), np.zeros((3, 2), np.float32), np.arange(3))], [])
    >>> data.update([(1, np.arange(3, 6), np.ones((3, 2), np.float32), np.arange(3, 6))], [], borrowed=True)
    >>> X, y = data.gather(np.array([4, 1]))
    >>> X[:, 0].tolist(), y.tolist(), sorted(data.block_index)
    ([0.0, 1.0], [1, 4], [0, 1])
    """

    def __init__(self, n_total: int, device: torch.device):
        self.device = device
        self.block_index: dict[int, np.ndarray] = {}  # block -> its global indices
        self._segment_of_block: dict[int, int] = {}  # block -> OWNED, or the block itself (borrowed)
        self._segments: dict[int, tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]] = {}
        self._segment = np.full(n_total, ABSENT, dtype=np.int64)  # global index -> segment
        self._row = np.zeros(n_total, dtype=np.int64)  # global index -> row in its segment

    @property
    def shared(self) -> bool:
        """Whether the client's training data is mapped here (blocks then come without data)."""
        return SHARED in self._segments

    def share(self, X: np.ndarray, y: np.ndarray) -> None:
        """The client's whole training data, mapped read-only; blocks placed later are views of it."""
        with warnings.catch_warnings():  # read-only: nothing here writes to it
            warnings.simplefilter("ignore", UserWarning)
            self._segments[SHARED] = (X, y, torch.from_numpy(X), torch.from_numpy(y))

    def update(self, add, drop, borrowed: bool = False) -> None:
        """Add blocks ``[(block, global_idx, X, y)]`` and drop block ids.

        ``borrowed``: the arrays are held by Dask on this worker already; keep views, not copies.
        """
        drop = set(drop)
        if self.shared and all(X is None for _, _, X, _ in add):  # blocks of the mapped data: indices only
            self._update_shared(add, drop)
            return
        owned_kept = [b for b, s in self._segment_of_block.items() if s == OWNED and b not in drop]
        rebuild = (add and not borrowed) or any(self._segment_of_block.get(b) == OWNED for b in drop)
        kept_rows = [self._row[self.block_index[b]] for b in owned_kept] if rebuild else []
        for b in drop:
            segment = self._segment_of_block.pop(b, None)
            idx = self.block_index.pop(b, None)
            if segment is not None and segment != OWNED:
                del self._segments[segment]
            if idx is not None:
                self._segment[idx] = ABSENT
        if borrowed:
            for block, idx, X, y in add:
                self._set(block, X, y, idx)
                self.block_index[block] = idx
                self._segment_of_block[block] = block
        if rebuild:
            self._rebuild_owned(owned_kept, kept_rows, [] if borrowed else add)

    def _update_shared(self, add, drop) -> None:
        for b in drop:
            self._segment_of_block.pop(b, None)
            idx = self.block_index.pop(b, None)
            if idx is not None:
                self._segment[idx] = ABSENT
        for block, idx, _, _ in add:
            self.block_index[block] = idx
            self._segment_of_block[block] = SHARED
            self._segment[idx] = SHARED
            self._row[idx] = idx

    def _rebuild_owned(self, kept: list[int], kept_rows: list[np.ndarray], add) -> None:
        """One array of the owned blocks kept and added (one copy: the old one is dropped)."""
        old = self._segments.pop(OWNED, None)
        parts_X, parts_y, parts_idx = [], [], []
        if old is not None and kept:
            rows = np.concatenate(kept_rows)
            parts_X.append(old[0][rows])
            parts_y.append(old[1][rows])
            parts_idx.extend(self.block_index[b] for b in kept)
        for block, idx, X, y in add:
            self.block_index[block] = idx
            self._segment_of_block[block] = OWNED
            parts_X.append(X)
            parts_y.append(y)
            parts_idx.append(idx)
        if parts_X:
            self._set(OWNED, np.concatenate(parts_X), np.concatenate(parts_y), np.concatenate(parts_idx))

    def _set(self, segment: int, X: np.ndarray, y: np.ndarray, idx: np.ndarray) -> None:
        with warnings.catch_warnings():  # Dask's partitions may be read-only; nothing here writes to them
            warnings.simplefilter("ignore", UserWarning)
            X_dev = torch.from_numpy(X).to(self.device)
            y_dev = torch.from_numpy(y).to(self.device)
        self._segments[segment] = (X, y, X_dev, y_dev)
        self._segment[idx] = segment
        self._row[idx] = np.arange(len(idx))

    def gather(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs and targets of ``indices`` on the device (in the indices' order when they are
        in one segment, else segment by segment)."""
        indices = np.asarray(indices)
        segments = self._segment[indices]
        if (segments == ABSENT).any():
            missing = indices[segments == ABSENT][:5]
            raise KeyError(f"examples {missing.tolist()} are not resident on this worker")
        rows = self._row[indices]
        if len(indices) == 0:
            some = next(iter(self._segments.values()))
            return some[2][:0], some[3][:0]
        if (segments == segments[0]).all():  # one segment: one index_select
            _, _, X_dev, y_dev = self._segments[int(segments[0])]
            rows_t = torch.from_numpy(rows).to(self.device)
            return X_dev.index_select(0, rows_t), y_dev.index_select(0, rows_t)
        # Several segments: one index_select per segment, the share in segment order (a fixed order
        # for the same placement; only the float summation order differs from the indices' order).
        order = np.argsort(segments, kind="stable")
        by_segment = segments[order]
        cuts = [0, *(np.flatnonzero(by_segment[1:] != by_segment[:-1]) + 1).tolist(), len(order)]
        rows_t = torch.from_numpy(rows[order]).to(self.device)
        parts_X, parts_y = [], []
        for a, b in itertools.pairwise(cuts):
            _, _, X_dev, y_dev = self._segments[int(by_segment[a])]
            parts_X.append(X_dev.index_select(0, rows_t[a:b]))
            parts_y.append(y_dev.index_select(0, rows_t[a:b]))
        return torch.cat(parts_X), torch.cat(parts_y)
