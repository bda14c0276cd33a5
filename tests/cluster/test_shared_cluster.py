"""Many fits, one cluster (adadamp.cluster.allocator): fits that share a growing cluster get disjoint
workers, never lose a granted worker to another fit, find the workers a previous fit left warm,
and the cluster shrinks lazily through Dask's graceful retirement.  Real LocalClusters of worker
processes; the division itself is checked over many drawn workloads without a cluster."""

import logging
import threading
import time
from typing import ClassVar

import dask
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from torch import nn

from adadamp import DaskRegressor
from adadamp.callbacks import Callback
from adadamp.cluster import adapt
from adadamp.cluster.adaptive import ensure_allocator
from adadamp.cluster.allocator import NAME
from adadamp.cluster.division import divide, lend, shares
from adadamp.dampers import GeoDamp
from adadamp.modules import MLP
from benchmarks.common.emulated import Emulated


# ---------------------------------------------------------------------- the division, drawn widely
@pytest.mark.parametrize("seed", range(40))
def test_grants_are_disjoint_fair_and_keep_what_fits_hold(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        n_workers, n_fits = int(rng.integers(0, 12)), int(rng.integers(1, 7))
        workers = [f"w{i}" for i in rng.permutation(n_workers)]
        wants = {f"f{i}": int(rng.integers(0, 9)) for i in range(n_fits)}
        capacity = float(rng.choice([0, n_workers, n_workers + int(rng.integers(0, 6)), np.inf]))
        held, pool = {}, list(workers) + ["gone"]
        for fit in wants:  # each fit held some of the workers (disjoint), maybe one that left since
            k = int(rng.integers(0, len(pool) + 1))
            held[fit], pool = pool[:k], pool[k:]
        grants = divide(workers, wants, held, capacity)
        share = shares(wants, max(capacity, n_workers))
        granted = [w for g in grants.values() for w in g]
        assert set(granted) <= set(workers)
        for w in set(granted):  # disjoint, but for fits left with none, which borrow one worker each
            holders = [g for g in grants.values() if w in g]
            if len(holders) > 1:
                assert sum(len(g) > 1 for g in holders) <= 1, grants
                assert set(workers) <= set(granted)  # only when no worker is free
        for fit, want in wants.items():
            assert len(grants[fit]) <= max(share[fit], 1 if want and workers else 0)
            kept = [w for w in held[fit] if w in workers][: share[fit]]
            assert set(kept) <= set(grants[fit])  # nobody takes what a fit holds within its share
            if want and workers:
                assert grants[fit]  # every fit trains on something
        if sum(wants.values()) <= n_workers:
            assert all(len(grants[f]) == w for f, w in wants.items())  # room for all: all they want
        assert sum(share.values()) <= max(capacity, n_workers)


@pytest.mark.parametrize("seed", range(20))
def test_only_workers_no_fit_holds_are_lent_and_a_fit_keeps_what_it_was_lent(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        workers = [f"w{i}" for i in range(int(rng.integers(0, 10)))]
        fits = [f"f{i}" for i in range(int(rng.integers(1, 5)))]
        grants, before = {}, {}
        for split, out in ((list(rng.permutation(workers)), grants), (list(rng.permutation(workers)), before)):
            for fit in fits:  # disjoint within the grants, and within the last division's lends
                k = int(rng.integers(0, len(split) + 1))
                out[fit], split = [str(w) for w in split[:k]], split[k:]
        borrow = {f: int(rng.integers(0, 4)) for f in fits}
        lent = lend(workers, grants, borrow, before)
        held = {w for g in grants.values() for w in g}
        given = [w for g in lent.values() for w in g]
        assert len(given) == len(set(given)) and not set(given) & held  # disjoint, and no one's share
        assert all(len(lent.get(f, [])) <= borrow[f] for f in fits)
        free = [w for w in workers if w not in held]
        assert len(given) == min(len(free), sum(borrow.values()))  # no free worker idles while a fit can use it
        for f in fits:  # what a fit was lent and is still free, it keeps (up to what it would use)
            assert set([w for w in before[f] if w in free][: borrow[f]]) <= set(lent.get(f, [])), (f, before, lent)


def _concave(rng, most: int) -> list[float]:
    """A speedup curve that grows less with each worker (1 on one worker)."""
    steps = np.sort(rng.uniform(0, 1, size=most - 1))[::-1]
    return [1.0, *(1.0 + np.cumsum(steps)).tolist()]


@pytest.mark.parametrize("seed", range(30))
def test_fits_that_predict_their_speedup_divide_their_shares_to_the_largest_sum(seed):
    """Against every division of the pooled shares (brute force): the deal maximizes the sum of the
    speedups, each fit keeps one worker, and the fits without a curve keep their fair shares."""
    import itertools

    rng = np.random.default_rng(seed)
    n_fits, capacity = int(rng.integers(2, 5)), int(rng.integers(1, 10))
    wants = {f"f{i}": int(rng.integers(1, 7)) for i in range(n_fits)}
    curved = [f for f in wants if rng.random() < 0.7] or ["f0"]
    speedups = {f: _concave(rng, wants[f]) for f in curved}
    fair = shares(wants, capacity)
    got = shares(wants, capacity, speedups)
    assert {f: got[f] for f in wants if f not in curved} == {f: fair[f] for f in wants if f not in curved}
    pool = sum(fair[f] for f in curved)
    assert sum(got[f] for f in curved) <= pool
    assert all(got[f] >= min(1, pool) for f in curved[:pool])

    def total(division):
        return sum(speedups[f][k - 1] for f, k in zip(curved, division) if k)

    best = max(total(d) for d in itertools.product(*(range(wants[f] + 1) for f in curved))
               if sum(d) <= pool and all(k >= 1 for k in d[: min(pool, len(d))]))
    assert total([got[f] for f in curved]) >= best - 1e-9


def test_shares_are_max_min_fair():
    assert shares({"a": 6, "b": 1, "c": 4}, 8) == {"a": 4, "b": 1, "c": 3}
    assert shares({"a": 6, "b": 6}, 3) == {"a": 2, "b": 1}  # the earlier fit gets the remainder
    assert shares({"a": 2, "b": 0}, 8) == {"a": 2, "b": 0}


# ---------------------------------------------------------------------- on real clusters
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(10, 1)

    def forward(self, x):
        return self.layer(x)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12000, 10)).astype("float32")
    return X, X.sum(1, keepdims=True).astype("float32")


