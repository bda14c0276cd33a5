"""The all-reduce backend on real worker processes: the parameter server's trajectory, membership
changes without a restart, SIGKILL inside a collective, dampers with statistics, checkpoints."""

import datetime
import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import torch
import torch.distributed as dist
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification, make_regression

from adadamp import DaskClassifier, DaskRegressor
from adadamp.callbacks import Callback
from adadamp.dampers import AdaScale, Constant, DynamicSGD, GeoDamp
from adadamp.engine.backends import AllReduce, register_backend
from adadamp.engine.backends import registry as backend_registry
from adadamp.engine.membership import MEMBERSHIP_INTERVAL
from adadamp.exceptions import ConvergenceError
from adadamp.worker.replica import Buckets, collective_backend

PS, AR = "parameter-server", "allreduce"


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=512, n_features=8, n_informative=6, n_classes=3, random_state=1)
    return X.astype(np.float32), y


def _cluster(n):
    return LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
    )


def _weights(est):
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _workers_per_update(est):
    return [u["n_workers"] for row in est.history_ for u in row["updates"]]


def _both(make, X, y):
    return [make(backend).fit(X, y) for backend in (PS, AR)]


# ------------------------------------------------------------------ the parameter server's trajectory
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_allreduce_equals_the_parameter_server(data, client, optimizer):
    X, y = data
    opt = {"optimizer": torch.optim.SGD, "optimizer__lr": 0.05, "optimizer__momentum": 0.9} if optimizer == "sgd" \
        else {"optimizer": torch.optim.Adam, "optimizer__lr": 0.01}
    ps, ar = _both(lambda b: DaskClassifier(batch_size=48, max_epochs=3, random_state=0, backend=b, min_workers=2, **opt), X, y)
    np.testing.assert_allclose(_weights(ar), _weights(ps), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r["train_loss"] for r in ar.history_], [r["train_loss"] for r in ps.history_],
                               rtol=1e-5)
    assert [r["n_samples_seen"] for r in ar.history_] == [r["n_samples_seen"] for r in ps.history_]
    # the client's optimizer state came back from the replicas (momentum buffers / Adam moments)
    assert len(ar.optimizer_.state) == len(ps.optimizer_.state) > 0
    np.testing.assert_allclose(ar.predict_proba(X), ps.predict_proba(X), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("batch_size", [16, 480])
def test_the_client_sends_and_receives_under_a_kilobyte_per_update_at_any_batch_size(data, client, batch_size):
    """The requests name the batch and each member's shards (a BatchPlan), not its examples: the
    client's traffic per update does not grow with the batch (it was 8 bytes per example)."""
    X, y = data
    est = DaskClassifier(batch_size=batch_size, max_epochs=1, random_state=0, backend=AR, min_workers=2).fit(X, y)
    updates = [u for row in est.history_ for u in row["updates"]]
    assert max(u["n_workers"] for u in updates) == 2
    assert max(u["sent_bytes"] for u in updates) < 1024, [u["sent_bytes"] for u in updates]
    assert max(u["received_bytes"] for u in updates) < 1024


def test_the_clients_bytes_per_member_keep_eight_workers_under_a_kilobyte_at_any_batch_size():
    """Every member's request is the update and its batch's place (its shards only when the data
    is placed again), every reply a few scalars: measured on 2 and 4 real workers at batch 64 and
    4096, the bytes per update are ``intercept + slope * workers``, the same at both batches, and
    under 1024 both ways at 8 workers (it sent 224 bytes per member with momentum: 1792 at 8)."""
    X, y = make_classification(n_samples=8192, n_features=8, n_informative=6, n_classes=3, random_state=1)
    X = X.astype(np.float32)
    most = {}  # (workers, batch) -> the most bytes an update sent and received
    for n_workers in (2, 4):
        with _cluster(n_workers) as cluster, Client(cluster) as client:
            client.wait_for_workers(n_workers)
            for batch_size in (64, 4096):
                est = DaskClassifier(batch_size=batch_size, max_epochs=1, random_state=0, backend=AR,
                                     min_workers=n_workers, optimizer=torch.optim.SGD, optimizer__lr=0.05,
                                     optimizer__momentum=0.9, client=client).fit(X, y)
                updates = [u for row in est.history_ for u in row["updates"]]
                assert len(updates) >= 2 and {u["n_workers"] for u in updates} == {n_workers}
                most[n_workers, batch_size] = (max(u["sent_bytes"] for u in updates),
                                               max(u["received_bytes"] for u in updates))
    for n_workers in (2, 4):  # not a byte more for a batch 64 times larger
        assert most[n_workers, 64] == most[n_workers, 4096], most
    for way in (0, 1):
        slope = (most[4, 64][way] - most[2, 64][way]) / 2
        at_eight = most[2, 64][way] + 6 * slope
        assert slope <= 128 and at_eight < 1024, (way, most)


def test_regressor_with_batchnorm_and_geodamp(client):
    X, y = make_regression(n_samples=300, n_features=6, noise=1.0, random_state=0)
    X, y = X.astype(np.float32), (y / y.std()).astype(np.float32)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                            torch.nn.Linear(16, 1))

        def forward(self, x):
            return self.body(x)

    def make(b):
        return DaskRegressor(module=Net, optimizer=torch.optim.SGD, optimizer__lr=0.02, backend=b, max_epochs=3,
                             batch_size=GeoDamp(initial=16, delay=1, factor=2), random_state=2, min_workers=2)

    ps, ar = _both(make, X, y)
    np.testing.assert_allclose(_weights(ar), _weights(ps), rtol=1e-4, atol=1e-5)
    # running statistics: the replicas average theirs every update (the parameter server's workers keep
    # their own between updates, so the two agree only roughly); they came back to the client
    bn = ar.module_.body[1]
    assert bn.num_batches_tracked > 0 and float(bn.running_mean.abs().sum()) > 0
    assert [r["batch_size"] for r in ar.history_] == [16, 32, 64]


