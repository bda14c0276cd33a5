"""Elastic training on real worker processes: growth, shrinking, SIGKILL, resume."""

import logging
import multiprocessing
import os
import signal
import time

import dask
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification

from adadamp import DaskClassifier, DaskRegressor
from adadamp.callbacks import Callback
from adadamp.dampers import Constant, GeoDamp
from adadamp.engine import LoopState, Sampler
from adadamp.engine.membership import MEMBERSHIP_INTERVAL
from adadamp.records import examples_digest


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=512, n_features=8, n_informative=6, n_classes=3, random_state=1)
    return X, y


def _cluster(n):
    return LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
    )


_CLUSTERS = {}  # what the test dampers act on (dampers must stay clonable)


class KillAt(Constant):
    """Constant batch that SIGKILLs worker processes at chosen updates (test only)."""

    def __init__(self, batch_size=32, momentum=None, kill=None):
        self.batch_size = batch_size
        self.momentum = momentum
        self.kill = kill

    def next_batch_size(self, state):
        action = (self.kill or {}).get(state.n_updates)
        if isinstance(action, int):
            os.kill(action, signal.SIGKILL)
        elif action == "wait":  # for the nannies to restart what was killed
            _CLUSTERS["client"].wait_for_workers(3)
            time.sleep(2 * MEMBERSHIP_INTERVAL)  # the engine notices them at its next look ...
        elif action == "settle":
            time.sleep(1.0)  # ... and sets them up while the others train
        return super().next_batch_size(state)


class Stopped(Exception):
    pass


class StopAt(Callback):
    """Interrupts the fit after one model update, as a crash or preemption would (test only)."""

    def __init__(self, stop=None):
        self.stop = stop

    def on_update_end(self, estimator, record=None, **info):
        self.updates_ = getattr(self, "updates_", 0) + 1
        if self.updates_ == self.stop:
            raise Stopped("the client stops (preempted, crashed, interrupted)")


def _weights(est):
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _workers_per_update(est):
    return [u["n_workers"] for row in est.history_ for u in row["updates"]]


def test_cluster_grows_with_geodamp_and_shrinks(data):
    X, y = data
    X, y = np.tile(X, (4, 1)), np.tile(y, 4)  # epochs long enough to see workers arrive
    with _cluster(1) as cluster, Client(cluster) as client:
        est = DaskClassifier(
            batch_size=GeoDamp(initial=32, delay=1, factor=2, max_batch_size=128),
            grads_per_worker=32,
            max_workers=4,
            scale_cluster=True,
            max_epochs=4,
            random_state=0,
            client=client,
        ).fit(X, y)
        workers = _workers_per_update(est)
        assert workers[0] == 1 and max(workers) >= 4
        assert [row["batch_size"] for row in est.history_] == [32, 64, 128, 128]
        assert est.history_[-1]["n_samples_seen"] == 4 * len(X)  # no example lost
        assert len(client.scheduler_info()["workers"]) == 4
        # Shrink: a smaller batch on the same cluster gives workers back; no fit holds them, so they
        # are retired gracefully once their idle time is over (0 here), down to the one it started with.
        with dask.config.set({"adadamp.cluster.idle-timeout": 0}):
            est.set_params(batch_size=32, warm_start=True, max_epochs=1).fit(X, y)
            assert est.history_[-1]["n_workers"] == 1
            assert est.history_[-1]["n_samples_seen"] == 5 * len(X)
            deadline = time.monotonic() + 30
            while len(client.scheduler_info()["workers"]) > 1:
                assert time.monotonic() < deadline, "the idle workers were not retired"
                time.sleep(0.1)


def test_sigkilled_workers_do_not_change_the_result(data):
    """Kill one worker, then another; the nanny restarts them under new addresses."""
    X, y = data
    params = {"max_epochs": 3, "random_state": 3, "scale_cluster": False, "min_workers": 3}  # the batch on every worker
    with _cluster(3) as cluster, Client(cluster) as client:
        calm = DaskClassifier(batch_size=32, client=client, **params).fit(X, y)
        pids = list(client.run(os.getpid).values())
        _CLUSTERS.update(client=client)
        damper = KillAt(batch_size=32, kill={5: pids[0], 20: pids[1], 30: "wait", 32: "settle"})
        hurt = DaskClassifier(batch_size=damper, client=client, **params).fit(X, y)
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-4, atol=1e-5)
    assert hurt.history_[-1]["n_samples_seen"] == calm.history_[-1]["n_samples_seen"]
    workers = _workers_per_update(hurt)
    assert min(workers) < 3  # the loss was seen ...
    assert workers[-1] == 3  # ... and the restarted workers were used again


