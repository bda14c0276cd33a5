"""adadamp on a site's multi-user Dask: dask-gateway's ``GatewayCluster`` against a dask-gateway-server on
localhost.

``tests/system/gateway/start.sh`` starts the server once per session (the ``gateway`` fixture of
conftest.py; it stops it, with the clusters it runs, at the end): the UnsafeLocalBackend, whose
schedulers and workers are processes of this user, and simple authentication.  Where it cannot start
(dask-gateway-server missing) the tests skip with the reason -- unless the environment variable ``CI``
is set: then they fail, because CI must run them.

A fit with ``scale_cluster=True`` grows the cluster through ``GatewayCluster.scale``
(:class:`adadamp.cluster.gateway.GatewaySizer`); on a scale-down the gateway's scheduler retires only
workers no fit holds.  Each test prints a line ``[gateway] ...`` with its timings.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import cloudpickle
import dask
import numpy as np
import pytest
from test_slurm import _say, fit_in_thread, poll, regression_data, slow_regressor, workers_per_update

from adadamp.callbacks import Callback
from adadamp.cluster import adapt
from adadamp.dampers import GeoDamp
from adadamp.exceptions import StopTraining

pytestmark = [pytest.mark.gateway, pytest.mark.timeout(300)]

# The gateway's scheduler does not import this module: ship what it runs there by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Closed clusters, kept until the interpreter exits: dask-gateway's ``Gateway.__del__`` closes again what
#: ``GatewayCluster.close`` closed and raises (distributed's stopped ``LoopRunner.loop``; any GatewayCluster,
#: adadamp or not), which pytest reports as an unraisable exception; at exit ``__del__`` does nothing.
_CLOSED: list = []

#: Seconds between a gateway cluster's heartbeats (start.sh's ADADAMP_GATEWAY_HEARTBEAT).
HEARTBEAT = 3.0


@contextlib.contextmanager
def gateway_cluster(address: str):
    """A client of a new cluster of the gateway at ``address`` (``client.cluster``), with no worker; the
    cluster is shut down on exit."""
    from dask_gateway import BasicAuth, GatewayCluster

    cluster = GatewayCluster(address=address, auth=BasicAuth(username="adadamp"))
    client = cluster.get_client(set_as_default=False)
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.close()
        with contextlib.suppress(Exception):
            cluster.close()  # shutdown_on_close: the gateway stops its scheduler and workers
        _CLOSED.append(cluster)


def workers(client) -> set[str]:
    return set(client.scheduler_info(n_workers=-1)["workers"])


def _grants(dask_scheduler) -> dict:
    from adadamp.cluster.allocator import NAME

    allocator = dask_scheduler.plugins.get(NAME)
    return {} if allocator is None else {f: list(g) for f, g in allocator.grants.items()}


class StopWhen(Callback):
    """Ends the fit at an epoch's end once ``done(per_update)`` (the workers of each update so far)
    says so.  The fit trains with a clone of this callback: ``done`` is how the test sees its progress."""

    def __init__(self, done=None):
        self.done = done

    def on_epoch_end(self, estimator, history=None, **info):
        if self.done([u["n_workers"] for row in history for u in row["updates"]]):
            raise StopTraining("seen what the test waits for")


def test_a_fit_grows_a_gateway_cluster_from_no_worker_and_its_idle_workers_retire(gateway, request):
    """GeoDamp doubles the batch (32 -> 64 -> 128) with grads_per_worker=32 and max_workers=3: the fit
    asks for 1 -> 2 -> 3 workers, the gateway starts them, the fit trains on them; once the fit ends
    its workers retire after the idle time (1 s) and the gateway starts no replacement."""
    X, y = regression_data()
    stop = StopWhen(lambda per_update: per_update.count(3) >= 8)  # 8 updates on all three
    with dask.config.set({"adadamp.cluster.idle-timeout": "1 s"}), gateway_cluster(gateway) as client:
        assert not workers(client)
        est = slow_regressor(
            client, 0.05, batch_size=GeoDamp, batch_size__initial=32, batch_size__delay=1, batch_size__factor=2,
            batch_size__max_batch_size=128, scale_cluster=True, grads_per_worker=32, min_workers=1,
            max_workers=3, max_epochs=200, callbacks=[("stop", stop)], worker_timeout=90, update_timeout=60,
        )
        t0 = time.monotonic()
        est.fit(X, y)
        fit_s = time.monotonic() - t0
        per_update = workers_per_update(est)
        assert per_update[0] == 1, per_update
        assert max(per_update) == 3, f"3 workers (max_workers) were wanted for batch 128: {per_update}"
        losses = [row["train_loss"] for row in est.history_]
        assert losses[-1] < losses[0], losses
        assert np.isfinite(est.predict(X)).all()

        t1 = time.monotonic()
        poll(lambda: not workers(client), 60, f"the idle workers to retire (left: {workers(client)})")
        retire_s = time.monotonic() - t1
        # No replacement: the gateway counts the retired workers as closed, not failed.  Two
        # heartbeats (the gateway acts on each) must pass with none started.
        deadline = time.monotonic() + 2 * HEARTBEAT + 1
        while time.monotonic() < deadline:
            assert not workers(client), "the gateway started a worker after the retirement"
            time.sleep(0.25)
        _say(request.config, f"[gateway] grow: fit {fit_s:.1f} s, {len(per_update)} updates, workers per update "
                             f"1 x{per_update.count(1)}, 2 x{per_update.count(2)}, 3 x{per_update.count(3)}; "
                             f"all 3 retired {retire_s:.1f} s after the fit")


def released_fit(client, delay: float, **params):
    """A fit that trains until ``release`` is set, in a thread: (estimator, release, seen workers per
    update, thread, outcome)."""
    release, seen = threading.Event(), []

    def done(per_update: list[int]) -> bool:
        seen[:] = per_update
        return release.is_set()

    est = slow_regressor(client, delay, scale_cluster=True, grads_per_worker=32, min_workers=1, max_epochs=1000,
                         callbacks=[("stop", StopWhen(done))], worker_timeout=90, update_timeout=60, **params)
    X, y = regression_data()
    thread, outcome = fit_in_thread(est, X, y)
    return est, release, seen, thread, outcome


def test_a_fit_beside_another_keeps_its_workers_when_the_gateway_cluster_shrinks(gateway, request):
    """Fit A trains on 2 workers; fit B grows the cluster (at most 3) to 3, trains on the new worker and ends.  The
    worker B leaves holds the most data (a scattered array), which Dask's own choice would keep: when
    the idle time is over the cluster shrinks to 2, and the gateway's scheduler retires B's worker,
    never one of A's (A never trains on fewer than 2 after it had 2).  The array moves to a worker that stays."""
    with dask.config.set({"adadamp.cluster.idle-timeout": "1 s"}), gateway_cluster(gateway) as client:
        adapt(client.cluster, maximum=3)  # else the cluster is bounded by the largest max_workers, 2: A would share
        t0 = time.monotonic()
        a, release_a, seen_a, thread_a, outcome_a = released_fit(client, 0.05, batch_size=64, max_workers=2)
        try:
            poll(lambda: seen_a and seen_a[-1] == 2 or "error" in outcome_a, 90, "fit A to train on 2 workers")
            assert "error" not in outcome_a, outcome_a.get("traceback")
            (fit_a, a_workers), = client.run_on_scheduler(_grants).items()
            a_workers = set(a_workers)
            assert len(a_workers) == 2 and workers(client) == a_workers, (a_workers, workers(client))

            # B shares a worker of A while its own starts, then moves to it (adadamp.cluster.allocator).
            _, release_b, _, thread_b, outcome_b = released_fit(client, 0.02, batch_size=32, max_workers=1)
            try:
                poll(lambda: len(workers(client)) == 3 and any(
                    f != fit_a and g and not set(g) & a_workers for f, g in client.run_on_scheduler(_grants).items()
                ) or "error" in outcome_b, 90, "fit B to train on a worker of its own")
            finally:
                release_b.set()
                thread_b.join(120)
            assert "error" not in outcome_b, outcome_b.get("traceback")
            grown_s = time.monotonic() - t0
            spare = workers(client) - a_workers
            assert len(spare) == 1, (spare, a_workers)
            data = client.scatter(np.arange(4_000_000, dtype=np.float64), workers=list(spare))  # 32 MB

            t1 = time.monotonic()
            poll(lambda: len(workers(client)) == 2, 60, f"the cluster to shrink to 2 workers ({workers(client)})")
            shrink_s = time.monotonic() - t1
            assert workers(client) == a_workers, "a worker of fit A was retired"
            assert set(client.run_on_scheduler(_grants)[fit_a]) == a_workers
            assert data.result()[-1] == 3_999_999
        finally:
            release_a.set()
            thread_a.join(120)
        assert "error" not in outcome_a, outcome_a.get("traceback")
        per_update = workers_per_update(a)
        assert min(per_update[per_update.index(2):]) == 2, per_update
        _say(request.config, f"[gateway] beside: 3 workers {grown_s:.1f} s after fit A started, B's worker "
                             f"retired {shrink_s:.1f} s after fit B ended; fit A {len(per_update)} updates, "
                             f"on 2 workers from update {per_update.index(2) + 1}")