@pytest.mark.parametrize("damper", ["adascale", "dynamic-sgd"])
def test_dampers_with_gradient_statistics(data, client, damper):
    X, y = data
    batch = AdaScale(batch_size=64, base_batch_size=16) if damper == "adascale" else \
        DynamicSGD(batch_size=GeoDamp(initial=16, delay=1, factor=2), base_batch_size=16, compensation="velocity")
    ps, ar = _both(lambda b: DaskClassifier(batch_size=batch, optimizer=torch.optim.SGD, optimizer__lr=0.05,
                                            optimizer__momentum=0.9, max_epochs=3, random_state=0, backend=b,
                                            min_workers=2), X, y)
    np.testing.assert_allclose(_weights(ar), _weights(ps), rtol=1e-4, atol=1e-5)
    lrs = [u["lr"] for row in ar.history_ for u in row["updates"]]
    np.testing.assert_allclose(lrs, [u["lr"] for row in ps.history_ for u in row["updates"]], rtol=1e-4)
    if damper == "adascale":  # the gain came from the all-reduced statistics
        assert ar.damper_.gain_ > 1.0
        np.testing.assert_allclose(ar.damper_.gain_, ps.damper_.gain_, rtol=1e-3)


def test_dask_arrays_and_lazy_datasets_on_replicas(data, client):
    """The data paths are the backend's concern only through placement: a dask array's partitions
    and a lazy Dataset (with random transforms, read on the workers) give the parameter server's
    weights."""
    import dask.array as da
    from test_lazy_datasets import ClientForbidden

    X, y = data
    params = {"batch_size": 40, "max_epochs": 2, "random_state": 3, "min_workers": 2}
    dX, dy = da.from_array(X, chunks=64), da.from_array(y, chunks=64)
    ps, ar = _both(lambda b: DaskClassifier(backend=b, **params), dX, dy)
    np.testing.assert_allclose(_weights(ar), _weights(ps), rtol=1e-5, atol=1e-6)
    dataset = ClientForbidden(X, y, noise=0.1, targets=True)
    ps, ar = [DaskClassifier(backend=b, **params).fit(dataset) for b in (PS, AR)]
    np.testing.assert_allclose(_weights(ar), _weights(ps), rtol=1e-5, atol=1e-6)


def test_checkpoint_resume_matches_uninterrupted_fit(data, client, tmp_path):
    from test_elastic import StopAt, Stopped

    X, y = data
    params = {"max_epochs": 3, "random_state": 5, "optimizer": torch.optim.SGD, "optimizer__momentum": 0.9,
              "backend": AR, "batch_size": 32, "min_workers": 2}
    whole = DaskClassifier(**params).fit(X, y)
    path = tmp_path / "ckpt.pt"
    stopped = DaskClassifier(callbacks=[("stop", StopAt(stop=21))], checkpoint=path, checkpoint_every=4, **params)
    with pytest.raises(Stopped):
        stopped.fit(X, y)
    assert path.exists() and not hasattr(stopped, "module_")
    resumed = DaskClassifier(checkpoint=path, **params).fit(X, y)
    np.testing.assert_allclose(_weights(resumed), _weights(whole), rtol=1e-6, atol=1e-7)
    assert [r["n_updates"] for r in resumed.history_] == [r["n_updates"] for r in whole.history_]


def test_warm_partial_fit_takes_changed_optimizer_parameters(data, client):
    """A warm partial_fit resumes the replicas: parameters changed with set_params in between
    (weight decay) reach them, as they reach the parameter server's optimizer."""
    X, y = data
    fits = []
    for backend in (PS, AR):
        est = DaskClassifier(optimizer=torch.optim.SGD, optimizer__momentum=0.9, batch_size=64, random_state=0,
                             backend=backend, min_workers=2)
        est.partial_fit(X, y)
        est.set_params(optimizer__weight_decay=0.5, optimizer__lr=0.05)
        est.partial_fit(X, y)
        fits.append(est)
    assert fits[1].optimizer_.param_groups[0]["weight_decay"] == 0.5
    np.testing.assert_allclose(_weights(fits[1]), _weights(fits[0]), rtol=1e-5, atol=1e-6)
    for est in fits:
        est._kept_backend.claim(None)


def test_non_finite_loss_keeps_the_last_finite_weights(data, client):
    X, y = data
    est = DaskClassifier(optimizer=torch.optim.SGD, optimizer__lr=1e6, batch_size=64, max_epochs=50, backend=AR,
                         random_state=0, min_workers=2)
    with pytest.raises(ConvergenceError, match="Non-finite training loss"):
        est.fit(X, y)
    assert np.isfinite(_weights(est)).all()


def test_bad_backend_is_named_before_any_cluster_work(data):
    with pytest.raises(ValueError, match="backend must be one of"):
        DaskClassifier(backend="ring", client=object()).fit(*data)


# ------------------------------------------------------------------ membership
class _Clusters:
    current = None
    client = None


