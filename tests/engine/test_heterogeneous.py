"""Workers that differ in speed (issue 33): shares by measured speed, on real worker processes.

The workers run :class:`benchmarks.common.emulated.Emulated`: each training forward sleeps a fixed time
plus a time per example, divided by the worker's speed from a JSON file (one worker at a third of
the others' speed here).  A sleep does not use the CPU, so the speeds hold on this 2-core machine.
"""

import json
import logging
import os
import signal
import time

import dask
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from test_robustness import Freeze  # SIGSTOPs a worker after some updates (a hung node)

from adadamp import DaskRegressor
from adadamp.dampers.clock import LoopState, Sampler
from adadamp.data.placement import makespan, plan_moves, shard_quotas
from adadamp.engine.aggregation import GradientSum
from adadamp.engine.backends.allreduce import AllReduce
from adadamp.engine.backends.parameter_server import ParameterServer
from adadamp.engine.speeds import PROBE_GROWTH, REBALANCE_EVERY, Speeds, lost_after
from adadamp.modules import MLP
from adadamp.records import GradientReply, SetupReply, examples_digest
from adadamp.wire.parameters import examples_independent, flatten_parameters, float_buffers
from adadamp.worker.gradient import gradient_sum, shards_sum
from adadamp.worker.state import FitState
from benchmarks.common.emulated import Emulated

SLOW = 1 / 3  # the slow worker's speed, the others' being 1
N, FEATURES, BATCH = 2048, 16, 256


# ----------------------------------------------------------------------------- pure pieces
def test_quotas_make_the_workers_finish_together():
    assert shard_quotas(6, [1.0, 1.0, 1.0]) == [2, 2, 2]  # equal speeds: the equal quotas
    held = shard_quotas(48, [1.0, 1.0, SLOW])
    assert held == [21, 21, 6] and makespan(held, [1.0, 1.0, SLOW]) == 21.0
    assert shard_quotas(3, [1.0, 1.0, 0.01]) == [2, 1, 0]  # one shard would take it longer than all the rest


def test_plan_moves_follows_quotas_moving_only_what_it_must():
    workers = ["a", "b", "c"]
    shard_of, holder, _, _ = plan_moves([None] * 12, workers, 12)
    assert [holder.count(w) for w in workers] == [4, 4, 4]
    owner = [holder[g] for g in shard_of]
    shard_of2, holder2, add, drop = plan_moves(owner, workers, 12, quota=[5, 5, 2])
    assert [holder2.count(w) for w in workers] == [5, 5, 2]
    assert (shard_of2 == shard_of).all()  # the shards stay; only holders change
    assert sum(map(len, add.values())) == 2 and drop["c"] and not drop["a"] and not drop["b"]
    with pytest.raises(ValueError, match="quotas"):
        plan_moves(owner, workers, 12, quota=[5, 5, 1])


def test_speeds_smooth_name_stragglers_and_say_when_to_move():
    s = Speeds()
    for update in range(REBALANCE_EVERY):
        for w, rate in (("a", 300.0), ("b", 300.0), ("c", 100.0)):
            s.observe(w, int(rate), 1.0)
    assert s.stragglers(["a", "b", "c"]) == [2]
    assert not s.rebalance(["a", "b", "c"], [16, 16, 16], update=0)  # too soon after the start
    assert s.rebalance(["a", "b", "c"], [16, 16, 16], update=REBALANCE_EVERY)
    assert not s.rebalance(["a", "b", "c"], [21, 21, 6], update=2 * REBALANCE_EVERY)  # as good as it gets
    s.observe("c", 300, 1.0)
    assert 100 < s.rate["c"] < 300  # smoothed
    before = s.rate["c"]
    s.observe_update(["a", "b", "c"], {"a": [300, 1.0], "b": [300, 1.0]})  # c got no shard: probed later
    assert s.rate["c"] == before * PROBE_GROWTH and s.rate["a"] == 300.0


def test_a_workers_first_reply_of_the_fit_warms_up_and_is_not_measured():
    s = Speeds()
    s.observe_update(["a", "b"], {"a": [100, 3.0], "b": [100, 1.0]})  # a's first pass: allocations, caches
    assert s.answered == {"a", "b"} and s.rate == {}
    s.observe_update(["a", "b"], {"a": [100, 1.0], "b": [100, 1.0]})
    assert s.rate == {"a": 100.0, "b": 100.0}
    s.forget("a")  # lost; a worker at its address later warms up again
    s.observe_update(["a", "b"], {"a": [100, 3.0], "b": [100, 1.0]})
    assert "a" not in s.rate


