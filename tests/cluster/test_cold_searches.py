"""Searches from a cold cluster (no worker yet) with every joblib backend: fits that hold no cluster
object (joblib's loky processes, tasks on Dask workers) declare what they want to the scheduler's
allocator, and the adaptive of the process that made the cluster grows it for them; a fit that gets
no worker says why.  Real LocalClusters of worker processes started with none."""

import logging

import joblib
import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import make_regression
from sklearn.model_selection import GridSearchCV

from adadamp import DaskRegressor, NoWorkersError
from adadamp.cluster import adapt
from adadamp.dampers import GeoDamp


@pytest.fixture(scope="module")
def data():
    X, y = make_regression(n_samples=256, n_features=6, noise=0.1, random_state=0)
    return X.astype(np.float32), y.astype(np.float32)


def _cold_cluster() -> LocalCluster:
    return LocalCluster(n_workers=0, threads_per_worker=1, processes=True, dashboard_address=None,
                        silence_logs=logging.ERROR)


def _estimator(client, **kw) -> DaskRegressor:
    params = {"scale_cluster": True, "max_workers": 2, "max_epochs": 2, "random_state": 0, "batch_size": GeoDamp,
              "batch_size__initial": 32, "batch_size__delay": 1, "batch_size__factor": 4, "grads_per_worker": 32,
              "worker_timeout": 60}
    return DaskRegressor(client=client, **{**params, **kw})


def test_a_fit_without_the_cluster_object_grows_the_cluster_through_the_adaptive_where_it_was_made(data):
    """A client connected by address (as in joblib's processes) cannot scale the cluster; the adaptive
    of the process that made it grows it for the fit's wants (main's fit declared no growth: it waited
    out worker_timeout with the cluster at 0 workers)."""
    X, y = data
    with _cold_cluster() as cluster, Client(cluster.scheduler_address, set_as_default=False) as remote:
        adapt(cluster, minimum=0, maximum=2)
        assert getattr(remote, "cluster", None) is None
        est = _estimator(remote).fit(X, y)
        workers = [u["n_workers"] for row in est.history_ for u in row["updates"]]
        assert workers[0] >= 1 and max(workers) == 2, workers


@pytest.mark.parametrize("scale", [True, False])
def test_a_fit_that_gets_no_worker_says_why(data, scale):
    X, y = data
    with _cold_cluster() as cluster, Client(cluster.scheduler_address, set_as_default=False) as remote:
        est = _estimator(remote, worker_timeout=12).set_params(scale_cluster=scale)
        with pytest.raises(NoWorkersError) as err:
            est.fit(X, y)
    said = str(err.value)
    if scale:  # nobody adapts the cluster, and this process cannot
        assert "Nobody sizes the cluster" in said and "adadamp.cluster.adapt(cluster, maximum=N)" in said, said
        assert "holds no cluster object" in said, said
    else:
        assert "scale_cluster is off" in said, said
    assert not hasattr(est, "history_")


def _search(client, n_jobs: int) -> GridSearchCV:
    return GridSearchCV(_estimator(client), {"optimizer__lr": [0.01, 0.03]}, cv=2, n_jobs=n_jobs,
                        error_score="raise")


@pytest.mark.parametrize("backend", ["loky", "dask"])
def test_a_search_on_a_cold_cluster_trains_every_fit_with_any_backend(data, backend):
    """loky: ``client=`` travels to joblib's processes, whose fits declare their wants; the adaptive
    here grows the cluster.  "dask": joblib waits for a worker before it submits a task, so the recipe
    keeps one (``adapt(cluster, minimum=1)``) and gives joblib time for it to start.  Scores bitwise
    those of the threading search on the same cluster."""
    X, y = data
    with _cold_cluster() as cluster, Client(cluster, set_as_default=backend == "dask") as client:
        adapt(cluster, minimum=1 if backend == "dask" else 0, maximum=3)
        with joblib.parallel_config(backend=backend, n_jobs=2, **({"wait_for_workers_timeout": 120}
                                                                  if backend == "dask" else {})):
            cold = _search(client if backend == "loky" else None, n_jobs=2).fit(X, y)
        with joblib.parallel_config(backend="threading"):
            warm = _search(client, n_jobs=2).fit(X, y)
    np.testing.assert_array_equal(cold.cv_results_["split0_test_score"], warm.cv_results_["split0_test_score"])
    np.testing.assert_array_equal(cold.cv_results_["split1_test_score"], warm.cv_results_["split1_test_score"])
