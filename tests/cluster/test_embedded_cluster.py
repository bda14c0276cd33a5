"""The embedded cluster: one per process, shared by the fits that run with no client (a search, a
loop of fits, a notebook), grown for the largest fit that asked, closed when idle, by
``adadamp.close_embedded_cluster()`` and at exit; a fit on it is as reproducible as on a fresh
one.  A script without a main guard is told to add one."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import dask
import joblib
import numpy as np
import psutil
import pytest
import torch
from distributed import Client
from sklearn.model_selection import GridSearchCV
from torch import nn

import adadamp
from adadamp import DaskRegressor
from adadamp.cluster import embedded_cluster
from adadamp.dampers import GeoDamp


class DropoutNet(nn.Module):
    """Dropout draws random numbers on the client (the output check) and the workers (each update)."""

    def __init__(self, n_features: int = 8, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


PARAMS = {"module": DropoutNet, "batch_size": 32, "max_epochs": 2, "max_workers": 2, "random_state": 3}


@pytest.fixture(scope="module")
def data(regression_data):
    return regression_data


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _n_workers(cluster) -> int:
    return len(cluster.scheduler_info["workers"])


def test_fits_without_a_client_share_one_cluster_until_it_is_closed(data, new_processes):
    from distributed import default_client

    with pytest.raises(ValueError):
        default_client()
    X, y = data
    first = DaskRegressor(**PARAMS).fit(X, y)
    cluster = embedded_cluster()
    assert cluster is not None
    address, processes = cluster.scheduler_address, _children()
    start = time.perf_counter()
    second = DaskRegressor(**PARAMS).fit(X, y)
    print(f"second fit on the warm embedded cluster: {time.perf_counter() - start:.2f} s")
    assert embedded_cluster() is cluster and cluster.scheduler_address == address
    assert _children() == processes  # the second fit started and stopped no process
    np.testing.assert_array_equal(_weights(second), _weights(first))
    adadamp.close_embedded_cluster()
    assert embedded_cluster() is None
    left = new_processes()
    assert left == [], [p.cmdline() for p in left]
    adadamp.close_embedded_cluster()  # closing again is a no-op


def test_a_fit_on_a_larger_warm_cluster_uses_the_workers_it_wants(data):
    """The batch grows 16 -> 32 (one worker, then two): on a warm cluster of three workers the fit
    uses the same workers per epoch as on a fresh cluster, retires none, and ends bitwise equal."""
    X, y = data
    growing = {**PARAMS, "batch_size": GeoDamp(initial=16, delay=1, factor=2), "grads_per_worker": 16}
    fresh = DaskRegressor(**growing).fit(X, y)
    assert [row["n_workers"] for row in fresh.history_] == [1, 2]
    cluster = embedded_cluster()
    DaskRegressor(**{**PARAMS, "max_workers": 3, "scale_cluster": False, "max_epochs": 1}).fit(X, y)
    assert embedded_cluster() is cluster and _n_workers(cluster) == 3  # grown for the largest fit
    warm = DaskRegressor(**growing).fit(X, y)
    assert [row["n_workers"] for row in warm.history_] == [1, 2]
    np.testing.assert_array_equal(_weights(warm), _weights(fresh))
    assert embedded_cluster() is cluster and _n_workers(cluster) == 3  # nothing retired


def test_the_warm_cluster_trains_after_one_of_its_workers_was_killed(data):
    X, y = data
    params = {**PARAMS, "scale_cluster": False, "min_workers": 2}  # 2 workers throughout
    before = DaskRegressor(**params).fit(X, y)
    assert before.history_[-1]["n_workers"] == 2
    cluster = embedded_cluster()
    with Client(cluster, set_as_default=False) as client:
        victim, pid = next(iter(client.run(os.getpid).items()))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while victim in cluster.scheduler_info["workers"] and time.monotonic() < deadline:
        time.sleep(0.05)  # the scheduler has dropped the dead worker; its nanny is restarting it
    after = DaskRegressor(**params).fit(X, y)
    assert embedded_cluster() is cluster
    assert [row["n_workers"] for row in after.history_] == [row["n_workers"] for row in before.history_]
    np.testing.assert_array_equal(_weights(after), _weights(before))


def test_a_threaded_search_starts_one_cluster_and_matches_a_sequential_search(data, new_processes):
    """GridSearchCV's fits, two at a time on threads, share one cluster: the only processes left
    running afterwards are its workers."""
    X, y = data
    adadamp.close_embedded_cluster()  # the search starts the cluster (not the earlier tests' warm one)
    search = GridSearchCV(DaskRegressor(**{**PARAMS, "max_epochs": 1}), {"optimizer__lr": [0.01, 0.03]}, cv=2)
    with joblib.parallel_backend("threading", n_jobs=2):
        threaded = search.set_params(n_jobs=2).fit(X, y).cv_results_
    cluster = embedded_cluster()
    assert cluster is not None
    with Client(cluster, set_as_default=False) as client:
        workers = set(client.run(os.getpid).values())
    assert {p.pid for p in new_processes(timeout=0)} == workers
    adadamp.close_embedded_cluster()
    sequential = search.set_params(n_jobs=1).fit(X, y).cv_results_
    for split in ("split0_test_score", "split1_test_score"):  # each fit, named where one differs
        np.testing.assert_array_equal(threaded[split], sequential[split], err_msg=split)


def test_an_idle_cluster_closes_after_the_configured_timeout(data, new_processes):
    X, y = data
    with dask.config.set({"adadamp.embedded-cluster.idle-timeout": "1s"}):
        DaskRegressor(**{**PARAMS, "max_epochs": 1}).fit(X, y)
    assert embedded_cluster() is not None
    deadline = time.monotonic() + 60
    while embedded_cluster() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert embedded_cluster() is None
    assert new_processes() == [], "the idle embedded cluster left processes behind"


def test_a_bad_idle_timeout_is_named_before_any_cluster_work(data, new_processes):
    X, y = data
    with dask.config.set({"adadamp.embedded-cluster.idle-timeout": "soon"}), pytest.raises(
        ValueError, match=r"adadamp.embedded-cluster.idle-timeout='soon' is not a duration"
    ):
        DaskRegressor(**PARAMS).fit(X, y)
    assert embedded_cluster() is None and new_processes() == []


def _fit_elsewhere(X, y):
    """A fit in a joblib worker process; returns the process, its cluster's address and the weights."""
    est = DaskRegressor(**{**PARAMS, "max_workers": 1}).fit(X, y)
    address = embedded_cluster().scheduler_address
    adadamp.close_embedded_cluster()
    return os.getpid(), address, _weights(est)


