"""An all-reduce group kept on the workers between fits (issue 30, item 3): taken over only by a
fit on the same workers in the same rank order, dropped when the membership changes or a member
dies, given up cleanly when a member no longer has it or two fits took it on different members,
and gone (its sockets closed) when no fit takes it in time -- after its client went away, too.
Every fit trains the weights a fit on workers that kept nothing trains, bit for bit."""

import datetime
import gc
import logging
import os
import signal
import threading
import time

import dask
import numpy as np
import psutil
import pytest
import torch
import torch.distributed as dist
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.engine.backends import allreduce
from adadamp.wire.parameters import flatten_parameters
from adadamp.worker.replica import Replica
from adadamp.worker.state import FitState

KEEP = "adadamp.allreduce.keep-group"


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=384, n_features=8, n_informative=6, n_classes=3, random_state=3)
    return X.astype(np.float32), y


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _fit(client, X, y, workers=2, **params):
    return DaskClassifier(optimizer=torch.optim.SGD, optimizer__lr=0.05, optimizer__momentum=0.9, batch_size=48,
                          max_epochs=2, random_state=0, backend="allreduce", client=client, min_workers=workers,
                          max_workers=workers, scale_cluster=False, **params).fit(X, y)


def _stats(dask_worker=None) -> dict:
    from adadamp.worker.plugin import TRAINER

    out = {k: v for k, v in TRAINER.stats.items() if k.startswith(("groups_", "state_"))}
    TRAINER.stats.clear()
    return out


def _offer(dask_worker=None):
    from adadamp.worker import groups

    return groups.offer()


def _drop(dask_worker=None) -> None:
    from adadamp.worker import groups

    groups.drop()


def _summed(stats: dict, key: str) -> int:
    return sum(s.get(key, 0) for s in stats.values())


def test_a_changed_membership_or_a_dead_member_forms_a_new_group(data):
    """On 3 workers: a fit on 2 keeps their group; a fit on all 3 forms its own (the 2 drop theirs);
    after a member is SIGKILLed, a fit on 2 of the others forms its own again; the next one on the
    same 2 takes theirs.  The weights never move."""
    X, y = data
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None,
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        with dask.config.set({KEEP: 0}):
            cold = _weights(_fit(client, X, y))
            cold3 = _weights(_fit(client, X, y, workers=3))
        client.run(_stats)
        np.testing.assert_array_equal(_weights(_fit(client, X, y)), cold)
        assert _summed(client.run(_stats), "groups_formed") == 2
        kept = {w: o for w, o in client.run(_offer).items() if o is not None}
        assert len(kept) == 2 and len({o["key"] for o in kept.values()}) == 1

        np.testing.assert_array_equal(_weights(_fit(client, X, y, workers=3)), cold3)
        stats = client.run(_stats)
        assert _summed(stats, "groups_formed") == 3 and _summed(stats, "groups_reused") == 0
        offers = client.run(_offer)
        assert all(o is not None and len(o["members"]) == 3 for o in offers.values())  # the 2-member group dropped

        victim = min(offers)
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while victim in client.scheduler_info()["workers"] or len(client.scheduler_info()["workers"]) < 3:
            assert time.monotonic() < deadline, "the nanny did not replace the killed worker"
            time.sleep(0.2)
        client.run(_stats)
        np.testing.assert_array_equal(_weights(_fit(client, X, y)), cold)
        stats = client.run(_stats)
        assert _summed(stats, "groups_formed") == 2 and _summed(stats, "groups_reused") == 0
        np.testing.assert_array_equal(_weights(_fit(client, X, y)), cold)
        stats = client.run(_stats)
        assert _summed(stats, "groups_formed") == 0 and _summed(stats, "groups_reused") == 2


def test_a_member_that_lost_the_kept_group_costs_one_formation(client, data, monkeypatch):
    """The client believes both members keep the group, but one dropped it: that one refuses, the
    other gives the group up too, and the fit forms a new one; the same weights."""
    X, y = data
    with dask.config.set({KEEP: 0}):
        cold = _weights(_fit(client, X, y))
    _fit(client, X, y)
    offers = client.run(_offer)
    first, second = sorted(offers)
    client.run(_drop, workers=[second])
    seen = {}
    setup_reply = allreduce.AllReduce.setup_reply

    def stale(self, worker, reply):  # the second worker offers what the first keeps
        seen[worker] = reply.kept
        reply.kept = offers[first]
        setup_reply(self, worker, reply)

    monkeypatch.setattr(allreduce.AllReduce, "setup_reply", stale)
    client.run(_stats)
    np.testing.assert_array_equal(_weights(_fit(client, X, y)), cold)
    assert seen[second] is None
    stats = client.run(_stats)
    assert _summed(stats, "groups_reused") == 0 and _summed(stats, "groups_formed") == 2


