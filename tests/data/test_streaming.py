"""Dask data bigger than the workers' memory, streamed through them (adadamp.data.streaming): every
example once per epoch in the documented order, bitwise reproducible, a SIGKILLed worker costing
not a bit, the workers' memory bounded; and the order itself, drawn widely."""

import logging
import os
import threading

import dask
import dask.array as da
import numpy as np
import psutil
import pytest
import torch
from distributed import Client, LocalCluster
from test_elastic import _CLUSTERS, KillAt, _updates, _weights
from torch import nn

from adadamp import DaskClassifier, DaskRegressor
from adadamp.data import memory, streaming
from adadamp.data.memory import rooms
from adadamp.records import examples_digest
from adadamp.wire.batches import StreamOrder


# ---------------------------------------------------------------------- the order
@pytest.mark.parametrize("seed", range(20))
def test_the_streamed_order_visits_each_example_once_from_few_windows(seed):
    rng = np.random.default_rng(seed)
    lengths = tuple(int(n) for n in rng.integers(1, 40, size=int(rng.integers(1, 30))))
    order = StreamOrder(int(rng.integers(0, 2**31)), lengths, window=int(rng.integers(1, 9)))
    n = sum(lengths)
    for epoch in range(3):
        perm = order.permutation(epoch)
        assert sorted(perm.tolist()) == list(range(n))  # every example once
        # the examples come window by window: the blocks of each stretch are those of one window
        at = 0
        for blocks in order.windows(epoch):
            size = sum(lengths[b] for b in blocks)
            assert set(order.block_of(perm[at : at + size]).tolist()) == set(blocks)
            at += size
        for n_shards in (1, 2, 3, 5):  # a window's blocks spread evenly over the shards
            shard = order.shard_of(epoch, n_shards)
            for blocks in order.windows(epoch):
                counts = np.bincount(shard[blocks], minlength=n_shards)
                assert counts.max() - counts.min() <= 1
        batch = perm[: int(rng.integers(1, n + 1))]
        now, (next_epoch, upcoming) = order.needed(epoch, batch)
        assert set(order.block_of(batch).tolist()) <= set(now)
        assert not set(now) & set(upcoming) or next_epoch == epoch + 1
    assert np.array_equal(order.permutation(1), StreamOrder(order.seed, lengths, order.window).permutation(1))
    assert not np.array_equal(order.permutation(0), order.permutation(1)) or n < 3


# ---------------------------------------------------------------------- on real clusters
class Wide(nn.Module):
    def __init__(self, features=16, outputs=2):
        super().__init__()
        self.layer = nn.Linear(features, outputs)

    def forward(self, x):
        return self.layer(x)