def test_a_fit_in_another_process_starts_a_cluster_of_its_own(data):
    X, y = data
    here = DaskRegressor(**{**PARAMS, "max_workers": 1}).fit(X, y)
    address = embedded_cluster().scheduler_address
    child = os.fork()
    if child == 0:  # a forked child does not inherit the parent's cluster (its client is the parent's)
        os._exit(0 if embedded_cluster() is None else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    ((pid, theirs, weights),) = joblib.Parallel(n_jobs=2, backend="loky")([joblib.delayed(_fit_elsewhere)(X, y)])
    assert pid != os.getpid() and theirs != address
    np.testing.assert_array_equal(weights, _weights(here))
    assert embedded_cluster().scheduler_address == address


SCRIPT = """
import time

import numpy as np

from adadamp import DaskRegressor

X = np.random.default_rng(0).normal(size=(128, 4)).astype(np.float32)
y = X @ np.arange(4, dtype=np.float32)
"""


def _run(tmp_path, code: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT + textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    proc = _run(tmp_path, "DaskRegressor(max_epochs=1, max_workers=1).fit(X, y)\n")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError:") and 'if __name__ == "__main__":' in last, proc.stderr[-3000:]
    assert f"train.py, line {len(SCRIPT.splitlines()) + 1}" in last, last
    # the worker processes stopped at the fit instead of starting clusters of their own
    assert "An attempt has been made to start a new process" not in proc.stderr, proc.stderr[-3000:]


def test_a_script_with_a_main_guard_shares_the_cluster_and_exits_clean(tmp_path):
    proc = _run(tmp_path, """
        def main():
            import psutil

            from adadamp.cluster import embedded_cluster

            DaskRegressor(max_epochs=1, max_workers=2, random_state=0).fit(X, y)
            cluster = embedded_cluster()
            start = time.perf_counter()
            DaskRegressor(max_epochs=1, max_workers=2, random_state=0).fit(X, y)
            print(f"second fit: {time.perf_counter() - start:.2f} s")
            print("shared:", embedded_cluster() is cluster)
            print("workers:", *[p.pid for p in psutil.Process().children(recursive=True)])


        if __name__ == "__main__":
            main()
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    assert "shared: True" in proc.stdout
    pids = [int(p) for line in proc.stdout.splitlines() if line.startswith("workers:") for p in line.split()[1:]]
    assert pids
    left = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    assert psutil.wait_procs(left, timeout=10)[1] == [], "the embedded cluster outlived the script"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_healing_a_fit_never_stops_a_worker_the_scheduler_still_lists(data):
    """A fit that gave up on a worker (a hang, a failed set-up) counts it as gone; asking the
    embedded cluster again must not stop it: another fit of a threaded search may be training there."""
    from adadamp.cluster import heal

    DaskRegressor(**{**PARAMS, "max_epochs": 1, "scale_cluster": False}).fit(*data)
    cluster = embedded_cluster()
    with Client(cluster, set_as_default=False) as client:
        before = {a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
        assert len(before) == 2
        heal(client, gone={str(name) for name in before.values()})
        time.sleep(1.0)
        after = set(client.scheduler_info(n_workers=-1)["workers"])
    assert after == set(before), "heal stopped a live worker"


def test_healing_keeps_a_nanny_that_is_restarting_its_killed_worker(data):
    """A killed worker's nanny restarts it under the same name; healing the fit meanwhile must not
    stop that nanny and start a new one from nothing (seconds more, and once a replacement that never
    registered)."""
    from adadamp.cluster import heal

    DaskRegressor(**{**PARAMS, "max_epochs": 1, "scale_cluster": False}).fit(*data)
    cluster = embedded_cluster()
    with Client(cluster, set_as_default=False) as client:
        (address, pid), *_ = client.run(os.getpid).items()
        name = str(client.scheduler_info(n_workers=-1)["workers"][address]["name"])
        nanny = next(w for spec_name, w in cluster.workers.items() if str(spec_name) == name)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while address in client.scheduler_info(n_workers=-1)["workers"] and time.monotonic() < deadline:
            time.sleep(0.05)
        heal(client, gone={name})
        client.wait_for_workers(2, timeout=60)
        names = {str(w["name"]) for w in client.scheduler_info(n_workers=-1)["workers"].values()}
    assert name in names, "the nanny's spec was dropped: a new worker replaced the restarting one"
    assert any(w is nanny for w in cluster.workers.values())
