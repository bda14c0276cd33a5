"""The set-up path of a warm fit, counted (issue 30): what a second ``fit`` on a warm cluster asks of
the scheduler and of each worker, and the bytes it copies.  No clock is read: a regression (an
extra scheduler round, the worker plugin registered again, a data copy, a worker touched twice)
changes a count."""

import collections
import functools

import dask
import numpy as np
import pytest
import torch
from conftest import two_worker_cluster
from distributed import Client
from torch import nn

from adadamp import DaskClassifier
from adadamp.data import sources
from adadamp.wire import shm

#: What the scheduler's and the workers' RPC handlers were asked, in this process (each counts its own).
_CALLS: collections.Counter = collections.Counter()

#: Scheduler ops whose count follows the fit's duration, not its set-up: the membership's look at the
#: worker list (``identity``, every ``MEMBERSHIP_INTERVAL``), the live page's progress (``log_event``,
#: every half second), the workers' heartbeats, and the all-reduce group's rendezvous polls.
PERIODIC = {"identity", "log_event", "heartbeat_worker", "get_metadata", "cluster info"}
#: The cluster manager's ``set_metadata`` of its info (every second, whatever runs), counted apart.
CLUSTER_INFO = "cluster info"


def _count_handlers(dask_scheduler=None, dask_worker=None) -> None:
    """Wrap every RPC handler of this server so that each call is counted in ``_CALLS`` (idempotent)."""
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    for op, handler in list(server.handlers.items()):
        if getattr(handler, "_counted", False):
            continue

        @functools.wraps(handler)  # Dask reads the handler's signature (``comm`` first, ``serializers``)
        def counted(*args, _op=op, _handler=handler, **kwargs):
            info = list(kwargs.get("keys") or ()) == ["cluster-manager-info"]  # a list or, at times, a tuple
            _CALLS[CLUSTER_INFO if info else _op] += 1
            return _handler(*args, **kwargs)

        counted._counted = True
        server.handlers[op] = counted
    _CALLS.clear()


def _read(dask_scheduler=None, dask_worker=None) -> dict:
    out = dict(_CALLS)
    _CALLS.clear()
    return out


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.fixture(scope="module")
def client():
    """A cluster of this module's own: the counts would also see other tests' fits on the session
    cluster, such as a kept all-reduce backend that releases (``set_metadata``) when its timer fires."""
    with two_worker_cluster() as cluster, Client(cluster, set_as_default=False) as client, client.as_current():
        yield client


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((512, 16), dtype=np.float32), rng.integers(0, 4, 512)


