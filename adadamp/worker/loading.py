"""Reading a map-style torch Dataset on the workers, example by example, ahead of the compute.

A lazy Dataset (files on disk, an ImageFolder-like class with random transforms) is shipped to
each worker once per fit; a worker calls ``dataset[i]`` only for the examples of its share of an
update, so the client never reads an example.  The client names the examples of the worker's
next share with each request, and a small thread pool per worker (``dataset_threads``, in the
spirit of ``DataLoader(num_workers=...)``) loads them while this share is computed.

Random transforms draw from the process-wide generators of torch, NumPy and ``random``; each
``dataset[i]`` runs with all three seeded from ``(seed, epoch, i)``, so an example's augmentation
differs every epoch, does not depend on which worker loads it, and a fit is reproducible.  Those
generators are shared by every thread of the process, so a seeded load holds the process's
generator lock (:func:`adadamp.wire.seeding.seeded`) for the whole ``__getitem__`` call: seeded loads
run one at a time, and give way to a forward pass that draws random numbers (dropout).  A Dataset without random transforms may set
``dataset_cache=True``: its loads then run in parallel without seeding, and every example is
kept in the worker's memory after its first read.

This module runs on the workers (and on the client for the two-example shape check).
"""

from __future__ import annotations

import collections
import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..exceptions import DatasetError
from ..wire.seeding import seeded

__all__ = ["DatasetError", "ExampleLoader", "example_seed", "read_examples"]

#: Examples loaded ahead and not yet asked for, kept per worker at most (older ones are dropped).
MAX_PENDING = 1 << 16


def example_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of example ``index``'s random transforms in data epoch ``epoch``.

    Examples
    --------
    >>> example_seed(0, 1, 5) == example_seed(0, 1, 5) != example_seed(0, 2, 5)
    True
    """
    # Python's int before the shift: NumPy 1.x has no ``uint64 >> int`` (no common integer type)
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, dtype=np.uint64)[0]) >> 1


def _read(dataset, index: int, seed: int | None, encode, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``dataset[index]`` as float32 inputs and encoded targets (with the generators seeded by ``seed``)."""
    try:
        if seed is None:
            item = dataset[index]
        else:
            with seeded(seed, background=True):  # torch's generator, under the process's generator lock
                np_state, py_state = np.random.get_state(), random.getstate()
                np.random.seed(seed % 2**32)
                random.seed(seed)
                try:
                    item = dataset[index]
                finally:
                    np.random.set_state(np_state)
                    random.setstate(py_state)
        x, y = item
    except Exception as err:
        raise DatasetError(f"dataset[{index}] raised on {where}: {type(err).__name__}: {err}") from err
    return np.asarray(x, dtype=np.float32), encode(np.asarray(y))


def read_examples(dataset, start: int, stop: int, encode=np.asarray, where: str = "a worker"):
    """Examples ``start`` to ``stop`` of ``dataset`` as arrays ``(X, y)``, each seeded as in epoch 0
    of seed 0 (inference: the same transforms on every call)."""
    pairs = [_read(dataset, i, example_seed(0, 0, i), encode, where) for i in range(start, stop)]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


class ExampleLoader:
    """Loads a worker's examples of ``dataset`` with ``threads`` threads, ahead of when they are needed.

    ``encode(y)`` turns a target into what the criterion takes (class indices, float32);
    ``cache=True`` keeps every example after its first read and loads without seeding (only for
    Datasets without random transforms); ``where`` names the worker in errors.
    """

    def __init__(self, dataset, seed: int, encode, threads: int = 2, cache: bool = False, where: str = "a worker"):
        self.dataset = dataset
        self.seed = seed
        self.encode = encode
        self.cache = bool(cache)  # the futures of the examples read are kept: they are the cache
        self.where = where
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(threads)), thread_name_prefix="adadamp-load")
        self._pending: collections.OrderedDict[tuple[int, int], Future] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _load(self, epoch: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        seed = None if self.cache else example_seed(self.seed, epoch, index)
        return _read(self.dataset, index, seed, self.encode, self.where)

    def _future(self, epoch: int, index: int) -> Future:
        key = (0 if self.cache else epoch, index)  # cached examples are the same every epoch
        future = self._pending.get(key)
        if future is None:
            future = self._pending[key] = self._pool.submit(self._load, epoch, index)
        return future

    def prefetch(self, keys) -> None:
        """Start loading the examples ``keys`` (``data_epoch * len(dataset) + index``: the next
        requests ask for them)."""
        n = len(self.dataset)
        with self._lock:
            for key in np.asarray(keys).tolist():
                self._future(key // n, key % n)
            while not self.cache and len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)[1].cancel()

    def load(self, epoch: int, indices, ahead=()) -> tuple[np.ndarray, np.ndarray]:
        """The examples ``indices`` of data epoch ``epoch`` as ``(X, y)``, waiting for those still
        loading; the ``ahead`` examples (keys, as :meth:`prefetch`) are queued behind them."""
        with self._lock:
            indices = np.asarray(indices).tolist()
            futures = [self._future(epoch, i) for i in indices]
            if not self.cache:  # cached: the future stays, so an example is read once per worker
                for i in indices:
                    self._pending.pop((epoch, i), None)
        if len(ahead):
            self.prefetch(ahead)
        pairs = [f.result() for f in futures]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])

    def close(self) -> None:
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def float_targets(y: np.ndarray) -> np.ndarray:
    """One example's regression target as a float32 row (a number becomes one column)."""
    return np.asarray(y, dtype=np.float32).reshape(-1)
