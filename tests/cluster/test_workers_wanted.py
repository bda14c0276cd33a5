"""The workers a fit uses follow the workers its batch wants, on any cluster (issue 32, item 1), and a
growing batch takes workers set up beforehand (item 1, "asked early enough": no update waits for a
worker's set-up nor for a worker the schedule said it would need)."""

import logging
import time
import types

import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification
from torch import nn

from adadamp import DaskClassifier
from adadamp.cluster import ClusterPolicy
from adadamp.dampers import GeoDamp
from adadamp.engine import LoopState
from adadamp.engine.backends.base import Backend
from adadamp.engine.backends.sizing import START_MARGIN, WORKER_START
from adadamp.worker import plugin as _worker


def _data(n=512, seed=0):
    X, y = make_classification(n_samples=n, n_features=8, n_informative=5, n_classes=3, random_state=seed)
    return X.astype(np.float32), y


def _workers(est) -> list[int]:
    return [u["n_workers"] for row in est.history_ for u in row["updates"]]


def _setups(client) -> dict[str, int]:
    """Set-ups each worker has done (any fit)."""
    return client.run(lambda: _worker.TRAINER.stats["setups"])


@pytest.fixture(scope="module")
def four():
    """A warm cluster of four single-threaded worker processes, as a user passes it (``client=``)."""
    with (
        LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0",
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        client.wait_for_workers(4)
        yield client


def test_a_fit_on_a_larger_cluster_trains_on_the_workers_it_wants_and_leaves_the_others_free(four):
    X, y = _data()
    before = _setups(four)
    est = DaskClassifier(client=four, max_workers=1, batch_size=32, max_epochs=2, random_state=0).fit(X, y)
    assert set(_workers(est)) == {1}
    set_up = {w for w, n in _setups(four).items() if n > before[w]}
    assert len(set_up) == 1  # the other three were never touched
    assert len(four.scheduler_info(n_workers=-1)["workers"]) == 4  # nor retired: the cluster is the user's

    # the defaults: 32 examples want ceil(32 / grads_per_worker=128) = 1 worker
    assert set(_workers(DaskClassifier(client=four, batch_size=32, max_epochs=1).fit(X, y))) == {1}
    # min_workers (or a smaller grads_per_worker) spreads a small batch over more workers
    assert set(_workers(DaskClassifier(client=four, batch_size=32, min_workers=3, max_epochs=1).fit(X, y))) == {3}


@pytest.mark.parametrize("backend", ["parameter-server", "allreduce"])
def test_a_growing_batch_takes_more_of_the_cluster_without_scaling_it(four, backend):
    X, y = _data()
    plan = four.cluster.plan
    est = DaskClassifier(
        client=four, backend=backend, batch_size=GeoDamp(initial=16, delay=1, factor=2), grads_per_worker=16,
        max_epochs=4, random_state=0,
    ).fit(X, y)
    assert [row["n_workers"] for row in est.history_] == [1, 2, 4, 4]  # 16, 32, 64, 128 examples; 4 workers there
    assert four.cluster.plan == plan and len(four.scheduler_info(n_workers=-1)["workers"]) == 4  # never scaled


def test_a_growing_batch_takes_workers_set_up_beforehand(caplog):
    """On the embedded cluster, warm with four workers: the fit starts on one; the schedule, read
    ahead, has the others set up in the background before the batch wants them, so every growth
    takes workers on standby (none set up while an update waits, no update waits for a worker)."""
    X, y = _data(1024)
    DaskClassifier(batch_size=64, min_workers=4, max_workers=4, max_epochs=1).fit(X[:256], y[:256])  # four warm workers
    with caplog.at_level(logging.INFO, logger="adadamp.engine.membership"):
        est = DaskClassifier(module=SlowMLP, batch_size=GeoDamp(initial=16, delay=2, factor=2), grads_per_worker=16,
                             max_workers=4, max_epochs=5, random_state=0).fit(X, y)
    assert [row["n_workers"] for row in est.history_] == [1, 1, 2, 2, 4]
    joins = [r.getMessage() for r in caplog.records if "join" in r.getMessage()]
    assert len(joins) == 2 and all(m.endswith(", 0 set up while the update waited") for m in joins), joins
    assert not [r for r in caplog.records if "waiting up to" in r.getMessage()]


class SlowMLP(nn.Module):
    """A small MLP whose training forward takes at least 10 ms: the background set-ups of the workers
    the schedule will want overlap updates (an epoch of 64 takes over a second), as they do for a
    model that computes for real."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            time.sleep(0.01)
        return self.net(x)


def _stub(latency, recent, progress=0.0, scale=True):
    """What :meth:`Backend._ahead` reads: the clock, the schedule, the policy, the measured worker start."""
    return types.SimpleNamespace(
        loop=LoopState(seed=0, n_data=1000, progress=progress),
        damper=GeoDamp(initial=100, delay=2, factor=2).reset(n_data=1000),  # 100, 100, 200, 200, 400, 400, 800, 800, 1000...
        policy=ClusterPolicy(prescale_epochs=1.0, scale=scale),
        members=types.SimpleNamespace(start_latency=latency),
        _recent=recent,
    )


# Updates of 0.1 s: epochs 0 and 1 (10 updates of 100) take 1 s each, 2 and 3 (5 of 200) 0.5 s, 4 and 5
# (3 of 400) 0.3 s, 6 and 7 0.2 s, then 0.1 s: epochs 1, 2, 3, 4, 5 begin at 1, 2, 2.5, 3, 3.3 s.  An
# epoch's batch is read ahead when it begins within START_MARGIN measured worker starts (``latency`` here).
@pytest.mark.parametrize(
    ("latency", "progress", "expected"),
    [
        (0.5, 0.0, 100),  # nothing within 0.5 s but epoch 0 (and epoch 1: prescale_epochs=1)
        (1.5, 0.0, 100),  # epoch 1 begins at 1 s, epoch 2 at 2 s
        (2.5, 0.0, 200),  # epoch 2 begins at 2 s; epoch 3 at 2.5 s, not within
        (2.9, 0.0, 200),  # epoch 4 (400) begins at 3 s
        (3.1, 0.0, 400),
        (1.6, 500.0, 200),  # half-way through epoch 0: epoch 2 begins 1.5 s later
        (1.4, 500.0, 100),
    ],
)
def test_the_schedule_is_read_ahead_by_the_measured_worker_start(latency, progress, expected):
    assert Backend._ahead(_stub(latency / START_MARGIN, [0.1] * 5, progress), 100) == expected


def test_before_any_update_or_measured_start_the_schedule_is_read_by_epochs_and_a_guess():
    assert Backend._ahead(_stub(None, []), 100) == 100  # no update timed: prescale_epochs only
    assert WORKER_START > 4.0  # no worker start measured: a guess, past epoch 8 (1000), which begins at 4 s
    assert Backend._ahead(_stub(None, [0.1, 0.1, 5.0]), 100) == 1000  # the median: a stalled update is not the clock
    assert Backend._ahead(_stub(None, [0.1], scale=False), 100) == 100  # no worker to start: prescale_epochs only


def test_concurrent_fits_on_a_shared_cluster_take_different_workers(four):
    """A second fit started while another trains (one worker each) takes a worker the first one
    does not train on, not the first by name (a threaded grid search would queue both fits on one
    worker and leave the others idle)."""
    import threading

    from adadamp.callbacks import Callback

    X, y = _data()
    training, finish = threading.Event(), threading.Event()

    class Hold(Callback):
        def on_epoch_end(self, estimator, **info):
            training.set()
            finish.wait(60)

    before = _setups(four)
    first = DaskClassifier(client=four, max_workers=1, batch_size=32, max_epochs=2, random_state=0,
                           callbacks=[Hold()])
    thread = threading.Thread(target=first.fit, args=(X, y))
    thread.start()
    try:
        assert training.wait(60)
        first_worker = {w for w, n in _setups(four).items() if n > before[w]}
        DaskClassifier(client=four, max_workers=1, batch_size=32, max_epochs=1, random_state=1).fit(X, y)
        both = {w for w, n in _setups(four).items() if n > before[w]}
    finally:
        finish.set()
        thread.join(60)
    assert len(first_worker) == 1 and len(both) == 2, (first_worker, both)
    assert set(_workers(first)) == {1}