@pytest.mark.parametrize(
    "moment",
    ["setup", "after-update", "epoch-end", "replacement-joins", "random", "placement", "checkpoint", "rejoin"],
)
def test_a_worker_killed_at_any_moment_does_not_change_the_result(moment, kill_cluster):
    """The short version of tests/system/stress/kill_workers.py: whatever the moment of death, the
    parameter server ends bit for bit on the undisturbed weights."""
    from stress import kill_workers as kw

    client, X, y, calm, duration = kill_cluster
    r = kw.trial(client, X, y, 4, moment, seed=kw.MOMENTS.index(moment), duration=duration, strict=False)
    assert float(np.abs(r.weights - calm).max()) <= kw.TOLERANCES["ps"]
    if moment not in ("setup", "random"):  # timed kills may land before the fit looks, or after its end
        assert r.kills >= 1 and min(r.workers) < 3  # the loss was seen


@pytest.mark.parametrize(
    ("backend", "workload", "moment"),
    [
        ("allreduce", "sgd-momentum", "rejoin"),
        ("allreduce", "batchnorm", "after-update"),
        ("ps", "dask-array", "checkpoint"),
        ("ps", "batchnorm", "after-update"),
    ],
)
def test_a_killed_worker_on_other_backends_and_inputs(backend, workload, moment, kill_cluster):
    """The stress script's other draws, one each: the all-reduce backend (equal up to float
    summation order; with BatchNorm too: a replica computes each of its shards apart, and a failed
    update leaves its running statistics as it found them), dask-array input and a BatchNorm model
    on the parameter server, running statistics included (bit for bit: every shard starts from the
    client's statistics, whichever worker computes it)."""
    from stress import kill_workers as kw

    client, X, y, _, _ = kill_cluster
    kw.heal(client, 3)  # both fits start on the same workers, so on the same shards
    start = time.perf_counter()
    with dask.config.set({"adadamp.debug.digests": True}):  # a mismatch then says where it started
        calm = kw.fit(client, X, y, 4, workload, backend)
        r = kw.trial(client, X, y, 4, moment, seed=kw.MOMENTS.index(moment), duration=time.perf_counter() - start,
                     strict=False, workload=workload, backend=backend)
    where = (f"{kw.first_difference(r.digests, kw.update_digests(calm))}; workers per update: disturbed "
             f"{r.workers}, undisturbed {_workers_per_update(calm)}; {r.detail}")
    assert float(np.abs(r.weights - kw.weights(calm)).max()) <= kw.TOLERANCES[backend], where
    assert r.kills >= 1 and min(r.workers) < 3  # the loss was seen


@pytest.fixture(scope="module")
def kill_cluster():
    from stress import kill_workers as kw

    X, y = kw.data(1024)
    with _cluster(3) as cluster, Client(cluster) as client:
        start = time.perf_counter()
        calm = kw.weights(kw.fit(client, X, y, 4))
        yield client, X, y, calm, time.perf_counter() - start


class AddAt(Constant):
    """Constant batch that adds a worker to the test cluster at update 3 (test only)."""

    def next_batch_size(self, state):
        if state.n_updates == 3:
            _CLUSTERS["current"].scale(2)
            _CLUSTERS["client"].wait_for_workers(2)  # the engine must notice it by itself,
            time.sleep(2 * MEMBERSHIP_INTERVAL)  # within its membership interval,
        if state.n_updates == 5:
            time.sleep(1.0)  # and set it up off the training path
        return super().next_batch_size(state)


def test_worker_added_mid_fit_is_used(data):
    X, y = data
    with _cluster(1) as cluster, Client(cluster) as client:
        _CLUSTERS.update(current=cluster, client=client)
        est = DaskClassifier(batch_size=AddAt(batch_size=32), client=client, max_epochs=2, random_state=0,
                             min_workers=2)  # the batch wants 2 workers: the one added is taken
        est.fit(X, y)
    workers = _workers_per_update(est)
    assert workers[0] == 1 and workers[-1] == 2


class SlowToBuild(torch.nn.Module):
    """Takes ``build`` seconds to unpickle on a worker (a big model) and ``step`` s per forward."""

    def __init__(self, n_features=8, n_outputs=3, build=1.5, step=0.02):
        super().__init__()
        self.build, self.step = build, step
        self.linear = torch.nn.Linear(n_features, n_outputs)

    def forward(self, x):
        time.sleep(self.step)
        return self.linear(x)

    def __setstate__(self, state):
        if "Dask Worker" in multiprocessing.current_process().name:
            time.sleep(state["build"])
        super().__setstate__(state)