class AddWorkerAt(Constant):
    """Constant batch that adds a worker at update 3 (test only)."""

    def next_batch_size(self, state):
        if state.n_updates == 3:
            _Clusters.current.scale(3)
            _Clusters.client.wait_for_workers(3)
            time.sleep(2 * MEMBERSHIP_INTERVAL)  # the engine notices it ...
        if state.n_updates == 5:  # ... and sets it up in the background (the first optimizer in a process: ~1 s,
            deadline = time.monotonic() + 60  # far more on a loaded machine): wait until its replica is made
            while sum(map(len, _Clusters.client.run(_replica_weights).values())) < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(0.5)  # its set-up's reply reaches the engine
        return super().next_batch_size(state)


def _replica_weights(dask_worker, fit_id=None):
    from adadamp.worker import plugin as _worker

    return {f: s.flat.detach().numpy().copy() for f, s in _worker.TRAINER.fits.items() if s.replica is not None}


def test_a_joining_worker_gets_the_state_and_the_result_is_the_same(data):
    """A worker added mid-fit joins the next generation with rank 0's weights and optimizer state;
    all replicas end bitwise equal, and the trajectory is the parameter server's."""
    X, y = data
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "random_state": 0, "scale_cluster": False,
              "min_workers": 3}  # the batch on every worker there is
    with _cluster(2) as cluster, Client(cluster) as client:
        _Clusters.current, _Clusters.client = cluster, client
        calm = DaskClassifier(batch_size=32, max_epochs=2, client=client, **params).fit(X, y)
        est = DaskClassifier(batch_size=AddWorkerAt(batch_size=32), client=client, backend=AR, **params)
        est.partial_fit(X, y)  # kept open: the replicas stay on the workers
        est.partial_fit(X, y)
        replicas = [w for ws in client.run(_replica_weights).values() for w in ws.values()]
        workers = _workers_per_update(est)
        est._kept_backend.claim(None)
    assert workers[0] == 2 and workers[-1] == 3
    assert len(replicas) == 3
    for w in replicas:
        np.testing.assert_array_equal(w, _weights(est))
    np.testing.assert_allclose(_weights(est), _weights(calm), rtol=1e-5, atol=1e-6)


def _log_data_moves_and_groups(dask_worker, hold=0.0):
    """Log on this worker, in order, when a data move or a group request arrives and when it
    ends; each data move first waits ``hold`` seconds (without blocking the worker)."""
    import asyncio
    import functools

    events = []
    for op in ("adadamp_data", "adadamp_group"):
        handler = dask_worker.handlers[op]

        @functools.wraps(handler)  # Dask reads the handler's signature
        async def logged(*args, _op=op, _handler=handler, **kwargs):
            events.append(f"{_op} in")
            if _op == "adadamp_data":
                await asyncio.sleep(hold)
            try:
                return await _handler(*args, **kwargs)
            finally:
                events.append(f"{_op} out")

        dask_worker.handlers[op] = logged
    dask_worker.adadamp_test_events = events


def test_a_joiners_group_forms_while_its_data_is_placed(data):
    """Growing from one worker to two, the client asks for the new group while the joiner takes its
    blocks (a data move held 0.5 s here): a data move and the group request are in flight at once,
    instead of one round after the other.  Shared memory off: workers of other hosts take blocks
    (those that map the client's data take none)."""
    X, y = data
    damper = GeoDamp(initial=32, delay=1, factor=2, max_batch_size=64)
    params = {"grads_per_worker": 32, "max_workers": 2, "scale_cluster": False, "random_state": 0, "backend": AR}
    with dask.config.set({"adadamp.shm-dir": ""}), _cluster(2) as cluster, Client(cluster) as client:
        calm = DaskClassifier(batch_size=damper, max_epochs=2, client=client, **params).fit(X, y)  # plugin in place
        client.run(_log_data_moves_and_groups, hold=0.5)
        grown = DaskClassifier(batch_size=damper, max_epochs=2, client=client, **params).fit(X, y)
        events = client.run(lambda dask_worker: list(dask_worker.adadamp_test_events))
    assert [row["n_workers"] for row in grown.history_] == [1, 2]
    overlapped = []  # the workers on which a data move and a group request were in flight at once
    for worker, log in events.items():
        open_ = {"adadamp_data": 0, "adadamp_group": 0}
        for event in log:
            op, _, edge = event.partition(" ")
            open_[op] += 1 if edge == "in" else -1
            if all(open_.values()):
                overlapped.append(worker)
    assert overlapped, events
    np.testing.assert_array_equal(_weights(grown), _weights(calm))


def test_cluster_grows_with_geodamp_and_shrinks(data):
    X, y = data
    X, y = np.tile(X, (4, 1)), np.tile(y, 4)
    damper = GeoDamp(initial=32, delay=1, factor=2, max_batch_size=128)
    with _cluster(1) as cluster, Client(cluster) as client:
        est = DaskClassifier(batch_size=damper, grads_per_worker=32, max_workers=4, scale_cluster=True, max_epochs=3,
                             random_state=0, client=client, backend=AR).fit(X, y)
        workers = _workers_per_update(est)
        assert workers[0] == 1 and max(workers) >= 3
        assert est.history_[-1]["n_samples_seen"] == 3 * len(X)
        est.set_params(batch_size=32, warm_start=True, max_epochs=1).fit(X, y)
        assert est.history_[-1]["n_workers"] == 1
        assert est.history_[-1]["n_samples_seen"] == 4 * len(X)
        calm = DaskClassifier(batch_size=damper, max_epochs=3, random_state=0, client=client,
                              scale_cluster=False).fit(X, y)
        grown = DaskClassifier(batch_size=damper, grads_per_worker=32, max_workers=4, scale_cluster=True,
                               max_epochs=3, random_state=0, client=client, backend=AR).fit(X, y)
    np.testing.assert_allclose(_weights(grown), _weights(calm), rtol=1e-4, atol=1e-5)


