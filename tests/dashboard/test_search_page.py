"""A search on the live page: the page shows a fit from its start, while it waits for workers, and
each fit's run of fits (a search's fits, finished, running, waiting for workers) on the page, in a
real headless Chromium, and at each fit's end in ``verbose`` output."""

import json
import logging
import re
import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from joblib.externals.loky import get_reusable_executor
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from test_dashboard import _dump_dom, _get, _page

from adadamp import DaskClassifier, dashboard

OVERVIEW = re.compile(r"fits on this cluster \(this run of (\d+)\): (\d+) finished, (\d+) running, "
                      r"(\d+) waiting for workers, (\d+) failed")


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return (X[:400] / 16).astype(np.float32), y[:400]


@pytest.fixture
def empty_cluster():
    """A cluster with no worker yet (a queue's cluster before its first job), serving the page."""
    routes = [*dask.config.get("distributed.scheduler.http.routes"), "adadamp.dashboard"]
    with (
        dask.config.set({"distributed.scheduler.http.routes": sorted(set(routes))}),
        LocalCluster(n_workers=0, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield cluster, client


def _summary_once(page: str, ready, timeout: float = 60.0) -> dict:
    """The page's summary once ``ready(summary)`` holds (the page is polled as a browser would)."""
    deadline = time.monotonic() + timeout
    while True:
        summary = json.loads(_get(page + "/data.json"))
        if ready(summary):
            return summary
        assert time.monotonic() < deadline, f"the page never showed it: {summary}"
        time.sleep(0.2)


def _cell(dom: str, table: str, name: str) -> str:
    match = re.search(f'id="{table}-{name}"[^>]*>([^<]*)<', dom)
    assert match, f"no {table}-{name} on the page:\n{dom[-3000:]}"
    return match.group(1)


def test_the_page_shows_a_fit_waiting_for_workers_then_its_searchs_progress(empty_cluster, digits, chromium, capfd):
    cluster, client = empty_cluster
    X, y = digits
    page = _page(cluster)
    first = DaskClassifier(client=client, scale_cluster=False, worker_timeout=300, max_epochs=2, verbose=1,
                           random_state=0)
    failed = []
    thread = threading.Thread(target=lambda: _record_failure(failed, first.fit, X, y))
    thread.start()
    try:
        waiting = _summary_once(page, lambda s: s.get("fit") is not None)  # before any worker exists
        assert waiting["progress"]["state"] == "waiting for workers"
        assert waiting["run"]["counts"] == {"finished": 0, "running": 0, "waiting for workers": 1, "failed": 0}
        dom = _dump_dom(chromium, page, budget_ms=4000)
        assert _cell(dom, "run", "waiting_for_workers") == "1" and "waiting for workers" in dom
        assert not client.scheduler_info()["workers"]  # (still none: the page came first)
    finally:
        cluster.scale(2)
        thread.join(timeout=300)
    assert not thread.is_alive() and not failed, failed
    assert _summary_once(page, lambda s: s["progress"]["state"] == "finished")["fit"] == waiting["fit"]

    # loky's worker processes outlive a search; reused ones from an earlier test of this pytest process
    # would print to that test's captured output: the search starts its own, which print to this one's
    get_reusable_executor().shutdown(wait=True)
    search = GridSearchCV(DaskClassifier(client=client, scale_cluster=False, max_epochs=2, verbose=1, random_state=0),
                          {"optimizer__lr": [1e-3, 3e-3]}, cv=2, n_jobs=2).fit(X, y)  # loky: in 2 processes
    n_fits = 1 + 4 + 1  # the first fit, the search's 2 x 2, its refit
    lines = [tuple(map(int, m)) for m in OVERVIEW.findall(capfd.readouterr().out)]
    assert len(lines) == n_fits - 1, lines  # one at each fit's end (none for the first: alone in its run then)
    assert lines[-1] == (n_fits, n_fits, 0, 0, 0)  # the refit, last: every fit of the run finished
    assert all(sum(line[1:]) == line[0] for line in lines)
    assert [line[1] for line in lines] == sorted(line[1] for line in lines)  # fits done only ever grows

    summary = json.loads(_get(page + "/data.json"))
    assert summary["run"]["counts"]["finished"] == n_fits and len(summary["run"]["fits"]) == n_fits
    dom = _dump_dom(chromium, page, budget_ms=4000)
    assert _cell(dom, "run", "finished") == str(n_fits) and _cell(dom, "run", "fits_in_this_run") == str(n_fits)
    assert search.best_estimator_.history_


def _record_failure(failed: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as err:  # noqa: BLE001 -- the test reads it
        failed.append(err)


def test_a_run_of_fits_ends_after_a_pause_and_counts_each_state():
    """Fits that start within ``RUN_GAP`` of the others' end are one run; a later fit starts the next
    one; the run's time left is its running fits' longest, less the time since they estimated it."""
    t0 = 1_000_000.0
    events = {dashboard.TOPIC: []}

    def start(fit, at, epochs=4):
        events[dashboard.TOPIC].append((at, {"kind": "start", "fit": fit, "name": "DaskClassifier", "params": {},
                                             "epochs": epochs, "time": at}))
        events[f"{dashboard.TOPIC}/{fit}"] = []

    def publish(fit, msg):
        events[f"{dashboard.TOPIC}/{fit}"].append((0, msg))

    a, b, c, d, e = (f"{i:012x}" for i in range(1, 6))
    start(a, t0)
    publish(a, {"kind": "training", "time": 1.0})
    publish(a, {"kind": "end", "error": None, "time": 10.0})
    start(b, t0 + 50)  # 40 s after a's end: the same run
    publish(b, {"kind": "epoch", "row": {"epoch": 1}, "eta": 30.0, "time": 5.0})
    start(c, t0 + 55)  # no worker yet
    start(d, t0 + 56)
    publish(d, {"kind": "end", "error": "NoWorkersError: none", "time": 2.0})
    later = t0 + 55 + 5 + 3600  # a fit an hour after every fit of the first run ended
    start(e, later)

    class Scheduler:
        @staticmethod
        def get_events(topic):
            return events.get(topic, [])

    now = t0 + 60  # b's estimate was made at t0 + 55: 25 s left
    first = dashboard.server.fits_overview(Scheduler, b, now=now)
    # c still waits: the run has not ended, and e, an hour later, is in it
    assert first["counts"] == {"finished": 1, "running": 1, "waiting for workers": 2, "failed": 1}
    assert [f["fit"] for f in first["fits"]] == [e, d, c, b, a]  # newest first
    assert first["eta_s"] == pytest.approx(25.0)
    # once every fit of the first run ended, e (an hour later) is a run of its own
    publish(c, {"kind": "end", "error": None, "time": 5.0})
    publish(b, {"kind": "end", "error": None, "time": 30.0})
    assert [f["fit"] for f in dashboard.server.fits_overview(Scheduler, e, now=later)["fits"]] == [e]
    assert dashboard.server.fits_overview(Scheduler, None, now=later)["counts"]["waiting for workers"] == 1