def _data(n=6000, features=16, chunk=500):
    X = da.random.RandomState(0).standard_normal((n, features), chunks=(chunk, features)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    return X, y


def _digests(est, n_data, lengths, window, batch_size):
    """Every update's examples as the documented order names them (the fit's seed alone)."""
    order = StreamOrder(est.loop_.seed, tuple(lengths), window)
    out, epoch = [], 0
    while len(out) < est.loop_.n_updates:
        perm = order.permutation(epoch)
        out += [examples_digest(perm[i : i + batch_size]) for i in range(0, n_data, batch_size)]
        epoch += 1
    return out[: est.loop_.n_updates]


@pytest.fixture(scope="module")
def three_workers():
    with LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


def test_streamed_fits_follow_the_documented_order_bitwise_and_survive_a_killed_worker(three_workers):
    """dask_data='stream' on 3 workers: each update's examples are the documented order's (digests),
    a second fit is bitwise the first, and a worker SIGKILLed mid-epoch changes no weight."""
    client = three_workers
    X, y = _data()
    params = {"module": Wide, "optimizer": torch.optim.SGD, "optimizer__lr": 0.05, "max_epochs": 2,
              "random_state": 0, "min_workers": 3, "dask_data": "stream", "client": client}
    with dask.config.set({"adadamp.debug.digests": True, "adadamp.stream.window": 3}):
        calm = DaskClassifier(batch_size=200, **params).fit(X, y)
        again = DaskClassifier(batch_size=200, **params).fit(X, y)
        pids = list(client.run(os.getpid).values())
        _CLUSTERS.update(client=client)
        hurt = DaskClassifier(batch_size=KillAt(batch_size=200, kill={20: pids[1], 30: "wait", 32: "settle"}),
                              **params).fit(X, y)
    assert calm.meta_["data"] == "streamed"
    expected = _digests(calm, 6000, X.chunks[0], 3, 200)
    for est in (calm, again, hurt):
        assert [u["examples_digest"] for u in _updates(est)] == expected
    assert min(u["n_workers"] for u in _updates(hurt)) == 2  # the loss was seen
    np.testing.assert_array_equal(_weights(again), _weights(calm))
    np.testing.assert_array_equal(_weights(hurt), _weights(calm))
    assert calm.score(X, y) > 0.9  # predict and score on the same (lazy) data


def test_a_streamed_fit_holds_a_few_blocks_per_worker(three_workers):
    """The blocks a worker holds while it trains: three windows' worth at most, never the data."""
    client = three_workers
    X, y = _data(n=12000, chunk=250)  # 48 blocks

    def held(dask_worker):
        from adadamp.worker.plugin import TRAINER

        return max((len(s.block_index) for s in TRAINER.fits.values()), default=0)

    seen, done = [], threading.Event()

    def watch():
        while not done.wait(0.05):
            seen.append(max(client.run(held).values()))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with dask.config.set({"adadamp.stream.window": 4}):
        est = DaskClassifier(module=Wide, max_epochs=2, batch_size=256, random_state=0, min_workers=3,
                             dask_data="stream", client=client).fit(X, y)
    done.set()
    watcher.join()
    assert est.history_[-1]["n_samples_seen"] == 2 * 12000
    assert seen and 0 < max(seen) <= 3 * 4, max(seen)  # its part of three windows at most, never the 48 blocks


@pytest.fixture(scope="module")
def streamed_allreduce(three_workers):
    """3000 examples in blocks of 500, the parameters of a streamed fit (window 3) on 3 workers, and
    its undisturbed all-reduce fit."""
    X, y = _data(n=3000)
    params = {"module": Wide, "optimizer": torch.optim.SGD, "optimizer__lr": 0.05, "max_epochs": 2, "batch_size": 150,
              "random_state": 0, "min_workers": 3, "dask_data": "stream", "client": three_workers}
    with dask.config.set({"adadamp.debug.digests": True, "adadamp.stream.window": 3}):
        calm = DaskClassifier(backend="allreduce", **params).fit(X, y)
    return X, y, params, calm


def test_allreduce_streams_in_the_documented_order(streamed_allreduce):
    """backend='allreduce' on streamed data: each update's examples are the documented order's (the
    members find them from the order their set-up carries), the weights those of the parameter
    server's streamed fit up to summation order."""
    X, y, params, calm = streamed_allreduce
    with dask.config.set({"adadamp.debug.digests": True, "adadamp.stream.window": 3}):
        server = DaskClassifier(**params).fit(X, y)
    assert calm.meta_["data"] == "streamed"
    expected = _digests(calm, 3000, X.chunks[0], 3, 150)
    for est in (server, calm):
        assert [u["examples_digest"] for u in _updates(est)] == expected
    np.testing.assert_allclose(_weights(calm), _weights(server), rtol=1e-4, atol=1e-6)


def test_allreduce_streaming_survives_a_killed_worker(three_workers, streamed_allreduce):
    """A worker SIGKILLed mid-epoch of a streamed all-reduce fit changes neither the order nor
    (beyond summation order) the weights."""
    client = three_workers
    X, y, params, calm = streamed_allreduce
    with dask.config.set({"adadamp.debug.digests": True, "adadamp.stream.window": 3}):
        pids = list(client.run(os.getpid).values())
        _CLUSTERS.update(client=client)
        hurt = DaskClassifier(**{**params, "batch_size": KillAt(batch_size=150, kill={12: pids[2], 18: "wait",
                                                                                      20: "settle"})},
                              backend="allreduce").fit(X, y)
    assert [u["examples_digest"] for u in _updates(hurt)] == _digests(calm, 3000, X.chunks[0], 3, 150)
    assert min(u["n_workers"] for u in _updates(hurt)) == 2  # the loss was seen
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-4, atol=1e-6)