class StepDown(Constant):
    """``batch_size`` for the first epoch, then a quarter of it (test only): the cluster shrinks mid-fit."""

    def next_batch_size(self, state):
        return self.forecast_batch_size(state.epoch)

    def forecast_batch_size(self, epoch):
        return int(self.batch_size) if epoch < 2 else int(self.batch_size) // 4


def test_the_cluster_shrinks_mid_fit(data):
    """The batch drops after two epochs: the engine retires workers (their blocks move first),
    the replicas left form the next generation, and the trajectory stays the parameter server's."""
    X, y = data
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "max_epochs": 4, "random_state": 0}
    with _cluster(1) as cluster, Client(cluster) as client:
        calm = DaskClassifier(batch_size=StepDown(batch_size=128), client=client, scale_cluster=False,
                              **params).fit(X, y)
        est = DaskClassifier(batch_size=StepDown(batch_size=128), client=client, backend=AR, scale_cluster=True,
                             grads_per_worker=32, max_workers=3, scale_wait=30.0, **params).fit(X, y)
        workers = _workers_per_update(est)
        peak = workers.index(max(workers))
        assert max(workers) >= 2 and workers[-1] == 1 and min(workers[peak:]) == 1, workers
    np.testing.assert_allclose(_weights(est), _weights(calm), rtol=1e-4, atol=1e-5)
    assert est.history_[-1]["n_samples_seen"] == calm.history_[-1]["n_samples_seen"]


class KillInBackward(torch.nn.Module):
    """An MLP whose worker SIGKILLs itself in the middle of a backward pass once ``marker`` exists
    (the first worker to claim it), while the others already all-reduce their first buckets."""

    def __init__(self, marker="", d=8, classes=3):
        super().__init__()
        self.marker = marker
        self.first = torch.nn.Linear(d, 32)
        self.second = torch.nn.Linear(32, 32)
        self.last = torch.nn.Linear(32, classes)

    def forward(self, x):
        h = torch.relu(self.first(x))
        if h.requires_grad and self.marker:
            h.register_hook(self._maybe_die)
        return self.last(torch.relu(self.second(h)))

    def _maybe_die(self, grad):
        if _claim(self.marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return grad


def _claim(marker: str) -> bool:
    """Whether this process claimed ``marker`` (renamed it: exactly one process does)."""
    try:
        os.rename(marker, marker + ".taken")
    except OSError:
        return False
    return True


class ArmAt(Callback):
    """Creates the marker after update ``at`` (test only)."""

    def __init__(self, marker="", at=5):
        self.marker = marker
        self.at = at

    def on_update_end(self, estimator, record=None, loop=None, **info):
        if loop.n_updates == self.at:
            Path(self.marker).touch()


def test_sigkill_inside_a_collective_recomputes_the_update(data, tmp_path, caplog):
    X, y = data
    marker = str(tmp_path / "kill-now")
    params = {"module": KillInBackward, "module__marker": marker, "optimizer": torch.optim.SGD,
              "optimizer__momentum": 0.9, "batch_size": 48, "max_epochs": 3, "random_state": 4, "scale_cluster": False,
              "backend": AR, "min_workers": 3}
    with dask.config.set({"adadamp.allreduce.bucket-mb": 0.001}), _cluster(3) as cluster, Client(cluster) as client:
        calm = DaskClassifier(client=client, **params).fit(X, y)
        with caplog.at_level(logging.WARNING, logger="adadamp"):
            hurt = DaskClassifier(client=client, callbacks=[("arm", ArmAt(marker=marker, at=5))], **params).fit(X, y)
    assert Path(marker + ".taken").exists()  # a worker died in its backward pass
    assert any("collective failed" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-4, atol=1e-5)
    assert hurt.history_[-1]["n_samples_seen"] == calm.history_[-1]["n_samples_seen"]  # nothing lost or repeated
    assert hurt.history_[-1]["n_updates"] == calm.history_[-1]["n_updates"]
    assert min(_workers_per_update(hurt)) < 3


class KillBetweenUpdates(Callback):
    """SIGKILLs the last worker after update ``at`` (test only)."""

    def __init__(self, at=4):
        self.at = at

    def on_update_end(self, estimator, record=None, loop=None, **info):
        if loop.n_updates == self.at:
            pids = sorted(_Clusters.client.run(os.getpid).values())
            os.kill(pids[-1], signal.SIGKILL)


@pytest.mark.timeout(240)
def test_members_that_do_not_talk_to_the_dead_worker_give_up_at_once(data):
    """At P = 4 gloo tells only the dead worker's neighbours; the others learn it from the
    generation's abort key.  With a collective timeout of 10 minutes, the fit must finish well
    within the test's timeout, with the undisturbed weights."""
    X, y = data
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 64, "max_epochs": 2,
              "random_state": 1, "scale_cluster": False, "backend": AR, "update_timeout": 1300.0, "min_workers": 4}
    with dask.config.set({"adadamp.allreduce.timeout": 600.0}), _cluster(4) as cluster, Client(cluster) as client:
        _Clusters.current, _Clusters.client = cluster, client
        calm = DaskClassifier(client=client, **params).fit(X, y)
        hurt = DaskClassifier(client=client, callbacks=[("kill", KillBetweenUpdates(at=4))], **params).fit(X, y)
    assert min(_workers_per_update(hurt)) == 3
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-4, atol=1e-5)
    assert hurt.history_[-1]["n_samples_seen"] == calm.history_[-1]["n_samples_seen"]