@pytest.mark.parametrize("backend", ["parameter-server", "allreduce"])
def test_a_warm_fits_setup_asks_each_worker_once_and_copies_the_data_once(backend, client, data, monkeypatch):
    X, y = data
    copied = []
    share_data = shm.SharedBuffers.share_data

    def counting_share_data(self, **arrays):
        copied.append(sum(a.nbytes for a in arrays.values()))
        return share_data(self, **arrays)

    monkeypatch.setattr(shm.SharedBuffers, "share_data", counting_share_data)
    hashed = []
    digest = sources.data_digest
    monkeypatch.setattr(sources, "data_digest", lambda X, y: hashed.append(len(X)) or digest(X, y))

    def fit():
        return DaskClassifier(module=_mlp(), batch_size=128, max_epochs=1, min_workers=2, client=client,
                              backend=backend, random_state=0).fit(X, y)

    fit()  # the cluster's first fit (and the workers' first torch calls)
    workers = sorted(client.scheduler_info()["workers"])
    assert len(workers) == 2
    client.run(_count_handlers)
    client.run_on_scheduler(_count_handlers)
    copied.clear()
    hashed.clear()
    est = fit()
    scheduler = client.run_on_scheduler(_read)
    per_worker = client.run(_read)
    assert est.history_[-1]["n_workers"] == 2

    # scheduler: no plugin registration (the trainer's on the workers, the live page's), no broadcast
    asked = {op: n for op, n in scheduler.items() if op not in PERIODIC}
    assert "register_worker_plugin" not in asked and "broadcast" not in asked, asked  # nor the live page's
    # the fit's grant from the cluster's allocator: declared (and renewed by the membership watcher
    # every half second) and given back once; the allocator itself is registered only once
    assert asked.pop("adadamp_allocate", 0) >= 1 and asked.pop("adadamp_release_grant", 0) == 1, asked
    expected = {"run_function": 1}  # this test's own _read
    if backend == "allreduce":  # the fit's rendezvous keys emptied at the end: none written (the group is kept)
        expected["set_metadata"] = 1
    assert asked == expected, asked

    # each worker: its plugin left alone; set up once (it maps the data: no block is placed), released once
    for w in workers:
        ops = {op: n for op, n in per_worker[w].items() if op != "run"}  # "run": this test's _read
        assert "plugin-add" not in ops and "plugin-remove" not in ops, (w, ops)
        adadamp = {op: n for op, n in ops.items() if op.startswith("adadamp_")}
        want = {"adadamp_setup": 1, "adadamp_release": 1}
        if backend == "allreduce":
            want.update(adadamp_group=1, adadamp_commit=1)
        assert adadamp == want, (w, ops)

    # bytes: the training data copied into shared memory once; no block crosses a socket; none hashed
    # (the data's token names a backend kept for the next call: a fit keeps none)
    assert copied == [X.nbytes + y.astype(np.int64).nbytes]
    assert hashed == []


def _trainer_stats(dask_worker=None) -> dict:
    from adadamp.worker.plugin import TRAINER

    out = dict(TRAINER.stats)
    TRAINER.stats.clear()
    return out


def _drop_kept_group(dask_worker=None) -> None:
    from adadamp.worker import groups

    groups.drop()


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def test_a_warm_all_reduce_fit_takes_the_group_the_last_fit_kept(client, data):
    """Consecutive all-reduce fits on the same workers: the second forms no group (no rendezvous,
    no connections) and sends no state (every replica was set up from the same payload), and
    trains the same weights, bit for bit, as a fit on workers that kept nothing."""
    X, y = data

    def fit():
        return DaskClassifier(module=_mlp(), optimizer=torch.optim.SGD, optimizer__momentum=0.9, batch_size=64,
                              max_epochs=2, min_workers=2, client=client, backend="allreduce",
                              random_state=0).fit(X, y)

    client.run(_drop_kept_group)
    with dask.config.set({"adadamp.allreduce.keep-group": 0}):
        cold = fit()  # forms its group and keeps none
    fit()  # forms its group and keeps it
    client.run(_trainer_stats)
    warm = fit()
    stats = client.run(_trainer_stats)
    assert len(stats) == 2
    for w, counts in stats.items():
        assert counts.get("setups") == 1, (w, counts)
        assert counts.get("groups_formed", 0) == 0 and counts.get("groups_reused") == 1, (w, counts)
        assert counts.get("state_broadcasts", 0) == 0, (w, counts)
    np.testing.assert_array_equal(_weights(warm), _weights(cold))


def test_a_warm_all_reduce_partial_fit_sets_nothing_up(client, data):
    """A warm ``partial_fit`` on the same data resumes the replicas and their group: no set-up, no
    group formed or taken over, no state sent."""
    X, y = data
    est = DaskClassifier(module=_mlp(), batch_size=64, min_workers=2, client=client, backend="allreduce",
                         random_state=0)
    est.partial_fit(X, y)
    client.run(_trainer_stats)
    est.partial_fit(X, y)
    stats = client.run(_trainer_stats)
    est._kept_backend.claim(None)
    assert len(stats) == 2
    for w, counts in stats.items():
        assert not any(counts.get(k) for k in ("setups", "groups_formed", "groups_reused", "state_broadcasts")), (
            w, counts)