def _peak_rss(client, stop: threading.Event, out: list):
    """The workers' largest resident memory, every 0.1 s."""
    pids = list(client.run(os.getpid).values())
    while not stop.wait(0.1):
        out.append(max(psutil.Process(p).memory_info().rss for p in pids if psutil.pid_exists(p)))


def test_data_three_times_what_the_workers_can_hold_is_streamed_to_the_end(small_client):
    """A lazily generated dask array 3x what 2 workers of memory_limit=1GiB can hold (Dask's
    target fraction of the limit less what their processes hold) is streamed without being
    asked: every example once per epoch, no worker over its limit, nothing paused or lost."""
    client = small_client
    room = sum(rooms(client.scheduler_info()["workers"]))
    features = 256
    n = int(3 * room // (features * 4 + 8)) // 1000 * 1000
    X = da.random.RandomState(1).standard_normal((n, features), chunks=(5_000, features)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    peak, stop = [], threading.Event()
    watcher = threading.Thread(target=_peak_rss, args=(client, stop, peak), daemon=True)
    watcher.start()
    with dask.config.set({"adadamp.debug.digests": True}):
        est = DaskClassifier(module=Wide, module__features=features, max_epochs=1, batch_size=8192,
                             random_state=0, client=client).fit(X, y)
    stop.set()
    watcher.join()
    assert est.meta_["data"] == "streamed"
    assert est.history_[-1]["n_samples_seen"] == n
    digest = sum(u["examples_digest"] for u in _updates(est)) % 2**64
    assert digest == examples_digest(np.arange(n))  # every example exactly once
    assert max(peak) < 2**30, f"a worker reached {max(peak) / 2**20:.0f} MiB"
    assert len(client.scheduler_info()["workers"]) == 2


def test_720_mb_on_two_workers_of_1_gib_fits():
    """6e7 x 2 float32 and its targets (720 MB, dask's default chunks) on a fresh cluster of 2 workers
    of 1 GiB, each holding ~450 MB with torch imported: persisting it had stalled for 240 s."""
    X = da.random.RandomState(0).random_sample((60_000_000, 2)).astype(np.float32)
    y = X.sum(axis=1, keepdims=True)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB", dashboard_address=":0",
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        peak, stop = [], threading.Event()
        watcher = threading.Thread(target=_peak_rss, args=(client, stop, peak), daemon=True)
        watcher.start()
        est = DaskRegressor(module=Wide, module__features=2, module__outputs=1, max_epochs=1, batch_size=2**16,
                            random_state=0, client=client).fit(X, y)
        stop.set()
        watcher.join()
        assert len(client.scheduler_info()["workers"]) == 2
    assert est.meta_["data"] == "streamed"
    assert est.history_[-1]["n_samples_seen"] == 60_000_000
    assert max(peak) < 0.8 * 2**30, f"a worker reached {max(peak) / 2**20:.0f} MiB (Dask pauses it at 80%)"


def test_streamed_data_works_with_checkpoints_weights_partial_fit_and_speed_shares(three_workers, tmp_path):
    """A streamed fit stopped mid-epoch and resumed from its checkpoint ends bitwise where the
    uninterrupted one does; sample weights train as on persisted data (same examples, same order
    but for the order's own window); partial_fit and shares='speed' train to the end."""
    from test_elastic import StopAt, Stopped

    client = three_workers
    X, y = _data(n=3000)
    w = da.random.RandomState(2).uniform(0.5, 2.0, size=3000, chunks=500)
    params = {"module": Wide, "optimizer": torch.optim.SGD, "optimizer__lr": 0.05, "optimizer__momentum": 0.9,
              "max_epochs": 2, "random_state": 3, "dask_data": "stream", "client": client, "batch_size": 100}
    with dask.config.set({"adadamp.stream.window": 2}):
        whole = DaskClassifier(**params).fit(X, y)
        path = tmp_path / "ckpt.pt"
        stopped = DaskClassifier(callbacks=[("stop", StopAt(stop=41))], checkpoint=path, checkpoint_every=4, **params)
        with pytest.raises(Stopped):
            stopped.fit(X, y)
        resumed = DaskClassifier(checkpoint=path, **params).fit(X, y)
        np.testing.assert_array_equal(_weights(resumed), _weights(whole))
        weighted = DaskClassifier(**params).fit(X, y, sample_weight=w)
        assert weighted.meta_["data"] == "streamed"
        assert not np.array_equal(_weights(weighted), _weights(whole))  # the weights weigh
        est = DaskClassifier(**{**params, "shares": "speed"})
        for _ in range(2):
            est.partial_fit(X, y, classes=[0, 1])
        assert est.history_[-1]["n_samples_seen"] == 2 * 3000
        assert est.score(X, y) > 0.8


def test_a_streamed_fit_on_a_growing_cluster_trains_as_on_a_fixed_one(three_workers):
    """GeoDamp 128 -> 512 with ``scale_cluster=True`` on a cluster started with one worker: the
    cluster grows with the batch while the blocks stream, each update's examples are the
    documented order's, and the weights are bitwise those of the same fit on a fixed cluster of
    three (the same shards: the workers the batch wants)."""
    from adadamp.dampers import GeoDamp

    X, y = _data(n=3000)
    params = {"module": Wide, "optimizer": torch.optim.SGD, "optimizer__lr": 0.05, "max_epochs": 3,
              "random_state": 4, "dask_data": "stream", "grads_per_worker": 128, "max_workers": 3,
              "batch_size": GeoDamp(initial=128, delay=1, factor=2, max_batch_size=512)}
    with dask.config.set({"adadamp.debug.digests": True, "adadamp.stream.window": 2}):
        fixed = DaskClassifier(client=three_workers, **params).fit(X, y)
        with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None,
                          silence_logs=logging.ERROR) as cluster, Client(cluster, set_as_default=False) as client:
            grown = DaskClassifier(client=client, scale_cluster=True, **params).fit(X, y)
    workers = [row["n_workers"] for row in grown.history_]
    assert workers[0] == 1 and workers[-1] == 3, workers  # the cluster grew with the batch
    assert grown.meta_["data"] == "streamed"
    sizes = [u["batch_size"] for u in _updates(grown)]
    order = StreamOrder(grown.loop_.seed, tuple(X.chunks[0]), 2)
    expected, at, epoch = [], 0, 0
    perm = order.permutation(0)
    for size in sizes:  # each update's examples: the next of the documented order
        if at >= 3000:
            epoch, at = epoch + 1, 0
            perm = order.permutation(epoch)
        expected.append(examples_digest(perm[at : at + size]))
        at += size
    assert [u["examples_digest"] for u in _updates(grown)] == expected
    np.testing.assert_array_equal(_weights(grown), _weights(fixed))


def test_a_streamed_fit_cut_by_memory_is_bitwise_itself_on_the_same_workers(caplog):
    """Issue 65, item 6: data streamed twice with the same seed on the same 2 workers of 1 GiB,
    its partitions cut to what a worker can hold, ends bitwise the same.  The first fit's
    training grows each worker's process (torch's pages, 30-70 MB): measured anew, the second fit
    cut the partitions into more blocks, so drew another order (1.7e-9 apart on 3 GB of data)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB", dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, Client(cluster, set_as_default=False) as client:
        X, y = _data(n=2, chunk=1)
        rows = memory.stream_rows([X, y], memory.look(client), streaming.window(), streaming.WINDOWS_HELD)
        chunk = int(1.9 * rows)  # two blocks by what a fresh worker holds; three once it held more
        X, y = _data(n=chunk + 1000, chunk=chunk)
        params = {"module": Wide, "optimizer": torch.optim.SGD, "optimizer__lr": 0.05, "max_epochs": 1,
                  "batch_size": 8192, "random_state": 0, "dask_data": "stream", "client": client}
        with caplog.at_level(logging.INFO, logger="adadamp.data.prepare"):
            first = DaskClassifier(**params).fit(X, y)
            second = DaskClassifier(**params).fit(X, y)
    blocks = [r.args[1] for r in caplog.records if r.msg.startswith("dask data: %d examples in %d partitions")]
    assert first.meta_["data"] == second.meta_["data"] == "streamed"
    a, b = torch.as_tensor(_weights(first)), torch.as_tensor(_weights(second))
    assert torch.equal(a, b), f"{(a - b).abs().max().item():.3g} apart; blocks {blocks}"
    assert blocks[0] > 2 and blocks[0] == blocks[1], blocks  # cut to what the workers hold, the same way twice