def _die_in_rendezvous(dask_worker, marker=""):
    """Makes this worker SIGKILL itself on its way into the next all-reduce group once ``marker``
    exists (the first worker to claim it), after its peers have started waiting for its keys."""
    from adadamp.worker import generation

    original = getattr(generation.gloo_group, "original", generation.gloo_group)

    def gloo_group(*args, **kwargs):
        if not _claim(marker):
            return original(*args, **kwargs)
        time.sleep(1.0)  # the others wait in the rendezvous by now
        os.kill(os.getpid(), signal.SIGKILL)

    gloo_group.original = original
    generation.gloo_group = gloo_group


def _die_after_the_all_reduce(dask_worker, marker=""):
    """Makes this worker SIGKILL itself once ``marker`` exists (claimed by one process), at the end
    of its next update: its all-reduce completed, its reply not sent."""
    from adadamp.worker import replica

    original = getattr(replica.Replica.update, "original", replica.Replica.update)

    def update(self, *args, **kwargs):
        reply = original(self, *args, **kwargs)
        if not _claim(marker):
            return reply
        os.kill(os.getpid(), signal.SIGKILL)

    update.original = original
    replica.Replica.update = update


def test_a_member_lost_after_its_all_reduce_completed_leaves_the_update_done(data, tmp_path, caplog):
    """With a damper that reads no statistics, the members take each update's step right after
    their reply: a member killed after its all-reduce completed, before it answered, leaves the
    others past that update (they answered and stepped), so the update stands instead of being
    recomputed; the fit ends with the undisturbed weights, nothing lost or repeated."""
    X, y = data
    marker = str(tmp_path / "kill-now")
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 48, "max_epochs": 2,
              "random_state": 4, "scale_cluster": False, "backend": AR, "min_workers": 3}
    with _cluster(3) as cluster, Client(cluster) as client:
        calm = DaskClassifier(client=client, **params).fit(X, y)
        client.run(_die_after_the_all_reduce, marker=marker, workers=[max(client.scheduler_info()["workers"])])
        with caplog.at_level(logging.WARNING, logger="adadamp"):
            hurt = DaskClassifier(client=client, callbacks=[("arm", ArmAt(marker=marker, at=4))], **params).fit(X, y)
    assert Path(marker + ".taken").exists()
    assert any("the update stands" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-4, atol=1e-5)
    assert hurt.history_[-1]["n_samples_seen"] == calm.history_[-1]["n_samples_seen"]
    assert hurt.history_[-1]["n_updates"] == calm.history_[-1]["n_updates"]
    assert min(_workers_per_update(hurt)) < 3


def _replica_steps(dask_worker):
    from adadamp.worker import plugin as _worker

    return [(s.replica.applied, s.replica.pending) for s in _worker.TRAINER.fits.values() if s.replica is not None]


class StepsTaken(Callback):
    """Records, after each update, the replicas' (applied, pending) once every replica took the
    update's step, or after ``wait`` seconds (test only): the next request waits for this callback."""

    def __init__(self, wait=2.0):
        self.wait = wait

    def on_train_begin(self, estimator, **info):
        self.seen_ = []

    def on_update_end(self, estimator, record=None, loop=None, **info):
        client = Client.current()
        deadline = time.monotonic() + self.wait
        while True:
            steps = [s for per in client.run(_replica_steps).values() for s in per]
            if all(a == loop.n_updates for a, _ in steps) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self.seen_.append((loop.n_updates, steps))


@pytest.mark.parametrize("damper", ["constant", "adascale"])
def test_a_step_planned_without_the_rounds_statistics_is_taken_before_the_next_request(data, client, damper):
    """A damper that reads nothing of the round (a constant batch, GeoDamp): the request carries
    the update's own step and each member takes it right after answering, not when the next
    request comes; one that reads the round's statistics (AdaScale) has its step sent with the next
    request (the replicas hold the update's gradient pending meanwhile)."""
    X, y = data
    batch = 48 if damper == "constant" else AdaScale(batch_size=48)
    wait = 2.0 if damper == "constant" else 0.2  # the replicas stay as they are until the next request
    est = DaskClassifier(batch_size=batch, optimizer=torch.optim.SGD, max_epochs=1, backend=AR, random_state=0,
                         min_workers=2, callbacks=[("steps", StepsTaken(wait))]).fit(X, y)
    seen = dict(est.callbacks_)["steps"].seen_
    assert len(seen) > 5
    for n, steps in seen[:-1]:
        assert len(steps) == 2
        if damper == "constant":
            assert steps == [(n, None)] * 2
        else:
            assert steps == [(n - 1, n - 1)] * 2


class StepFails(torch.optim.SGD):
    """An optimizer whose step raises (test only): the client never steps in an all-reduce fit."""

    def step(self, closure=None):
        raise RuntimeError("this step fails on purpose")


@pytest.mark.timeout(120)
def test_a_step_that_raises_after_the_reply_reaches_the_client_as_its_error(data, client):
    """The members take an announced step after their reply; when it raises, the next request
    raises it again and the client hears the error (not a lost worker, whose update would be
    recomputed to fail the same way, round after round)."""
    X, y = data
    est = DaskClassifier(optimizer=StepFails, optimizer__lr=0.1, batch_size=48, max_epochs=2, backend=AR,
                         random_state=0, min_workers=2)
    with pytest.raises(Exception, match="this step fails on purpose"):
        est.fit(X, y)


