"""The training data a fit places on its workers, behind one small interface.

A data source knows how many examples it has, how they are cut into blocks, where Dask already
holds each block, and how to move blocks to workers:

* :class:`ArrayData`: NumPy arrays held by the client; a block is sent from the client whenever
  it is placed (again), so a lost worker's blocks come back from the client's copy.  Workers on
  the client's machine map one shared copy instead and receive only block numbers.
* :class:`DaskArrayData`: a dask array's persisted partitions are the blocks; the client holds
  only their keys and lengths.  A block is placed by a task on the receiving worker that takes
  the partition as input, so Dask moves it between workers, or recomputes it from its lineage
  when the worker that held it died; nothing passes through the client.
* :class:`DatasetData`: a map-style torch Dataset, shipped to every worker at set-up and read
  there example by example (:mod:`adadamp.worker.loading`); a block is only a range of examples its
  owner reads, so placing one moves nothing.

Each source also says what the workers need, so that a backend never asks which class it holds:
:meth:`shared_arrays` (the arrays workers on the client's host map from shared memory),
:meth:`setup_payload` (what every worker's set-up receives), :meth:`bytes_per_example` (what a
placed example costs a worker's memory; None: nothing is held) and ``reads_ahead`` (whether
workers read a batch's examples when asked, so the next batches are worth announcing).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Protocol

import cloudpickle
import numpy as np
from dask.base import tokenize
from distributed import Client, Future, futures_of, wait

from ..records import Block, BlockMove
from ..wire.identity import scheduler_info
from ..wire.lost import LOST
from ..wire.rpc import rpc_call
from ..worker.plugin import load_block
from .digest import data_digest
from .placement import Placement

PLACEMENT_LOOK = 0.5  # seconds between looks at whether the workers a placement waits for are alive

logger = logging.getLogger(__name__)


class Transport(Protocol):
    """What a source needs of the engine's transport to move blocks (the engine's ``Transport``)."""

    fit_id: str
    shared: object | None  # the fit's shared memory; ``maps_data``: the workers that map the data

    def call_all(self, calls: list, timeout: float | None = None) -> list: ...


class DataSource:
    """What every source answers; the defaults suit a source whose blocks are placed on the workers.

    ``X, y`` are the data's arrays (or what identifies it); ``reads_ahead``: the workers read a
    batch's examples when asked, so the engine announces the next batches.
    """

    X: object
    y: object
    reads_ahead = False

    def __len__(self) -> int:
        raise NotImplementedError

    def token(self) -> str:
        """What identifies the data between calls (the workers keep data placed for the same token)."""
        raise NotImplementedError

    def move(self, transport: Transport, placement: Placement, add: dict, drop: dict, timeout: float) -> dict:
        """Give each worker of ``add`` its new blocks and take back those of ``drop``; returns
        ``{worker: error}`` for the workers lost meanwhile (other errors raise)."""
        raise NotImplementedError

    def placement(self, n_blocks: int = 256) -> Placement:
        """The data cut into ``n_blocks`` blocks of equal size."""
        return Placement(len(self), n_blocks)

    def preferred(self, placement: Placement) -> list[str | None] | None:
        """Where each block already is (None: nowhere yet)."""
        return None

    def shared_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The arrays workers on the client's host map from shared memory (None: no such arrays)."""
        return None

    def setup_payload(self, seed: int) -> bytes | None:
        """What every worker's set-up receives besides the module (None: nothing; blocks come when placed)."""
        return None

    def bytes_per_example(self) -> int | None:
        """What one placed example costs a worker's memory (None: nothing is held)."""
        return sum(math.prod(a.shape[1:]) * np.dtype(a.dtype).itemsize for a in (self.X, self.y))

    def release(self) -> None:
        """Let go of what the source holds on the cluster, once no backend uses it (nothing here)."""

    def order(self, seed: int):
        """The order of a streamed source's epochs (:class:`~adadamp.wire.batches.StreamOrder`);
        None: one seeded permutation of all the examples per epoch."""
        return

    def stage(self, transport: Transport, placement: Placement, workers: list[str], epoch: int,
              idx: np.ndarray, timeout: float) -> None:
        """Before a round of batch ``idx``: the blocks it needs where it is computed (a streamed
        source's; the others are placed already)."""