class ScaleAt(Callback):
    """Adds a second worker to the test cluster after update 3 (waits until it has joined Dask,
    outside any update; its adadamp set-up is the engine's business)."""

    def on_update_end(self, estimator, record=None, **info):
        self.updates_ = getattr(self, "updates_", 0) + 1
        if self.updates_ == 3:
            _CLUSTERS["current"].scale(2)
            _CLUSTERS["client"].wait_for_workers(2, timeout=60)


def test_a_joining_worker_is_set_up_off_the_training_path(data):
    """Its 1.5 s set-up runs while the others train: no update waits for it."""
    X, y = data
    with _cluster(1) as cluster, Client(cluster) as client:
        _CLUSTERS.update(current=cluster, client=client)
        est = DaskClassifier(module=SlowToBuild, batch_size=32, max_epochs=12, client=client, random_state=0,
                             min_workers=2, callbacks=[("scale", ScaleAt())]).fit(X, y)
    updates = [u for row in est.history_ for u in row["updates"]]
    workers = [u["n_workers"] for u in updates]
    joined = workers.index(2)
    assert set(workers[joined:]) == {2}
    slowest = max(u["update_time"] for u in updates[3:])
    assert slowest < 1.0, slowest  # the set-up took 1.5 s, on the side


def test_checkpoint_resume_matches_uninterrupted_fit(data, client, tmp_path):
    X, y = data
    params = {"max_epochs": 3, "random_state": 5, "optimizer": torch.optim.SGD, "optimizer__momentum": 0.9}
    whole = DaskClassifier(batch_size=32, **params).fit(X, y)
    path = tmp_path / "ckpt.pt"
    stopped = DaskClassifier(batch_size=32, callbacks=[("stop", StopAt(stop=21))], checkpoint=path, checkpoint_every=4,
                             **params)
    with pytest.raises(Stopped):
        stopped.fit(X, y)
    assert path.exists() and not hasattr(stopped, "module_")
    resumed = DaskClassifier(batch_size=32, checkpoint=path, **params).fit(X, y)
    np.testing.assert_array_equal(_weights(resumed), _weights(whole))
    assert [r["n_updates"] for r in resumed.history_] == [r["n_updates"] for r in whole.history_]


def test_save_and_load_params(data, client, tmp_path):
    X, y = data
    est = DaskClassifier(max_epochs=1, random_state=0).fit(X, y)
    other = DaskClassifier(max_epochs=1, random_state=1).fit(X, y)
    est.save_params(f_params=tmp_path / "p.pt", f_optimizer=tmp_path / "o.pt", f_history=tmp_path / "h.json")
    other.load_params(f_params=tmp_path / "p.pt", f_optimizer=tmp_path / "o.pt", f_history=tmp_path / "h.json")
    np.testing.assert_array_equal(other.predict_proba(X), est.predict_proba(X))
    assert other.history_[0]["n_updates"] == est.history_[0]["n_updates"]


def test_jobqueue_local_cluster_survives_a_killed_job(data):
    from dask_jobqueue.local import LocalCluster as JobQueueCluster

    X, y = data
    cluster = JobQueueCluster(cores=1, processes=1, memory="1GiB", scheduler_options={"dashboard_address": None})
    try:
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            job_pids = [job.process.pid for job in cluster.workers.values()]
            damper = KillAt(batch_size=32, kill={4: job_pids[0]})
            est = DaskClassifier(batch_size=damper, client=client, max_epochs=2, random_state=0).fit(X, y)
            assert est.history_[-1]["n_samples_seen"] == 2 * len(X)
            assert min(_workers_per_update(est)) == 1
    finally:
        try:
            cluster.close()
        except AssertionError:  # SpecCluster._close after a killed job
            pass


class Act(Constant):
    """Constant batch that runs a test action at one update (test only)."""

    def __init__(self, batch_size=32, momentum=None, at=3):
        self.batch_size = batch_size
        self.momentum = momentum
        self.at = at

    def next_batch_size(self, state):
        if state.n_updates == self.at and "action" in _CLUSTERS:
            _CLUSTERS.pop("action")()
        return super().next_batch_size(state)


def test_all_workers_gone_raises_after_timeout_and_keeps_weights(data):
    from adadamp import NoWorkersError

    X, y = data
    with _cluster(2) as cluster, Client(cluster) as client:
        _CLUSTERS["action"] = lambda: cluster.scale(0)
        est = DaskClassifier(batch_size=Act(at=5), client=client, worker_timeout=2, max_epochs=2, random_state=0,
                             min_workers=2)
        with pytest.raises(NoWorkersError, match="worker_timeout=2"):
            est.fit(X, y)
    assert est.loop_.n_updates >= 5  # retiring takes a moment
    assert np.isfinite(est.predict_proba(X)).all()