def growing(client, **params) -> DaskRegressor:
    """GeoDamp 64 -> 384: one worker, then two, then three (grads_per_worker=128)."""
    schedule = {"batch_size": GeoDamp, "batch_size__initial": 64, "batch_size__delay": 1, "batch_size__factor": 2,
                "batch_size__max_batch_size": 384}
    if "batch_size" in params:
        schedule = {}
    return DaskRegressor(**{"module": Net, "grads_per_worker": 128, "max_workers": 3, "scale_cluster": True,
                            "max_epochs": 8, "random_state": 0, "client": client, **schedule, **params})


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _grants(dask_scheduler):
    allocator = dask_scheduler.plugins.get(NAME)
    return {} if allocator is None else {f: list(g) for f, g in allocator.grants.items()}


def _grants_and_wants(dask_scheduler):
    """Each fit's grant and the workers it wants now (not ahead: those are set up, not trained on)."""
    allocator = dask_scheduler.plugins[NAME]
    return {f: (list(e.grant), e.want) for f, e in allocator.fits.items()}


def _running_and_grants(dask_scheduler):
    """In one look (the scheduler's loop): the running workers and the grants."""
    running = sum(ws.status.name == "running" for ws in dask_scheduler.workers.values())
    return running, _grants(dask_scheduler)


class Watch:
    """Samples the cluster every 0.1 s while fits run: its running workers and the allocator's grants."""

    def __init__(self, client):
        self.client, self.samples, self._stop = client, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            with self.client.as_current():
                self.samples.append(self.client.run_on_scheduler(_running_and_grants))
            time.sleep(0.1)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.samples


@pytest.fixture
def growing_cluster():
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield cluster, client