def _listening(dask_worker=None) -> int:
    """TCP ports this worker process listens on (a gloo group's device listens on one)."""
    gc.collect()  # what only a garbage collection frees is not what this test is about
    return sum(1 for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN)


def test_a_group_no_fit_takes_is_dropped_after_its_client_went_away(cluster, data):
    """A fit of a client that then closes keeps its group for ``keep-group`` seconds; then the
    workers drop it and close its sockets."""
    X, y = data
    with Client(cluster, set_as_default=False) as other:
        other.run(_drop)
        with dask.config.set({KEEP: 0}):
            _fit(other, X, y)
        before = other.run(_listening)
    with Client(cluster, set_as_default=False) as gone:
        with dask.config.set({KEEP: 2.0}):
            _fit(gone, X, y)
        assert all(o is not None for o in gone.run(_offer).values())
    with Client(cluster, set_as_default=False) as other:
        held = other.run(_listening)
        assert all(held[w] > before[w] for w in held), (before, held)
        deadline = time.monotonic() + 20
        while any(o is not None for o in other.run(_offer).values()) or other.run(_listening) != before:
            assert time.monotonic() < deadline, (other.run(_offer), other.run(_listening), before)
            time.sleep(0.2)


def _member(fit_id: str, rank: int, group, store) -> Replica:
    module = torch.nn.Linear(4, 2)
    flat, grads = flatten_parameters(module)
    state = FitState(module, torch.nn.MSELoss(), torch.device("cpu"), flat, grads, n_total=4)
    member = Replica(state, torch.optim.SGD(module.parameters(), lr=0.1), fit_id=fit_id, worker=None, timeout=5.0,
                     bucket_mb=1.0, applied=0)
    member.group, member.rank, member.size, member.generation, member._prefix = group, rank, 2, 1, store
    return member


@pytest.mark.parametrize("same_fit", [True, False])
def test_the_handshake_tells_two_fits_on_one_kept_group_apart(same_fit):
    """Two fits that each took a kept group on one of its two members: the handshake over the group
    fails on both (neither trains with the other's member); one fit on both members passes."""
    store = dist.HashStore()
    groups = [None, None]

    def connect(rank):
        groups[rank] = dist.ProcessGroupGloo(dist.PrefixStore("g", store), rank, 2, datetime.timedelta(seconds=5))

    threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    members = [_member("adadamp-a" if same_fit or r == 0 else "adadamp-b", r, groups[r], dist.PrefixStore("g", store))
               for r in range(2)]
    errors = [None, None]

    def shake(rank):
        try:
            members[rank]._handshake()
        except RuntimeError as err:
            errors[rank] = err

    threads = [threading.Thread(target=shake, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if same_fit:
        assert errors == [None, None]
    else:
        assert all(e is not None and "taken by another fit" in str(e) for e in errors), errors


def test_a_dropped_group_is_destroyed_off_the_path_that_forms_the_next():
    """Destroying a gloo group closes its sockets to every peer (tens of ms): a member dropping the
    kept group, or the last generation's, must not make the group forming now wait for that."""
    from adadamp.worker import groups

    destroyed = threading.Event()
    where = []

    class Group:  # stands for the gloo group: records the thread its last reference went on
        def __del__(self):
            where.append(threading.current_thread().name)
            destroyed.set()

    groups.keep(groups.KeptGroup("fit/1", Group(), object(), ("a", "b"), 0, 60.0), 60.0)
    groups.drop()
    assert destroyed.wait(5.0) and where == ["adadamp-release-group"]
    destroyed.clear()
    groups.keep(groups.KeptGroup("fit/2", Group(), object(), ("a", "b"), 0, 60.0), 60.0)
    groups.keep(groups.KeptGroup("fit/3", object(), object(), ("a", "b"), 0, 60.0), 60.0)  # replaces fit/2
    assert destroyed.wait(5.0) and where[-1] == "adadamp-release-group"
    groups.drop()