def test_members_reached_over_dask_take_the_announced_steps_too(data, client):
    """Without the channel (no reply hook) a member takes an update's announced step before its
    next request, group or commit: the same weights, bit for bit."""
    X, y = data
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": GeoDamp(initial=32, delay=1),
              "max_epochs": 3, "backend": AR, "random_state": 0, "min_workers": 2}
    over_channels = DaskClassifier(**params).fit(X, y)
    with dask.config.set({"adadamp.channels": False}):
        over_dask = DaskClassifier(**params).fit(X, y)
    np.testing.assert_array_equal(_weights(over_dask), _weights(over_channels))


@pytest.mark.timeout(280)
def test_a_member_lost_while_forming_a_group_costs_the_abort_time(data, tmp_path, caplog):
    """A worker SIGKILLed while the others wait for it in a group's rendezvous: they give up on
    the generation's abort key (which the client sets when it sees the loss), not after the
    collective timeout (here 120 s), and the fit ends with the undisturbed weights."""
    X, y = data
    marker = str(tmp_path / "die-in-rendezvous")
    timeout = 120.0
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 48, "max_epochs": 2,
              "random_state": 6, "scale_cluster": False, "backend": AR, "update_timeout": 2.5 * timeout,
              "min_workers": 3}
    # the second fit forms its group (it does not take over the one the first would keep)
    with (
        dask.config.set({"adadamp.allreduce.timeout": timeout, "adadamp.allreduce.keep-group": 0}),
        _cluster(3) as cluster,
        Client(cluster) as client,
    ):
        start = time.perf_counter()
        calm = DaskClassifier(client=client, **params).fit(X, y)
        calm_s = time.perf_counter() - start
        client.run(_die_in_rendezvous, marker=marker)
        Path(marker).touch()
        start = time.perf_counter()
        with caplog.at_level(logging.WARNING, logger="adadamp"):
            hurt = DaskClassifier(client=client, **params).fit(X, y)
        hurt_s = time.perf_counter() - start
    lost_s = hurt_s - calm_s
    print(f"undisturbed {calm_s:.1f} s, a member killed in the rendezvous {hurt_s:.1f} s: {lost_s:.1f} s lost")
    assert Path(marker + ".taken").exists()  # a worker died in the rendezvous
    assert any("while forming all-reduce group" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-5, atol=1e-5)
    assert hurt.history_[-1]["n_samples_seen"] == calm.history_[-1]["n_samples_seen"]
    assert lost_s < timeout / 3, f"{lost_s:.1f} s lost to a member killed in the rendezvous"


class KillOnlyWorker(Callback):
    """SIGKILLs the (only) worker after update ``at``, then waits for its nanny's replacement."""

    def __init__(self, at=20):
        self.at = at

    def on_update_end(self, estimator, record=None, loop=None, **info):
        if loop.n_updates == self.at and not getattr(self, "killed_", False):  # once: the epoch runs again
            self.killed_ = True
            (pid,) = _Clusters.client.run(os.getpid).values()
            os.kill(pid, signal.SIGKILL)


class CountUpdates(Callback):
    """Keeps the update number of every ``on_update_end`` call (test only)."""

    def __init__(self):
        self.seen_ = []

    def on_update_end(self, estimator, record=None, loop=None, **info):
        self.seen_.append(loop.n_updates)


def test_losing_every_replica_continues_from_the_clients_copy(data, tmp_path, caplog):
    """One worker, killed mid-epoch: no replica is left, so the epoch continues from the client's
    copy (the replacement worker takes it): the epoch's start, or the last mid-epoch checkpoint,
    which brought the copy up to date.  The fit ends with the undisturbed weights; the epoch's
    history holds each update once, and ``on_update_end`` sees each update number once, in order
    (the recomputed updates are not reported again)."""
    X, y = data
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 32, "max_epochs": 2,
              "random_state": 2, "scale_cluster": False, "backend": AR, "worker_timeout": 60.0}
    with _cluster(1) as cluster, Client(cluster) as client:
        _Clusters.current, _Clusters.client = cluster, client
        calm = DaskClassifier(client=client, **params).fit(X, y)
        with caplog.at_level(logging.WARNING, logger="adadamp"):
            hurt = DaskClassifier(client=client, callbacks=[("kill", KillOnlyWorker(at=20)), ("count", CountUpdates())],
                                  checkpoint=tmp_path / "ckpt.pt", checkpoint_every=3, **params).fit(X, y)
    rollbacks = [r.getMessage() for r in caplog.records if "no replica left" in r.getMessage()]
    assert rollbacks and all("(update 18)" in m for m in rollbacks), rollbacks  # the checkpoint after update 18
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-5, atol=1e-6)
    assert [r["n_updates"] for r in hurt.history_] == [r["n_updates"] for r in calm.history_]
    assert [len(r["updates"]) for r in hurt.history_] == [len(r["updates"]) for r in calm.history_]
    seen = dict(hurt.callbacks_)["count"].seen_
    assert seen == list(range(1, calm.history_[-1]["n_updates"] + 1)), seen