@pytest.mark.parametrize("backend", [ParameterServer, AllReduce])
def test_a_worker_set_up_again_in_a_fit_warms_up_again(backend):
    """Back at its address after a cut link, a worker is set up again: its speed is measured anew
    and its first reply may be slow (it is patient again, not a straggler by its old speed)."""
    b = object.__new__(backend)  # only the set-up hook's state: the rest of a fit is not needed
    b.speeds, b._kept = Speeds(), {}
    for _ in range(2):
        b.speeds.observe_update(["a", "b"], {"a": [100, 1.0], "b": [100, 1.0]})
    assert b.speeds.answered == {"a", "b"} and set(b.speeds.rate) == {"a", "b"}
    b.setup_reply("a", SetupReply(shared=False, shared_data=False))
    assert b.speeds.answered == {"b"} and set(b.speeds.rate) == {"b"}


@pytest.mark.parametrize(("fixed", "per_example"), [(0.0, 1e-3), (0.05, 1e-5)])
def test_the_share_model_learns_how_much_of_the_time_grows_with_the_share(fixed, per_example):
    """Compute-bound workers: the time grows with the share (elasticity 1) and the shares follow
    the throughputs.  Fixed-cost-bound ones (a small model, kernel launches): the time hardly
    grows (elasticity near 0), so shares that happened to differ are not worth moving --
    throughputs alone would favour whichever worker holds more."""
    s = Speeds()
    rng = np.random.default_rng(0)
    workers = ["a", "b", "c"]
    for _ in range(30):
        for w, n in zip(workers, rng.integers(60, 140, size=3)):
            s.observe(w, int(n), fixed + per_example * n)
    if fixed:
        assert s.elasticity() < 0.1
        assert not s.rebalance(workers, [10, 4, 2], update=100)  # any split costs about the fixed time
    else:
        assert s.elasticity() > 0.95
        assert s.rebalance(workers, [10, 4, 2], update=100) and s.quotas(workers, 16) in ([6, 5, 5], [5, 6, 5], [5, 5, 6])


def test_a_worker_is_lost_after_ten_times_the_others_time_with_a_floor():
    assert lost_after(0.01) == 5.0 and lost_after(2.0) == 20.0
    with dask.config.set({"adadamp.stragglers.min-seconds": 1.0, "adadamp.stragglers.factor": 4}):
        assert lost_after(0.01) == 1.0 and lost_after(2.0) == 8.0


def test_a_reply_of_several_shards_and_its_recomputation_keep_shard_order():
    grads = np.zeros(2, dtype=np.float32)
    summed = GradientSum(grads, None)
    summed.expect([0, 3, 5])  # three requests, named by their first shards
    reply = GradientReply(n=1, loss_sum=0.0, chunk_sq_norm_sum=0.0, n_chunks=0, compute_time=0.1,
                          grad=np.ones(2, np.float32), buffers=None)
    summed.add(5, "c", reply)  # waits for 0 and 3
    summed.redo([0], [0, 1])  # the worker of 0 was lost: its shards come again from two others
    assert summed._order == [0, 1, 3, 5]
    for g, w in ((1, "b"), (0, "a"), (3, "b")):
        summed.add(g, w, reply)
    assert summed.totals.n == 4 and grads.tolist() == [4.0, 4.0]
    assert summed.totals.per_worker == {"c": [1, 0.1], "b": [2, 0.2], "a": [1, 0.1]}


def _state(module, fuse):
    flat, grads = flatten_parameters(module)
    return FitState(module, torch.nn.MSELoss(), torch.device("cpu"), flat, grads, 64,
                    buffers=float_buffers(module), fuse=fuse and examples_independent(module))


class FunctionalDropout(torch.nn.Module):
    """Draws random numbers without a dropout layer to show it."""

    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.5, self.training)


@pytest.mark.parametrize("dropout", [None, torch.nn.Dropout, FunctionalDropout])
def test_shards_fuse_into_one_pass_only_when_examples_are_independent(dropout):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)]
    module = torch.nn.Sequential(*layers[:2], *([dropout(0.5)] if dropout is torch.nn.Dropout else
                                                [dropout()] if dropout else []), layers[2])
    X, y = torch.randn(20, 4), torch.randn(20, 1)
    parts = np.array([[11, 5], [12, 8], [13, 7]], dtype=np.int64)
    apart = _state(module, fuse=False)
    sums, _ = shards_sum(apart, X, y, 1, parts, None)
    expected = apart.grads.clone()
    fused = _state(module, fuse=True)
    assert fused.fuse is (dropout is not torch.nn.Dropout)  # what the layers show
    gradient_sum(fused, X[:1], y[:1], 1, 0)  # the first pass looks whether the module draws
    assert fused.draws is (dropout is not None)
    calls = []
    original = fused.module.forward
    fused.module.forward = lambda x: calls.append(len(x)) or original(x)
    got, _ = shards_sum(fused, X, y, 1, parts, None)
    assert calls == ([20] if dropout is None else [5, 8, 7])
    assert got[0] == sums[0] == 20
    np.testing.assert_allclose(fused.grads.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    if dropout:  # each shard its own pass, seeded by its own seed: the same masks, bit for bit
        np.testing.assert_array_equal(fused.grads.numpy(), expected.numpy())


# ----------------------------------------------------------------------------- on a cluster
@pytest.fixture(scope="module")
def slow_worker(tmp_path_factory):
    """Three worker processes, the last (by name) at a third of the others' speed."""
    speeds = tmp_path_factory.mktemp("speeds") / "speeds.json"
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None,
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        info = client.scheduler_info()["workers"]
        slow = max(info, key=lambda a: str(info[a]["name"]))
        speeds.write_text(json.dumps({slow: SLOW}))
        yield client, str(speeds), slow


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, FEATURES)).astype(np.float32)
    return X, (X @ rng.normal(size=FEATURES)).astype(np.float32)


