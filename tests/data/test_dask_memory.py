"""Dask data that cannot fit in the workers' memory is refused before any task runs (it had stalled
the fit for 240 s at Dask's pause fraction, then failed with cancelled futures)."""

import time

import dask.array as da
import numpy as np
import pytest

from adadamp import DaskClassifier
from adadamp.data.memory import new_bytes, reaches_pause, stream_rows


def _prefixes(dask_scheduler) -> list[str]:
    return list(dask_scheduler.task_prefixes)


def test_data_bigger_than_the_workers_memory_is_refused_before_any_task(small_client):
    """1e8 x 2 float32 and their int64 labels (1.49 GiB), generated lazily, on 2 workers of 1 GiB:
    more than 60 % of their memory even before anything else is in it."""
    X = da.random.RandomState(0).random_sample((100_000_000, 2), chunks=(2_500_000, 2)).astype(np.float32)
    y = (X[:, 0] > 0.5).astype(np.int64)
    est = DaskClassifier(client=small_client, max_epochs=1, dask_data="persist")  # "auto" streams it
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"(?s)needs 1\.49 GiB.*memory_limit.*nothing was computed"):
        est.fit(X, y)
    assert time.monotonic() - start < 30  # it stalled for 240 s
    assert not any("random" in p or "astype" in p for p in small_client.run_on_scheduler(_prefixes))
    assert not hasattr(est, "module_")


def test_data_the_user_persisted_as_it_is_adds_nothing(client):
    X = client.persist(da.ones((1000, 4), chunks=(250, 4), dtype=np.float32))
    assert new_bytes(X) == 0
    assert new_bytes(X + 1) == 1000 * 4 * 4  # a new collection from it is held as well


def test_data_that_fits_trains_on_a_client_that_is_not_the_default(small_client):
    """Placing the blocks waited on them through Dask's default client: 'No clients found'."""
    X = da.random.RandomState(0).random_sample((4000, 4), chunks=(500, 4)).astype(np.float32)
    y = (X[:, 0] > 0.5).astype(np.int64)
    est = DaskClassifier(client=small_client, max_epochs=2, random_state=0).fit(X, y)
    assert est.history_[-1]["n_samples_seen"] == 2 * 4000


def test_streamed_blocks_sized_once_give_way_only_to_data_that_came_since():
    """Blocks are sized by what a worker held when a streamed fit first sized them there (the same
    for every later fit: the same order); they are sized again only where they would bring the
    worker to Dask's pause fraction beside what it holds now, not for a first fit's warm-up."""
    X = da.zeros((1000, 16), chunks=(500, 16), dtype=np.float32)
    y = da.zeros(1000, chunks=500, dtype=np.int64)  # 72 bytes an example

    def worker(held_mib):
        return {"a": {"memory_limit": 2**30, "metrics": {"memory": held_mib * 2**20}}}

    rows = stream_rows([X, y], worker(300), window=8, windows=3)  # 60 % of 1 GiB less 300 MiB: 314 MiB
    assert rows == int(314.4 * 2**20) // (24 * 72)
    assert not reaches_pause([X, y], worker(360), rows, window=8, windows=3)  # torch's pages after a first fit
    assert reaches_pause([X, y], worker(600), rows, window=8, windows=3)  # 300 MiB of other data: past 80 %