def test_losing_every_replica_at_the_epochs_end_runs_the_epoch_again(data, caplog):
    """The only worker killed after an epoch's last update: its sync, which brings the client's
    copy up to date, finds no replica left.  The epoch runs again from the client's copy (the
    epoch's start), as a loss inside the epoch does, and the fit ends with the undisturbed
    weights; it raised ``NoWorkersError`` before (found by tests/system/stress/soak.py: 1 fit in
    54 of its short mode)."""
    X, y = data
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 32, "max_epochs": 2,
              "random_state": 2, "scale_cluster": False, "backend": AR, "worker_timeout": 60.0}
    last = -(-len(X) // 32)  # the first epoch's last update
    with _cluster(1) as cluster, Client(cluster) as client:
        _Clusters.current, _Clusters.client = cluster, client
        calm = DaskClassifier(client=client, **params).fit(X, y)
        with caplog.at_level(logging.WARNING, logger="adadamp"):
            hurt = DaskClassifier(client=client, callbacks=[("kill", KillOnlyWorker(at=last)), ("count", CountUpdates())],
                                  **params).fit(X, y)
    rollbacks = [r.getMessage() for r in caplog.records if "no replica left" in r.getMessage()]
    assert rollbacks and all("(update 0)" in m for m in rollbacks), rollbacks
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-5, atol=1e-6)
    assert [len(r["updates"]) for r in hurt.history_] == [len(r["updates"]) for r in calm.history_]
    seen = dict(hurt.callbacks_)["count"].seen_
    assert seen == list(range(1, calm.history_[-1]["n_updates"] + 1)), seen


class _StaleRankZero(AllReduce):
    """The all-reduce backend whose first replica is put back to the fit's first state before update
    ``AT``, still counted as current, and a new group formed with it as rank 0 (test only): a replica
    that is behind the fit where the client takes it to be at the fit's update."""

    AT = 5

    def gradient_round(self, batch):
        if self.loop.n_updates == 0 and not hasattr(self, "first_state"):
            self.first_state = self._client_state()
        if self.loop.n_updates == self.AT and self._group and not hasattr(self, "staled"):
            self.staled = self._group[0]
            self.client.run(_load_replica_state, self.fit_id, self.first_state, workers=[self.staled])
            self._group = None  # the next round forms a group, rank 0 the stale replica
        return super().gradient_round(batch)


def _load_replica_state(fit_id, blob, dask_worker=None):
    from adadamp.worker.plugin import TRAINER

    replica = TRAINER.fits[fit_id].replica
    with replica.state.lock:
        replica.load(blob)


def test_a_group_whose_rank_0_is_behind_the_fit_is_not_trusted(data, client, caplog):
    """A group formed from a replica at another update than the fit's (each member reports the
    update its state is at) is not taken: its members are no longer current, and the epoch
    continues from the client's copy.  Before, every member took rank 0's stale state and the fit
    failed at its next update ("replica at update 0 asked for update 5")."""
    X, y = data
    params = {"batch_size": 32, "max_epochs": 2, "random_state": 0, "min_workers": 2, "optimizer__lr": 0.05}
    calm = DaskClassifier(backend=AR, **params).fit(X, y)
    register_backend("allreduce-stale-rank-0", _StaleRankZero)
    try:
        with caplog.at_level(logging.WARNING, logger="adadamp"):
            hurt = DaskClassifier(backend="allreduce-stale-rank-0", **params).fit(X, y)
    finally:
        backend_registry._BACKENDS.pop("allreduce-stale-rank-0")
    messages = [r.getMessage() for r in caplog.records]
    assert any("behind the fit's update 5" in m for m in messages), messages
    assert any("no replica left after 5 updates" in m for m in messages), messages
    np.testing.assert_allclose(_weights(hurt), _weights(calm), rtol=1e-5, atol=1e-6)
    assert [r["n_updates"] for r in hurt.history_] == [r["n_updates"] for r in calm.history_]


# ------------------------------------------------------------------ pieces
def test_buckets_launch_in_order_during_the_backward_pass():
    """Buckets are contiguous ranges of the flat gradient, the last parameters first, launched by
    the backward pass's hooks as they fill."""
    from adadamp.wire.parameters import flatten_parameters

    module = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                 torch.nn.Linear(64, 4))
    _, grads = flatten_parameters(module)
    buckets = Buckets(list(module.parameters()), grads, bucket_bytes=64 * 64 * 4, first_bytes=4 * 65 * 4)
    covered = sorted(buckets.ranges)
    assert covered[0][0] == 0 and covered[-1][1] == grads.numel()
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))
    assert buckets.ranges[0][1] == grads.numel()  # the first bucket holds the last layer

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))  # a real group of one
    buckets.start(group)
    grads.zero_()
    module(torch.randn(5, 8)).sum().backward()
    early = buckets.launched
    buckets.finish(lambda work: work.wait())
    assert early == len(buckets.ranges)  # all launched by the backward pass's hooks, in order
    assert float(grads.abs().sum()) > 0
    buckets.close()