def _fit(client, speeds, X, y, **params):
    params = {"max_epochs": 3, **params}
    est = DaskRegressor(
        module=Emulated, module__inner=MLP, module__speeds=speeds, module__fixed=1e-3, module__per_example=0.4e-3,
        module__n_features=FEATURES, module__n_outputs=1, module__hidden=(32,),
        optimizer=torch.optim.SGD, optimizer__lr=0.01, optimizer__momentum=0.9, batch_size=BATCH,
        random_state=0, scale_cluster=False, client=client, min_workers=3, **params,
    )
    with dask.config.set({"adadamp.debug.digests": True}):
        return est.fit(X, y)


def _updates(est):
    return [u for row in est.history_ for u in row["updates"]]


def _weights(est):
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


@pytest.mark.parametrize("backend", ["parameter-server", "allreduce"])
def test_speed_shares_follow_the_speeds_use_every_example_once_and_train_the_same(backend, slow_worker, data):
    client, speeds, _ = slow_worker
    X, y = data
    equal = _fit(client, speeds, X, y, backend=backend)
    fast = _fit(client, speeds, X, y, backend=backend, shares="speed")
    sampler = Sampler(LoopState(seed=fast.loop_.seed, n_data=N))
    expected = [examples_digest(sampler.take(BATCH)) for _ in range(fast.loop_.n_updates)]
    for est in (equal, fast):  # every example of every update computed once, whoever computed it
        updates = _updates(est)
        assert [u["examples_digest"] for u in updates] == expected
        assert all(sum(u["shares"]) == u["batch_size"] for u in updates)
    later = np.array([u["shares"] for u in _updates(fast)][len(expected) // 2:], dtype=float)
    fraction = later.mean(axis=0) / BATCH
    rank = int(np.argmin(fraction))
    # the slow worker computes about its part of the summed speeds (1/7), the others about 3/7 each;
    # on a loaded machine the measured times hold more that does not grow with the share (the
    # elasticity drops below 1), and the model then gives the slow worker less: 4.8 % in one CI run
    assert 0.03 < fraction[rank] < 0.22, fraction
    assert all(f > 0.3 for i, f in enumerate(fraction) if i != rank), fraction
    assert all(rank in u["stragglers"] for u in _updates(fast)[-4:])
    assert all(rank in u["stragglers"] for u in _updates(equal)[-4:])  # named with equal shares too
    # the same sums in another order: the same weights up to float summation order
    np.testing.assert_allclose(_weights(fast), _weights(equal), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["parameter-server", "allreduce"])
def test_a_worker_that_stops_answering_is_lost_after_the_others_bound_not_update_timeout(backend, slow_worker, data):
    """A worker SIGSTOPped mid-fit is given up ten times the others' time after the update
    started (here with a floor of 1 s), not after ``update_timeout`` (120 s): its shards are
    recomputed on the others, every example still used once."""

    client, speeds, slow = slow_worker
    X, y = data
    pids = client.run(os.getpid)
    frozen = pids[next(a for a in sorted(pids) if a != slow)]
    start = time.monotonic()
    try:
        with dask.config.set({"adadamp.stragglers.min-seconds": 1.0}):
            est = _fit(client, speeds, X, y, backend=backend, max_epochs=2,
                       callbacks=[("freeze", Freeze(pid=frozen, after=5))])
    finally:
        os.kill(frozen, signal.SIGCONT)
    took = time.monotonic() - start
    updates = _updates(est)
    assert [u["lost"] for u in updates].count(1) == 1 and sum(u["lost"] for u in updates) == 1
    assert updates[0]["n_workers"] == 3 and updates[-1]["n_workers"] == 2
    sampler = Sampler(LoopState(seed=est.loop_.seed, n_data=N))
    assert [u["examples_digest"] for u in updates] == [examples_digest(sampler.take(BATCH)) for _ in updates]
    assert took < 30, took  # 120 s (update_timeout) before
