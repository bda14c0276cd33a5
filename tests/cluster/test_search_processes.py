"""Searches whose fits run in joblib's worker processes (loky, joblib's default backend) train on the
user's cluster (issue 51, item 5): ``client=`` is pickled as the scheduler's address and TLS settings
(:mod:`adadamp.cluster.pickled_client`), and an estimator with ``client=None`` finds the default client of
the process that sent it.  No child process starts an embedded cluster, and the scores equal
``n_jobs=1``'s bitwise (same seeds, one worker per fit either way)."""

import copy
import logging
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import cloudpickle
import dask
import joblib
import numpy as np
import pytest
from distributed import Client, LocalCluster, Security
from joblib.externals.loky import get_reusable_executor
from joblib.externals.loky.backend import reduction as loky_reduction
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, cross_val_score

from adadamp import DaskClassifier
from adadamp.cluster import embedded_cluster
from adadamp.cluster.pickled_client import PickledClient

GRID = {"optimizer__lr": [1e-3, 3e-3]}  # two candidates, cv=2: four fits
PARAMS = {"max_epochs": 2, "random_state": 0, "batch_size": 32}  # a batch of 32 trains on one worker


def _pid(estimator, X, y) -> float:
    """A scorer: the process the fit ran in."""
    return float(os.getpid())


def _embedded(estimator, X, y) -> float:
    """A scorer: 1.0 when the process the fit ran in has an embedded cluster."""
    return float(embedded_cluster() is not None)


SCORING = {"score": "accuracy", "pid": _pid, "embedded": _embedded}


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return (X[:300] / 16).astype(np.float32), y[:300]


@pytest.fixture(scope="module", autouse=True)
def _fresh_joblib_processes():
    """joblib's worker processes of this module only (an earlier test's may hold an embedded cluster)."""
    get_reusable_executor().shutdown(wait=True)
    yield
    get_reusable_executor().shutdown(wait=True)


def fits_seen(client) -> int:
    """The fits set up on the workers of ``client`` so far (every process's fits that trained there)."""
    from adadamp.worker import plugin

    return sum(client.run(lambda: plugin.TRAINER.stats["setups"]).values())


def search(estimator, data, n_jobs: int) -> dict:
    return GridSearchCV(estimator, GRID, cv=2, n_jobs=n_jobs, scoring=SCORING, refit=False,
                        error_score="raise").fit(*data).cv_results_


def check_in_children(results: dict, n_fits: int) -> None:
    pids = np.concatenate([results[f"split{i}_test_pid"] for i in range(2)])
    assert len(pids) == n_fits and os.getpid() not in pids, pids
    embedded = np.concatenate([results[f"split{i}_test_embedded"] for i in range(2)])
    np.testing.assert_array_equal(embedded, 0.0, err_msg="a joblib worker process started an embedded cluster")


def check_bitwise(parallel: dict, sequential: dict) -> None:
    for split in ("split0_test_score", "split1_test_score"):
        np.testing.assert_array_equal(parallel[split], sequential[split], err_msg=split)


def test_a_loky_search_trains_on_the_client_it_was_given(session_client, digits):
    est = DaskClassifier(client=session_client, **PARAMS)
    before = fits_seen(session_client)
    parallel = search(est, digits, n_jobs=2)
    assert fits_seen(session_client) - before == 4  # the user's scheduler saw every fit
    check_in_children(parallel, 4)
    sequential = search(est, digits, n_jobs=1)
    assert fits_seen(session_client) - before == 8
    check_bitwise(parallel, sequential)


def test_a_loky_search_with_no_client_trains_on_the_senders_default_client(cluster, digits):
    """``client = Client(cluster)`` as a user's script makes it, then ``client=None`` estimators."""
    with Client(cluster) as client:  # the default client of this process
        before = fits_seen(client)
        parallel = search(DaskClassifier(**PARAMS), digits, n_jobs=2)
        assert fits_seen(client) - before == 4
        check_in_children(parallel, 4)
        X, y = digits
        scores = cross_val_score(DaskClassifier(**PARAMS), X, y, cv=2, n_jobs=2)
        assert fits_seen(client) - before == 6
        sequential = search(DaskClassifier(**PARAMS), digits, n_jobs=1)
        np.testing.assert_array_equal(scores, cross_val_score(DaskClassifier(**PARAMS), X, y, cv=2, n_jobs=1))
    check_bitwise(parallel, sequential)