class ArrayData(DataSource):
    """NumPy ``X, y`` held by the client.

    Examples
    --------
    >>> data = ArrayData(np.arange(10.0).reshape(5, 2), np.arange(5))
    >>> index, X, y = data.rows(range(3, 5))
    >>> index.tolist(), y.tolist(), len(data)
    ([3, 4], [3, 4], 5)
    """

    def __init__(self, X: np.ndarray, y: np.ndarray):
        self.X = X
        self.y = y

    def __len__(self) -> int:
        return len(self.X)

    def token(self) -> str:
        """What identifies the data between calls: shapes, types and a hash of up to 4096 evenly
        spaced examples (an array refilled in place with other data gets another token)."""
        return data_digest(self.X, self.y)

    def shared_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The arrays themselves: workers on the client's host receive block numbers only."""
        return self.X, self.y

    def rows(self, rows: range) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The example indices, inputs and targets of ``rows``."""
        part = slice(rows.start, rows.stop)
        return np.arange(rows.start, rows.stop), self.X[part], self.y[part]

    def move(self, transport: Transport, placement: Placement, add: dict, drop: dict, timeout: float) -> dict:
        """Send each worker its new blocks and drop the ones it gave up; returns ``{worker: error}``
        for the workers lost meanwhile (other errors raise).  A worker that maps the whole data
        from shared memory (on the client's machine) reads any example there: nothing is sent to
        it, so a placement on such workers (a growth step, speed-based shares) costs no round."""
        calls = []
        mapped = transport.shared.maps_data if transport.shared is not None else set()
        for w, blocks_of_w in add.items():
            if w in mapped:
                continue
            blocks = [Block(b, *self.rows(placement.rows(b))) for b in blocks_of_w]
            if blocks or drop[w]:
                calls.append(_data_call(w, BlockMove(transport.fit_id, blocks, drop[w])))
        return _lost_ones(calls, transport.call_all(calls, timeout=timeout))


class DaskArrayData(DataSource):
    """A dask array ``X`` and its targets ``y``, persisted on the cluster, chunked along axis 0 only.

    ``X`` and ``y`` must have the same chunks along axis 0; each pair of partitions is a block.
    """

    def __init__(self, client: Client, X, y):
        self.client = client
        self.X, self.y = X, y
        self.lengths = [int(n) for n in X.chunks[0]]
        self.X_parts = _partition_futures(client, X)
        self.y_parts = _partition_futures(client, y)

    def __len__(self) -> int:
        return int(sum(self.lengths))

    def token(self) -> str:
        """Dask's deterministic token of ``X`` and ``y`` (the same graph: the same data)."""
        return tokenize(self.X, self.y)

    def placement(self, n_blocks: int = 256) -> Placement:
        return Placement(len(self), lengths=self.lengths)

    def preferred(self, placement: Placement) -> list[str | None]:
        """The worker that holds each block's inputs now (placing it there moves nothing)."""
        holders = self.client.who_has(self.X_parts)
        return [next(iter(holders.get(f.key, ())), None) for f in self.X_parts]

    def move(self, transport: Transport, placement: Placement, add: dict, drop: dict, timeout: float) -> dict:
        """Place each new block by a task on its worker; returns ``{worker: error}`` for the lost."""
        drops = [_data_call(w, BlockMove(transport.fit_id, [], drop[w])) for w in drop if drop[w]]
        failed = _lost_ones(drops, transport.call_all(drops, timeout=timeout))
        futures = []
        for w, blocks in add.items():
            for b in blocks:
                start = placement.rows(b).start
                future = self.client.submit(
                    load_block, transport.fit_id, b, start, self.X_parts[b], self.y_parts[b],
                    workers=[w], allow_other_workers=False, pure=False,
                )
                futures.append((w, future))
        wait_for_tasks(self.client, futures, timeout)
        try:
            for w, f in futures:
                if f.status == "finished":
                    continue
                if f.status == "error":
                    err = f.exception()
                    if not isinstance(err, LOST):
                        raise err
                    failed.setdefault(w, err)
                else:  # still waiting: its worker is gone (a task may only run there)
                    f.cancel()
                    failed.setdefault(w, TimeoutError(f"block {f} was not placed on {w} within {timeout} s"))
        finally:  # the blocks are placed (the worker keeps a view): a kept future would keep the lineage
            for _, f in futures:
                f.release()
        return failed

    def release(self) -> None:
        """Release the persisted partitions now, not when the garbage collector finds this source.

        A fit's backend is held in reference cycles, so its futures would keep the partitions
        and their lineage (the keys of the user's collection, as the fit's graph built them) on
        the scheduler after ``fit`` returned; a ``score`` or ``predict`` on the same collection
        then sent those keys again, built otherwise by Dask's graph optimization (fused: one
        task where the fit had two), and the scheduler logged ``Detected different run_spec``.
        """
        futures = [*self.X_parts, *self.y_parts, *futures_of(self.X), *futures_of(self.y)]
        self.X_parts, self.y_parts = [], []
        for f in futures:
            f.release()  # idempotent: each future is released once, whoever still refers to it


class DatasetData(DataSource):
    """A map-style torch Dataset of ``(x, y)`` pairs that the workers read themselves.

    ``loading`` holds the :class:`~adadamp.worker.loading.ExampleLoader` arguments besides the Dataset
    and the seed (``encode``, ``threads``, ``cache``).  The client never calls ``dataset[i]``.
    ``X, y`` identify the data for a checkpoint's fingerprint (a hash of the pickled Dataset).
    """

    reads_ahead = True

    def __init__(self, dataset, **loading):
        self.dataset = dataset
        self.n = len(dataset)
        self.loading = loading
        pickled = cloudpickle.dumps(dataset)
        self.X = np.frombuffer(hashlib.blake2b(pickled, digest_size=16).digest(), dtype=np.uint8)
        self.y = np.array([self.n])

    def token(self) -> str:
        """The pickled Dataset's hash and how it is loaded."""
        return bytes(self.X).hex() + hashlib.blake2b(cloudpickle.dumps(self.loading), digest_size=16).hexdigest()

    def payload(self, seed: int) -> bytes:
        """What a worker's set-up receives: the Dataset and how to load it, for a fit seeded ``seed``."""
        return cloudpickle.dumps({"dataset": self.dataset, "seed": seed, **self.loading})

    def setup_payload(self, seed: int) -> bytes:
        """The Dataset and how to load it (:meth:`payload`): every worker reads its own examples."""
        return self.payload(seed)

    def bytes_per_example(self) -> None:
        """None: read example by example, never held whole."""
        return

    def __len__(self) -> int:
        return self.n

    def move(self, transport: Transport, placement: Placement, add: dict, drop: dict, timeout: float) -> dict:
        """Nothing to move: every worker can read every example (its blocks say which it does)."""
        return {}


def wait_for_tasks(client: Client, futures: list[tuple[str, Future]], timeout: float) -> None:
    """Wait until the tasks of ``futures`` (each pinned to its worker) are done, ``timeout``
    passes, or every worker still waited for has left the scheduler (its task may run nowhere
    else: waiting longer is in vain)."""
    deadline = time.monotonic() + timeout
    pending = futures
    while pending and time.monotonic() < deadline:
        try:
            with client.as_current():  # wait() syncs through the current client
                wait([f for _, f in pending], timeout=max(0.01, min(PLACEMENT_LOOK, deadline - time.monotonic())))
        except TimeoutError:
            pass
        pending = [(w, f) for w, f in pending if f.status == "pending"]
        if pending:
            live = set(scheduler_info(client)["workers"])
            if not any(w in live for w, _ in pending):
                return


def _partition_futures(client: Client, collection) -> list[Future]:
    """The futures of a persisted dask array's partitions along axis 0, in order."""
    keys = list(_flat(collection.__dask_keys__()))  # nested lists of key tuples, axis 0 outermost
    futures = {f.key: f for f in client.futures_of(collection)}
    return [futures[k] for k in keys]


def _flat(keys):
    for k in keys:
        if isinstance(k, list):
            yield from _flat(k)
        else:
            yield k


def _data_call(worker: str, move: BlockMove) -> tuple[str, str, dict]:
    """The ``adadamp_data`` RPC of ``move`` (its blocks pickled: they hold arrays)."""
    return rpc_call(worker, "adadamp_data", move, serialized=("add",))


def _lost_ones(calls: list, replies: list) -> dict:
    failed = {}
    for (w, _, _), r in zip(calls, replies):
        if isinstance(r, BaseException) and not isinstance(r, LOST):
            raise r
        if isinstance(r, BaseException):
            failed[w] = r
    return failed