def test_a_fit_that_starts_never_takes_a_worker_another_fit_holds(growing_cluster, data):
    cluster, client = growing_cluster
    alone = growing(client).fit(*data)
    adapt(cluster, maximum=4)  # room for both fits' wants: 3 + 1
    watch = Watch(client)
    results = {}
    first = threading.Thread(target=lambda: results.update(a=growing(client).fit(*data)))
    first.start()
    deadline = time.monotonic() + 60
    while not any(len(g) == 3 and n == 3 for g, n in client.run_on_scheduler(_grants_and_wants).values()):  # A trains on 3
        assert time.monotonic() < deadline and first.is_alive(), "the first fit never reached 3 workers"
        time.sleep(0.05)
    results["b"] = growing(client, batch_size=64).fit(*data)  # one worker
    first.join()
    samples = watch.stop()
    a_workers = [row["n_workers"] for row in results["a"].history_]
    top = a_workers.index(3)
    assert a_workers[top:] == [3] * (len(a_workers) - top)  # never fewer once it had them
    assert {row["n_workers"] for row in results["b"].history_} == {1}
    for n, grants in samples:
        held = [w for g in grants.values() for w in g]
        # disjoint once the cluster has room for both (3 + 1); while B's worker starts, B trains on
        # one of A's rather than wait (adadamp.cluster.division.divide)
        assert len(held) == len(set(held)) or n < 4, (n, grants)
    np.testing.assert_array_equal(_weights(results["a"]), _weights(alone))  # the grant changes nothing trained


def test_a_fit_sharing_a_worker_moves_to_the_new_one_as_soon_as_it_runs(growing_cluster):
    """A worker registers as starting and reports running a moment later: the grants are divided
    again then, not at the fits' next renewal (none happens here)."""
    cluster, client = growing_cluster
    client.wait_for_workers(1)
    ensure_allocator(client)
    for fit in ("a", "b"):
        client.sync(client.scheduler.adadamp_allocate, fit=fit, want=1, ahead=1, most=1, least=1)
    first = client.run_on_scheduler(_running_and_grants)
    assert first[1]["a"] == first[1]["b"]  # one worker: b shares a's
    cluster.scale(2)
    deadline = time.monotonic() + 60
    while (look := client.run_on_scheduler(_running_and_grants))[0] < 2:
        assert time.monotonic() < deadline, "the second worker never ran"
        time.sleep(0.02)
    assert not set(look[1]["a"]) & set(look[1]["b"]), look


def test_a_fit_whose_speedup_grows_more_gets_more_of_a_full_cluster(growing_cluster):
    """Two fits that predict their speedup on a cluster of 3 workers, each able to use all 3: the
    one that gains little from more workers (declared first, so the fair split would give it 2)
    keeps one, the other gets two; grants stay disjoint."""
    cluster, client = growing_cluster
    cluster.scale(3)
    client.wait_for_workers(3)
    ensure_allocator(client)
    flat, steep = [1.0, 1.05, 1.1], [1.0, 1.9, 2.7]
    replies = {}
    for fit, curve in (("flat", flat), ("steep", steep)):
        replies[fit] = client.sync(client.scheduler.adadamp_allocate, fit=fit, want=3, ahead=3, most=3, least=1,
                                   speedups=curve)
    grants = client.run_on_scheduler(_grants)
    assert (len(grants["flat"]), len(grants["steep"])) == (1, 2), grants
    assert not set(grants["flat"]) & set(grants["steep"])
    share = client.sync(client.scheduler.adadamp_allocate, fit="steep")["share"]
    assert share == 2  # the most workers its damper may plan for
    client.sync(client.scheduler.adadamp_allocate, fit="flat", want=3, ahead=3, most=3, least=1)  # no curve
    grants = client.run_on_scheduler(_grants)
    assert (len(grants["flat"]), len(grants["steep"])) == (2, 1), grants  # back to the fair split


def test_a_fit_that_does_not_scale_never_grows_the_cluster(growing_cluster, data):
    """Once a fit with scale_cluster=True had the cluster adapt, a later fit with scale_cluster=False
    that wants 3 workers trains on the one there is (its wants had been summed into the target)."""
    cluster, client = growing_cluster
    growing(client, batch_size=64, max_epochs=1).fit(*data)  # the cluster adapts from here on
    asked, done = [], threading.Event()

    def watch():  # the workers the cluster was asked for (its spec), every 0.1 s
        while not done.wait(0.1):
            asked.append(len(cluster.worker_spec))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    est = growing(client, batch_size=384, max_epochs=40, scale_cluster=False).fit(*data)  # ~2 s: 4 adaptive ticks
    time.sleep(2)  # Adaptive's interval and wait_count: a target raised at the fit's end shows by then
    done.set()
    watcher.join()
    assert {row["n_workers"] for row in est.history_} == {1}
    assert asked and max(asked) == 1, asked