def test_cross_val_score_in_loky_processes_on_a_tls_cluster(digits):
    """The client's TLS credentials in memory (``security=True``) reach joblib's processes."""
    X, y = digits
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, security=True, dashboard_address=":0",
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        assert client.scheduler.address.startswith("tls://")
        est = DaskClassifier(client=client, **PARAMS)
        before = fits_seen(client)
        parallel = cross_val_score(est, X, y, cv=2, n_jobs=2)
        assert fits_seen(client) - before == 2
        np.testing.assert_array_equal(parallel, cross_val_score(est, X, y, cv=2, n_jobs=1))


def _client_param(estimator):
    return os.getpid(), estimator.get_params()["client"], clone(estimator).get_params()["client"]


def test_the_client_pickles_as_its_scheduler_and_is_the_users_again_in_its_process(session_client):
    est = DaskClassifier(client=session_client)
    assert est.get_params()["client"] is session_client
    assert clone(est).client is session_client
    for again in (pickle.loads(pickle.dumps(est)), cloudpickle.loads(cloudpickle.dumps(est)), copy.deepcopy(est)):
        assert again.client is session_client
    ((pid, theirs, cloned),) = joblib.Parallel(n_jobs=2)([joblib.delayed(_client_param)(est)])
    assert pid != os.getpid()
    assert theirs == cloned == PickledClient(session_client.scheduler.address)
    assert repr(theirs) == f"PickledClient({session_client.scheduler.address!r})"


def test_credentials_in_memory_go_only_to_child_processes():
    secure = Security.temporary()
    est = DaskClassifier(client=PickledClient("tls://127.0.0.1:1", secure))
    key = secure.tls_client_key.encode()
    for plain in (pickle.dumps(est), cloudpickle.dumps(est)):
        assert key not in plain
        assert pickle.loads(plain).client.security is None  # the dask config's settings where it is loaded
    for child in (bytes(loky_reduction.dumps(est)), bytes(ForkingPickler.dumps(est))):
        assert key in child
        assert pickle.loads(child).client.security.tls_client_key == secure.tls_client_key
    on_disk = Security(tls_ca_file="/etc/dask/ca.pem", tls_client_cert="/etc/dask/c.pem", tls_client_key="/etc/dask/k.pem")
    kept = pickle.loads(pickle.dumps(DaskClassifier(client=PickledClient("tls://127.0.0.1:1", on_disk))))
    assert kept.client.security.tls_client_key == "/etc/dask/k.pem"  # paths are no secret


def test_only_a_child_processes_pickle_says_where_an_estimator_came_from():
    est = DaskClassifier()
    assert "_sender" not in pickle.loads(pickle.dumps(est)).__dict__
    here = pickle.loads(bytes(loky_reduction.dumps(est)))
    assert here._sender.pid == os.getpid() and here._sender.resolve("DaskClassifier") is None  # unpickled where it was sent from


def test_a_pickled_client_connects_only_when_a_fit_needs_it(session_client, digits):
    X, y = digits
    est = DaskClassifier(client=session_client, max_epochs=1, random_state=0).fit(X, y)
    expected = est.predict(X)
    est.set_params(client=PickledClient("tcp://127.0.0.1:9"))  # nothing listens there
    np.testing.assert_array_equal(est.predict(X), expected)  # in-memory data: no connection
    assert est.score(X, y) == pytest.approx((expected == y).mean())
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), pytest.raises(
        ConnectionError, match=r"scheduler at tcp://127.0.0.1:9"
    ):
        est.fit(X, y)
    np.testing.assert_array_equal(est.predict(X), expected)  # the failed fit left the model as it was


def test_joblibs_dask_backend_trains_an_estimator_with_client_on_its_workers_client(session_client, digits):
    """Dask's own comms pickle the estimator to a worker: there it trains through the worker's client."""
    X, y = digits
    est = DaskClassifier(client=session_client, **PARAMS)
    before = fits_seen(session_client)
    with joblib.parallel_backend("dask", client=session_client):
        remote = cross_val_score(est, X, y, cv=2, scoring=_pid)
    assert fits_seen(session_client) - before == 2
    assert set(remote) <= {float(pid) for pid in session_client.run(os.getpid).values()}  # fitted on the workers
