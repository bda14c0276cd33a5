"""No alarming line in a normal run (issue 54, item 4): each scenario runs on a real cluster and
what it logs, or what its process writes to stderr up to its exit, is read for the line a user
reported.

* ``score`` on a dask DataFrame right after ``fit``: ``Detected different run_spec for key``.
  The fit's persisted partitions outlived ``fit`` (its backend is held in reference cycles), and
  with them their lineage on the scheduler: the keys of the user's frame, as the fit's graph had
  them.  ``score``'s graph has the same keys fused otherwise by Dask's optimization.
* an all-reduce fit's workers closing: ``terminate called without an active exception`` (an
  abort).  The group kept for the next fit was destroyed on a daemon thread that the exiting
  interpreter ended inside the group's C++ destructor.
* a loky search on the user's cluster, the cluster closed, the script exiting: a traceback at
  ERROR from each joblib worker process.  Each held its connection to the scheduler between
  calls, tried to reconnect when the scheduler closed, and was cut off at exit.
"""

import logging
import subprocess
import sys
import textwrap
import time

import dask.dataframe as dd
import numpy as np
import pandas as pd

from adadamp import DaskClassifier

ALARMS = ("Traceback", "ERROR", "terminate called", "FileNotFoundError", "Failed to reconnect")


def run_script(tmp_path, source: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``source`` run as ``python script.py``: its return code, stdout and whole stderr."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=timeout,
                          cwd=str(tmp_path))


def alarms(stderr: str, of=ALARMS) -> list[str]:
    return [line for line in stderr.splitlines() if any(a in line for a in of)]


def _keys_on_scheduler(client, *names: str) -> list:
    """The scheduler's tasks of the collections ``names`` (a key's name: its first element)."""
    def keys(dask_scheduler, names=names):
        return [str(k) for k in dask_scheduler.tasks if (k[0] if isinstance(k, tuple) else k) in names]

    return client.run_on_scheduler(keys)


def test_score_on_a_dask_frame_after_fit_sends_no_key_with_another_task(client):
    """Four partitions on two workers: the fit rechunks them (a partition feeds several blocks),
    so its graph keeps the frame's ``values`` tasks apart where ``score``'s fuses them."""
    rng = np.random.default_rng(54)
    frame = pd.DataFrame(rng.normal(size=(96, 3)), columns=["a", "b", "c"])
    X = dd.from_pandas(frame, npartitions=4)
    y = dd.from_pandas((frame.a > 0).astype(int).rename("y"), npartitions=4)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    scheduler_log = logging.getLogger("distributed.scheduler")  # the LocalCluster's scheduler runs here
    level = scheduler_log.level
    scheduler_log.addHandler(handler)
    scheduler_log.setLevel(logging.WARNING)
    try:
        est = DaskClassifier(client=client, max_epochs=1, batch_size=16, random_state=0).fit(X, y)
        client.submit(int, 0, pure=False).result()  # after the fit's release on the client's stream
        deadline = time.monotonic() + 1  # (not a garbage collection of the fit's cycles meanwhile)
        while _keys_on_scheduler(client, X._name, y._name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _keys_on_scheduler(client, X._name, y._name) == []  # fit keeps nothing of them on the cluster
        assert 0.0 <= est.score(X, y) <= 1.0
        est.predict(X).compute()
        assert 0.0 <= est.score(X, y) <= 1.0
    finally:
        scheduler_log.removeHandler(handler)
        scheduler_log.setLevel(level)
    assert not [r.getMessage()[:300] for r in records if "run_spec" in r.getMessage()]


def test_an_allreduce_fits_workers_close_without_an_abort(tmp_path):
    """The workers run in the script's process (each closes there, then the process exits), as
    a worker process closes after its teardown.  Twice, since the abort was a race: the group
    is destroyed when the workers' teardown returns, and the process exits cleanly.  (Workers
    in this process log Dask's INFO lines, a closed comm's traceback among them, as they close.)"""
    proc = run_script(tmp_path, """
        import threading
        import numpy as np
        from distributed import Client, LocalCluster
        from adadamp import DaskClassifier

        if __name__ == "__main__":
            rng = np.random.default_rng(0)
            X = rng.normal(size=(64, 4)).astype("float32")
            y = (X[:, 0] > 0).astype(int)
            for _ in range(2):
                with (LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://",
                                   dashboard_address=None) as cluster,
                      Client(cluster) as client):
                    DaskClassifier(backend="allreduce", client=client, max_epochs=1, random_state=0).fit(X, y)
                    assert client.run(lambda: __import__("adadamp.worker.groups").worker.groups._KEPT is not None)
                releasing = [t for t in threading.enumerate() if t.name == "adadamp-release-group"]
                print("releasing", len(releasing), flush=True)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]  # an abort: -6
    assert proc.stdout.split().count("releasing") == 2 and "releasing 1" not in proc.stdout, proc.stdout
    assert alarms(proc.stderr, of=("terminate called", "Fatal Python error", " - ERROR - ")) == [], proc.stderr[-3000:]


def test_a_loky_search_on_the_users_cluster_ends_without_a_traceback(tmp_path):
    """joblib's worker processes outlive the search (loky keeps them for the next one); a connection
    they held to the user's scheduler between calls tried to reconnect when the user closed the
    cluster, and each process logged the attempt's traceback at ERROR on its way out.  The search's
    processes also say that they connected once per call and let go after it."""
    proc = run_script(tmp_path, """
        import time
        import joblib
        import numpy as np
        from distributed import Client, LocalCluster
        from sklearn.model_selection import GridSearchCV
        from adadamp import DaskClassifier

        def connections():
            from adadamp.cluster import pickled_client
            return len(pickled_client._CONNECTED)

        if __name__ == "__main__":
            rng = np.random.default_rng(0)
            X = rng.normal(size=(256, 4)).astype("float32")
            y = (X[:, 0] > 0).astype(int)
            with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \\
                    Client(cluster) as client:
                est = DaskClassifier(client=client, max_epochs=2, random_state=0)
                search = GridSearchCV(est, {"optimizer__lr": [0.01, 0.1]}, cv=2, n_jobs=2).fit(X, y)
                held = joblib.Parallel(n_jobs=2)(joblib.delayed(connections)() for _ in range(4))
                print("held", sum(held), "score", search.best_score_, flush=True)
            time.sleep(3)  # the worker processes, still alive, see the scheduler go
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held 0 score" in proc.stdout, proc.stdout
    assert alarms(proc.stderr) == [], proc.stderr[-3000:]