def test_fits_starting_together_never_leave_the_cluster_empty(growing_cluster, data, caplog):
    _, client = growing_cluster
    client.wait_for_workers(1)
    watch = Watch(client)
    results = []
    with caplog.at_level(logging.WARNING, logger="adadamp"):
        threads = [threading.Thread(target=lambda: results.append(growing(client).fit(*data))) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    samples = watch.stop()
    assert len(results) == 2
    assert min(n for n, _ in samples) >= 1
    assert not [r for r in caplog.records if "no live worker" in r.getMessage()]
    np.testing.assert_array_equal(_weights(results[0]), _weights(results[1]))


SLOW_START = """
import time


def dask_setup(worker):
    time.sleep(10)
"""


def test_fits_among_others_train_on_the_workers_there_are_while_the_cluster_grows(growing_cluster, data, tmp_path):
    """Two fits whose batch wants 2 workers each start together on a cluster of 1 that grows to 4,
    its new workers taking 10 s to start (a preload that sleeps): neither waits for its second
    worker (a fit alone would, up to ``scale_wait``); each trains its first updates on the worker
    there is, and both train the same weights."""
    cluster, client = growing_cluster
    client.wait_for_workers(1)
    preload = tmp_path / "slow_start.py"
    preload.write_text(SLOW_START)
    results = []
    with dask.config.set({"distributed.worker.preload": [str(preload)]}):  # the workers started from here on
        adapt(cluster, maximum=4)
        threads = [threading.Thread(target=lambda: results.append(growing(client, batch_size=256, max_epochs=4).fit(*data)))
                   for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    assert len(results) == 2
    for est in results:
        first = est.history_[0]["updates"][0]
        assert first["n_workers"] == 1, [u["n_workers"] for u in est.history_[0]["updates"][:5]]
    np.testing.assert_array_equal(_weights(results[0]), _weights(results[1]))


def test_back_to_back_fits_find_the_workers_warm(growing_cluster, data, caplog):
    _, client = growing_cluster
    waits = []
    for _ in range(3):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="adadamp.engine.membership"):
            est = growing(client).fit(*data)
        waits.append([r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()])
        assert max(row["n_workers"] for row in est.history_) == 3
    assert waits[1] == [] and waits[2] == [], waits  # no growth step waited for a worker start
    assert len(client.scheduler_info()["workers"]) == 3  # kept warm between the fits


def test_idle_workers_retire_gracefully_after_the_idle_time(growing_cluster, data, capfd, caplog):
    _, client = growing_cluster
    with dask.config.set({"adadamp.cluster.idle-timeout": "1 s"}), caplog.at_level(logging.INFO):
        growing(client).fit(*data)
        deadline = time.monotonic() + 30
        while len(client.scheduler_info()["workers"]) > 1:  # back to the one it was started with
            assert time.monotonic() < deadline, "the idle workers were not retired"
            time.sleep(0.2)
        time.sleep(2)  # what the retired workers' processes print on their way out
    assert len(client.scheduler_info()["workers"]) == 1
    out = capfd.readouterr()
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    text = out.out + out.err
    assert not logged and "ERROR" not in text and "Traceback" not in text, (logged, text[-2000:])


class _Updates(Callback):
    """When each update ended, on how many workers, how many of them lent; and when the fit ran
    (in ``LOGS[name]``: the estimator trains with a copy of its callbacks)."""

    LOGS: ClassVar[dict[str, dict]] = {}

    def __init__(self, name: str = "fit"):
        self.name = name

    @property
    def log(self) -> dict:
        return self.LOGS.setdefault(self.name, {"seen": [], "ran": []})

    def on_train_begin(self, estimator, **info):
        self.log["ran"].append(time.monotonic())

    def on_update_end(self, estimator, record=None, **info):
        self.log["seen"].append((time.monotonic(), record["n_workers"], record.get("lent", 0)))

    def on_train_end(self, estimator, **info):
        self.log["ran"].append(time.monotonic())


def _emulated(client, **params) -> DaskRegressor:
    """A batch of 64 on emulated accelerators (the time all per example): one worker wanted."""
    return DaskRegressor(**{"module": Emulated, "module__inner": MLP, "module__n_features": 10, "module__n_outputs": 1,
                            "module__hidden": (16,), "module__fixed": 0.0, "module__per_example": 0.5e-3,
                            "optimizer": torch.optim.SGD, "optimizer__lr": 0.01, "batch_size": 64,
                            "grads_per_worker": 128, "max_epochs": 8, "random_state": 0, "client": client,
                            "shares": "speed", **params})


def test_an_idle_worker_is_lent_to_a_fit_it_speeds_up_and_taken_back_for_a_fit_that_wants_it(data):
    """Two workers, a speed-share fit whose batch wants one: the other is lent to it once its
    measured speeds say a second worker shortens an update, and given back between two updates
    when a fit that wants a worker arrives.  The fit's shards stay those of its batch: every
    example once per update, the weights those of the fit that may borrow nothing."""
    X, y = data[0][:2048], data[1][:2048]
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client, dask.config.set({"adadamp.debug.digests": True}):
        alone = _emulated(client, max_workers=1).fit(X, y)  # max_workers=1: nothing to borrow
        assert all(u["lent"] == 0 and u["n_workers"] == 1 for row in alone.history_ for u in row["updates"])
        lender, second, results = _Updates("lender"), _Updates("second"), {}
        first = threading.Thread(target=lambda: results.update(a=_emulated(client, callbacks=[lender]).fit(X, y)))
        first.start()
        deadline = time.monotonic() + 60
        seen = lender.log["seen"]
        while not any(lent for _, _, lent in seen):
            assert time.monotonic() < deadline and first.is_alive(), f"no worker was lent: {seen}"
            time.sleep(0.05)
        assert any(n == 2 and lent == 1 for _, n, lent in seen)  # the lent worker trains
        other = _emulated(client, shares="equal", max_epochs=2, callbacks=[second]).fit(X, y)  # wants the lent worker
        first.join()
        assert {row["n_workers"] for row in other.history_} == {1}
        start, end = second.log["ran"]
        back = [lent for t, _, lent in seen if start + 1.0 < t < end]  # a renewal and an update later
        assert back and not any(back), (start, end, seen)  # given back while the second fit trained
        a = results["a"]
        assert [u["examples_digest"] for row in a.history_ for u in row["updates"]] == \
            [u["examples_digest"] for row in alone.history_ for u in row["updates"]]  # every example once
        np.testing.assert_allclose(_weights(a), _weights(alone), rtol=1e-4, atol=1e-5)


def test_lending_stops_at_a_batch_size_where_whole_updates_with_it_were_not_faster():
    """The share model sees only the workers' compute: the whole update's time decides too."""
    from adadamp.engine.backends.sizing import LENT_TRIAL, Sizing

    sizing = Sizing()
    sizing.lends, sizing._lent_times = True, {}
    for _ in range(LENT_TRIAL):
        sizing._time_lent(64, 64, 0, 0.010)
        sizing._time_lent(128, 128, 0, 0.020)
        sizing._time_lent(64, 3, 1, 0.001)  # an epoch's ragged last batch is not timed
    assert not sizing._lent_slower(64)
    for _ in range(LENT_TRIAL - 1):
        sizing._time_lent(64, 64, 1, 0.0095)
        sizing._time_lent(128, 128, 1, 0.012)
    assert not sizing._lent_slower(64)  # not timed enough yet
    sizing._time_lent(64, 64, 1, 0.0095)
    sizing._time_lent(128, 128, 1, 0.012)
    assert sizing._lent_slower(64)  # 5% faster: not worth a worker another fit may want
    assert not sizing._lent_slower(128)  # 40% faster: keep it


# ------------------------------------------------------------------------------ malformed and hostile messages
def _allocator_state(dask_scheduler):
    allocator = dask_scheduler.plugins[NAME]
    return {"fits": sorted(allocator.fits), "capacity": str(allocator.capacity), "idle": str(allocator.idle),
            "ends": sorted(allocator.ends), "starts": list(allocator.starts)}


MALFORMED = {
    "target-maximum-text": ("adadamp_target", {"maximum": "x"}, "maximum"),
    "target-idle-nan": ("adadamp_target", {"idle": float("nan")}, "idle"),
    "target-minimum-negative": ("adadamp_target", {"minimum": -1}, "minimum"),
    "close-target-text": ("adadamp_workers_to_close", {"target": "2"}, "target"),
    "fit-id-a-list": ("adadamp_allocate", {"fit": ["a"], "want": 1}, "fit"),
    "want-text": ("adadamp_allocate", {"fit": "a", "want": "3"}, "want"),
    "want-huge": ("adadamp_allocate", {"fit": "a", "want": 10**9}, "want"),
    "least-a-bool": ("adadamp_allocate", {"fit": "a", "want": 1, "least": True}, "least"),
    "least-above-most": ("adadamp_allocate", {"fit": "a", "want": 1, "most": 2, "least": 3}, "least"),
    "speedups-nan": ("adadamp_allocate", {"fit": "a", "want": 1, "speedups": [1.0, float("nan")]}, "speedups"),
    "client-unknown": ("adadamp_allocate", {"fit": "a", "want": 1, "client": "nobody"}, "client"),
}


@pytest.mark.parametrize(("handler", "kwargs", "named"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_message_is_refused_and_poisons_nothing(growing_cluster, handler, kwargs, named):
    """``adadamp_target(maximum="x")`` made every later allocation raise TypeError until something reset
    it; a fit id that was a list left an entry that kept a worker from the others."""
    _, client = growing_cluster
    ensure_allocator(client)
    before = client.run_on_scheduler(_allocator_state)
    with pytest.raises((TypeError, ValueError), match=f"{handler}: {named}="):
        client.sync(getattr(client.scheduler, handler), **kwargs)
    assert client.run_on_scheduler(_allocator_state) == before
    reply = client.sync(client.scheduler.adadamp_allocate, fit="good", want=1, ahead=1, most=1, least=1,
                        client=client.id)
    assert list(reply["grant"]) == list(client.scheduler_info()["workers"])
    assert client.sync(client.scheduler.adadamp_target, maximum=4) == 1


def _seconds_left(dask_scheduler):
    allocator = dask_scheduler.plugins[NAME]
    allocator.start_seconds()  # reads what the workers told
    return {w: end - time.monotonic() for w, end in allocator.ends.items()}


def _starts(dask_scheduler):
    allocator = dask_scheduler.plugins[NAME]
    return allocator.starts, allocator.start_seconds()


def test_a_worker_with_a_lifetime_is_replaced_ahead_and_its_fit_moves_to_the_replacement(data):
    """A worker that retires at its lifetime (Dask's ``--lifetime``, dask-jobqueue's recipe for
    walltimes) tells the allocator at its set-up; near its end the cluster's target counts a
    replacement, and the fit holding it is granted the replacement once that runs -- before the
    retirement, which then costs the fit nothing.  Before, the fit lost the worker mid-training and
    waited for a new one to start (21-25 s seen on SLURM under load)."""
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR,
                      lifetime="300s") as cluster, Client(cluster, set_as_default=False) as client:
        X, y = data
        DaskRegressor(module=Net, max_epochs=1, batch_size=256, scale_cluster=False, client=client).fit(X[:512], y[:512])
        left = client.run_on_scheduler(_seconds_left)  # told by the worker's set-up
        assert len(left) == 1 and 200 < next(iter(left.values())) <= 300, left
        starts, start = client.run_on_scheduler(_starts)  # and how long its process took to register
        assert len(starts) == 1 and 0 < starts[0] < 60 and start == starts[0], starts
        [old] = left
        reply = client.sync(client.scheduler.adadamp_allocate, fit="a", want=1, ahead=1, most=1, least=1, scaled=True)
        assert list(reply["grant"]) == [old]
        assert client.sync(client.scheduler.adadamp_target) == 1
        # as a worker at its end tells (its set-up wrote its life there; metadata, read by the allocator)
        client.set_metadata(["adadamp", "worker-life", old], {"created": time.time() - 10, "ends": time.time()})
        assert client.sync(client.scheduler.adadamp_target) == 2  # its replacement, asked for ahead
        cluster.scale(2)
        client.wait_for_workers(2)
        [new] = set(client.scheduler_info()["workers"]) - {old}
        deadline = time.monotonic() + 30
        while new not in client.run_on_scheduler(_seconds_left):  # the new worker's set-up tells its lifetime too
            assert time.monotonic() < deadline, "the new worker never told its lifetime"
            time.sleep(0.05)
        reply = client.sync(client.scheduler.adadamp_allocate, fit="a")
        assert list(reply["grant"]) == [new]  # moved before the old one retires
        # a fit declared now is handed the worker with a future first
        reply = client.sync(client.scheduler.adadamp_allocate, fit="b", want=1, ahead=1, most=1, least=1, scaled=True)
        assert list(reply["grant"]) == [old]  # the only one free: a retiring worker is still a worker


@pytest.mark.parametrize("life", [{"created": "now"}, {"created": 1.0, "ends": float("nan")}, [1, 2], "x",
                                  {"created": float("inf"), "ends": True}])
def test_a_malformed_worker_life_is_ignored(growing_cluster, life):
    """Anyone who reaches the scheduler may set metadata: a worker's life that is not finite numbers
    changes no start, no end and no target."""
    _, client = growing_cluster
    ensure_allocator(client)
    [worker] = client.scheduler_info()["workers"]
    client.set_metadata(["adadamp", "worker-life", worker], life)
    client.sync(client.scheduler.adadamp_allocate, fit="a", want=1, ahead=1, most=1, least=1, scaled=True)
    assert client.sync(client.scheduler.adadamp_target) == 1
    assert client.run_on_scheduler(_seconds_left) == {}
    assert client.run_on_scheduler(_starts) == ([], None)


def test_one_client_holds_a_bounded_number_of_fits(growing_cluster):
    """600 fits declared by one client made every renewal cost 100 ms and a fit beside them train
    on one worker; a client's fits are now bounded, and they end when it leaves."""
    from adadamp.cluster.allocator import MAX_FITS_PER_CLIENT

    cluster, client = growing_cluster
    ensure_allocator(client)
    with Client(cluster, set_as_default=False) as other:
        for i in range(MAX_FITS_PER_CLIENT):
            other.sync(other.scheduler.adadamp_allocate, fit=f"f{i}", want=1, ahead=1, most=1, least=1, client=other.id)
        with pytest.raises(ValueError, match=f"holds {MAX_FITS_PER_CLIENT} fits already"):
            other.sync(other.scheduler.adadamp_allocate, fit="one-more", want=1, ahead=1, most=1, client=other.id)
        other.sync(other.scheduler.adadamp_allocate, fit="f0", want=1, ahead=1, most=1, client=other.id)  # a renewal
        client.sync(client.scheduler.adadamp_allocate, fit="mine", want=1, ahead=1, most=1, client=client.id)
        assert len(client.run_on_scheduler(_allocator_state)["fits"]) == MAX_FITS_PER_CLIENT + 1
    deadline = time.monotonic() + 30
    while client.run_on_scheduler(_allocator_state)["fits"] != ["mine"]:  # the other client left: its fits end
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_min_workers_floor_shares_workers_and_takes_none():
    """A fit declaring a huge min_workers beside one holding every worker of a growing cluster: the
    rule (docs/guide/security.rst) is that its floor shares the least shared workers -- min_workers
    promises a worker count, and so the weights -- and never takes one from another fit's grant."""
    grants = divide(["w1", "w2", "w3", "w4"], {"v": 4, "hog": 4}, {"v": ["w1", "w2", "w3", "w4"]}, capacity=64,
                    least={"v": 1, "hog": 4})
    assert grants["v"] == ["w1", "w2", "w3", "w4"] and sorted(grants["hog"]) == ["w1", "w2", "w3", "w4"], grants



def _targets(dask_scheduler) -> tuple[int, int, int]:
    allocator = dask_scheduler.plugins[NAME]
    return tuple(allocator.target(idle=3600, planned=planned) for planned in (None, 0, 1))


def test_workers_kept_warm_never_make_the_target_grow_past_the_plan(client):
    """Idle workers kept warm hold the adaptive's target up, never above the cluster's plan: after
    a fit, the user's ``cluster.scale(0)`` empties the plan while the workers still run (a SLURM job
    takes a while to end), and the target of the workers kept warm had the adaptive submit them
    again (a job pending after the scale(0), seen under load)."""
    ensure_allocator(client)
    live = len(client.scheduler_info()["workers"])
    assert live >= 2
    assert client.run_on_scheduler(_targets) == (live, 0, 1)
