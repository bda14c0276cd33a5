"""Stress loop (not part of the suite): the joblib-"dask"-backend search of
tests/estimators/test_model_selection.py, many times on one long-lived cluster that also goes through what a
user's does between searches (a worker SIGKILLed and replaced by its nanny, other fits).

    .venv/bin/python tests/system/stress/repeat_joblib_search.py [--repeats 20]

Each repeat checks that the search run inside worker tasks and the same search run from this process
give equal scores and the same best parameters; prints one line per repeat and exits 1 on a mismatch.
"""

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests, importable here and on the workers

from test_model_selection import test_joblib_dask_backend_fits_on_the_workers as joblib_search

from adadamp import DaskClassifier


def churn(cluster: LocalCluster, client: Client, k: int, X, y) -> None:
    """Between searches: another fit, and (every other repeat) a worker killed and replaced."""
    DaskClassifier(max_epochs=1, batch_size=16, random_state=k).fit(X, y)
    if k % 2 == 0:
        pids = list(client.run(os.getpid).values())
        victim = pids[k // 2 % len(pids)]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if time.monotonic() > deadline - 30:  # the nanny did not restart it: start a new worker
                cluster.scale(len(pids))
            try:
                now = list(client.run(os.getpid).values())
            except OSError:  # the dead worker is still listed
                now = []
            if len(now) == len(pids) and victim not in now:
                return
            time.sleep(0.2)
        raise RuntimeError(f"the nanny did not replace the killed worker within 60 s (pids {pids} -> {now})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    failures = 0
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        for k in range(args.repeats):
            start = time.perf_counter()
            try:
                # other rows each repeat: joblib scatters the data under its hash, and a key that
                # lived on a killed worker can be reported lost to the next search (a Dask matter)
                joblib_search(client, (X[k : k + 300], y[k : k + 300]))
                verdict = "equal"
            except AssertionError as err:
                failures += 1
                verdict = "DIFFERENT: " + " ".join(str(err).split())[:300]
            print(f"repeat {k + 1:2d}/{args.repeats}: {verdict} ({time.perf_counter() - start:.1f} s)", flush=True)
            churn(cluster, client, k, X[:300], y[:300])
    print(f"{args.repeats - failures} of {args.repeats} repeats gave the same models")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