def test_scheduler_loss_says_so_and_keeps_weights(data):
    from adadamp import SchedulerLostError

    X, y = data
    cluster = _cluster(2)
    client = Client(cluster)
    try:
        _CLUSTERS["action"] = cluster.close
        est = DaskClassifier(batch_size=Act(at=5), client=client, worker_timeout=2, max_epochs=2, random_state=0)
        with pytest.raises(SchedulerLostError, match="checkpoint"):
            est.fit(X, y)
        assert est.loop_.n_updates == 5
        assert np.isfinite(est.predict_proba(X)).all()
    finally:
        client.close()


def test_torch_dataset_input(data, client):
    X, y = data
    dataset = torch.utils.data.TensorDataset(torch.tensor(X, dtype=torch.float32), torch.tensor(y))
    est = DaskClassifier(max_epochs=1, random_state=0).fit(dataset)
    assert est.n_features_in_ == X.shape[1] and list(est.classes_) == [0, 1, 2]
    assert est.predict(X).shape == (len(X),)


def _updates(est):
    return [u for row in est.history_ for u in row["updates"]]


def _batch_digests(est, n_data, batch_size):
    """The digest of every update's batch, drawn again from the fit's seed (each example once)."""
    sampler = Sampler(LoopState(seed=est.loop_.seed, n_data=n_data))
    return [examples_digest(sampler.take(batch_size)) for _ in range(est.loop_.n_updates)]


def _first_difference(calm, hurt, key):
    return next((i for i, (a, b) in enumerate(zip(_updates(calm), _updates(hurt))) if a[key] != b[key]), None)


def test_a_killed_worker_leaves_every_update_bitwise_unchanged():
    """Issue 27: the batch is cut into the same shards whoever computes them, so losing a worker (and
    taking its restarted replacement back) changes neither an update's examples nor its step: every
    update's weights equal the undisturbed fit's bit for bit, not only "up to summation order" (a
    ReLU network turned a one-ulp difference at a kill into 3e-4 at the end)."""
    X, y = make_classification(n_samples=512, n_features=8, n_informative=6, random_state=2)
    y = (y - y.mean()).astype(np.float32)
    params = {"module__hidden": (32,), "optimizer": torch.optim.SGD, "optimizer__lr": 0.05,
              "optimizer__momentum": 0.9, "max_epochs": 3, "random_state": 0, "min_workers": 3}  # on every worker
    with _cluster(3) as cluster, Client(cluster) as client, dask.config.set({"adadamp.debug.digests": True}):
        calm = DaskRegressor(batch_size=32, client=client, **params).fit(X, y)
        pids = list(client.run(os.getpid).values())
        _CLUSTERS.update(client=client)
        damper = KillAt(batch_size=32, kill={6: pids[1], 20: "wait", 22: "settle"})
        hurt = DaskRegressor(batch_size=damper, client=client, **params).fit(X, y)
    workers = _workers_per_update(hurt)
    assert min(workers) == 2 and workers[-1] == 3  # the loss was seen, and the replacement taken back
    expected = _batch_digests(calm, len(X), 32)
    for est in (calm, hurt):  # every example of every batch counted once, whoever computed it
        got = [u["examples_digest"] for u in _updates(est)]
        assert got == expected, f"update {next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)}"
    first = _first_difference(calm, hurt, "weights_digest")
    assert first is None, f"update {first} took another step than the undisturbed fit's"
    np.testing.assert_array_equal(_weights(hurt), _weights(calm))


def test_a_worker_killed_during_the_first_placement_of_dask_data_costs_seconds(kill_cluster):
    """A dask array's blocks are loaded by tasks pinned to their worker: when that worker dies
    during the first placement the fit goes on as soon as the scheduler drops it, not after the
    placement's timeout (max(60 s, update_timeout)) nor after a survivor's fetch from the dead
    worker gave up connecting (Dask's connect timeout, 30 s), and ends bit for bit where the
    undisturbed fit does.  The trial is a fit (~6 s here) and up to 15 s waiting for the nanny."""
    from stress import kill_workers as kw

    client, X, y, _, _ = kill_cluster
    kw.heal(client, 3)  # both fits start on the same workers, so on the same shards
    start = time.perf_counter()
    calm = kw.weights(kw.fit(client, X, y, 2, "dask-array", "ps"))
    duration = time.perf_counter() - start
    start = time.perf_counter()
    r = kw.trial(client, X, y, 2, "placement", seed=0, duration=duration, strict=False, workload="dask-array")
    elapsed = time.perf_counter() - start
    np.testing.assert_array_equal(r.weights, calm)
    assert r.kills == 1
    assert elapsed < 30, f"the placement waited {elapsed:.0f} s for a dead worker's blocks"