def _as_two_members(member) -> None:
    """Run ``member(rank)`` for ranks 0 and 1 at once, in threads (a real gloo group of two)."""

    threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_buckets_read_the_chunk_statistics_before_their_all_reduce():
    """AdaScale's statistics (each member's own gradient) do not hold the all-reduce back: two
    members (threads, a real gloo group of two) launch every bucket during the backward pass, and
    each statistic is that member's local gradient, not the all-reduced sum."""

    from adadamp.wire.parameters import flatten_parameters
    from adadamp.worker.gradient import ChunkStatistic

    store, results = dist.HashStore(), {}

    def member(rank):
        torch.manual_seed(0)  # the same weights on both
        module = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        _, grads = flatten_parameters(module)
        buckets = Buckets(list(module.parameters()), grads, bucket_bytes=64 * 8 * 4, first_bytes=4 * 65 * 4)
        group = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=30))
        X = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank + 1))
        grads.zero_()
        module(X).square().sum().backward()
        local = grads.double().clone()  # the member's own gradient sum, computed without buckets
        grads.zero_()
        statistic = ChunkStatistic(grads, 6, None, None)
        buckets.start(group, statistic)
        module(X).square().sum().backward()
        launched = buckets.launched
        buckets.finish(lambda work: work.wait())  # the all-reduce is done: the statistic was read before
        results[rank] = (launched, len(buckets.ranges), statistic.total(), local, grads.double().clone())
        buckets.close()

    _as_two_members(member)
    (l0, n0, s0, g0, sum0), (l1, n1, s1, g1, sum1) = results[0], results[1]
    assert l0 == n0 > 1 and l1 == n1 > 1  # every bucket left during the backward pass
    assert s0 == pytest.approx(float(g0.square().sum()) / 6, rel=1e-9)
    assert s1 == pytest.approx(float(g1.square().sum()) / 6, rel=1e-9)
    assert s0 != pytest.approx(s1, rel=1e-3)  # the two members' own, not the sum's
    torch.testing.assert_close(sum0, g0 + g1, rtol=1e-5, atol=1e-6)  # and the sum was all-reduced
    torch.testing.assert_close(sum1, sum0)


def test_the_mean_gradient_is_taken_bucket_by_bucket_as_the_buckets_arrive():
    """A member divides each all-reduced bucket by the batch's size (and adds up its squared norm)
    as it comes in, while the later buckets are still being all-reduced: the mean bitwise the one
    divided at once, the norm the whole gradient's up to float32 summation."""

    from adadamp.wire.parameters import flatten_parameters, squared_norm
    from adadamp.worker.replica import _MeanOfBuckets

    store, results = dist.HashStore(), {}

    def member(rank):
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                     torch.nn.Linear(64, 4))
        _, grads = flatten_parameters(module)
        buckets = Buckets(list(module.parameters()), grads, bucket_bytes=64 * 64 * 4, first_bytes=4 * 65 * 4)
        group = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=30))
        X = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank + 1))
        arrived, mean = [], _MeanOfBuckets(grads, 12)

        def take(lo, hi):  # a bucket in (the ones after it not waited for yet)
            arrived.append((lo, hi))
            mean(lo, hi)

        grads.zero_()
        buckets.start(group)
        module(X).square().sum().backward()
        buckets.finish(lambda work: work.wait(), take)
        summed = grads.clone()
        grads.zero_()  # the same again, divided at once after every bucket is in
        buckets.start(group)
        module(X).square().sum().backward()
        buckets.finish(lambda work: work.wait())
        results[rank] = (arrived, mean.sq_norm, summed, grads.mul_(1.0 / 12.0).clone(), buckets.ranges)
        buckets.close()

    _as_two_members(member)
    for rank in (0, 1):
        arrived, sq_norm, by_bucket, at_once, ranges = results[rank]
        assert len(ranges) > 2 and arrived == ranges  # every bucket, in launch order
        assert torch.equal(by_bucket, at_once)  # bitwise
        assert sq_norm == pytest.approx(squared_norm(at_once), rel=1e-6)
    assert torch.equal(results[0][2], results[1][2])


def test_only_criteria_that_weigh_examples_alike_divide_by_the_batch_size_early():
    from adadamp.sample_weight import SampleWeightedLoss
    from adadamp.worker.gradient import weights_are_counts

    nn = torch.nn
    assert weights_are_counts(nn.CrossEntropyLoss()) and weights_are_counts(nn.MSELoss())
    assert weights_are_counts(nn.NLLLoss(reduction="sum"))
    assert not weights_are_counts(nn.CrossEntropyLoss(weight=torch.ones(3)))
    assert not weights_are_counts(nn.CrossEntropyLoss(ignore_index=0))  # a label can hit it
    assert not weights_are_counts(SampleWeightedLoss(nn.CrossEntropyLoss(), torch.int64, 1))


def test_device_placement_picks_nccl_for_cuda_and_gloo_otherwise():
    """The CUDA path (NCCL) cannot run here (no GPU); what it chooses is checked on the CPU."""
    assert collective_backend("cpu") == "gloo"
    assert collective_backend(torch.device("cuda", 0)) == "nccl"
    assert collective_backend("cuda") == "nccl"


def test_the_joiners_payload_is_the_states_size_not_the_flat_buffers_times_the_tensors():
    """The client's parameters and gradients are views into two flat buffers, and pickling a view
    writes its whole storage: the payload made at every commit (a ResNet-18-size module) was 6 GB of
    client memory and 15 s after the fit's last update.  A bound on its size, not a time."""
    from types import SimpleNamespace

    import cloudpickle
    from torch import nn

    from adadamp.engine.backends.allreduce import AllReduce
    from adadamp.wire.parameters import flatten_parameters

    module = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])  # 16 tensors
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    module(torch.ones(4, 64)).sum().backward()
    optimizer.step()
    flatten_parameters(module)
    n = sum(p.numel() for p in module.parameters())
    state_bytes = 3 * 4 * n  # weights, gradients, momentum
    owner = SimpleNamespace(module=module, criterion=nn.MSELoss(), device="cpu", optimizer=optimizer)
    payload = AllReduce.module_payload(owner)
    assert len(payload) < 1.2 * state_bytes + 64 * 1024, (len(payload), state_bytes)
    loaded, _, _, opt, _attributes = cloudpickle.loads(payload)
    assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), module.parameters()))
    assert opt.param_groups[0]["params"][0] is next(loaded.parameters())  # the optimizer on the copy's parameters
