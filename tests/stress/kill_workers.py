"""Kill workers at many different moments of a fit; each run must end where the undisturbed one does.

    .venv/bin/python tests/stress/kill_workers.py [--trials 30] [--epochs 20]

A worker that dies costs only its share of one update, recomputed on the others at the same
weights (docs: elasticity), so every disturbed run must equal the undisturbed one up to float
summation order: max |w - w_undisturbed| <= 1e-5.  The moments: during set-up (before the first
update), right after an update, at an epoch boundary, while the replacement of a killed worker
joins, and at random times (mid-update, during a rebalance).  tests/test_elastic.py runs a short
version in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import torch
from distributed import Client, LocalCluster
from sklearn.datasets import make_regression

from adadamp import DaskRegressor
from adadamp.callbacks import Callback

TOLERANCE = 1e-5
MOMENTS = ("setup", "after-update", "epoch-end", "replacement-joins", "random")


def data(n: int = 2048):
    X, y = make_regression(n_samples=n, n_features=16, noise=1.0, random_state=0)
    return X.astype(np.float32), (y / y.std()).astype(np.float32)


def params(epochs: int) -> dict:
    return {"module__hidden": (64,), "optimizer": torch.optim.SGD, "optimizer__lr": 0.01, "optimizer__momentum": 0.9,
            "batch_size": 128, "max_epochs": epochs, "random_state": 0, "scale_cluster": False}


def weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _kill_one(client: Client, rng: random.Random) -> int:
    pids = sorted(client.run(os.getpid).values())
    victim = rng.choice(pids)
    os.kill(victim, signal.SIGKILL)
    return victim


class Killer(Callback):
    """Kills a worker at the chosen update (``after-update``), epoch (``epoch-end``), or right after
    a replacement joined (``replacement-joins``: kill, wait for the nanny's new worker, kill again)."""

    def __init__(self, moment="after-update", at=3, address=None, seed=0):
        self.moment, self.at, self.address, self.seed = moment, at, address, seed

    def _client(self):
        if not hasattr(self, "client_"):
            self.client_ = Client(self.address, set_as_default=False)
        return self.client_

    def on_update_end(self, estimator, record=None, **info):
        self.updates_ = getattr(self, "updates_", 0) + 1
        if self.updates_ != self.at or self.moment not in ("after-update", "replacement-joins"):
            return
        client, rng = self._client(), random.Random(self.seed)
        n = len(client.scheduler_info()["workers"])
        _kill_one(client, rng)
        if self.moment == "replacement-joins":
            deadline = time.monotonic() + 30
            while len(client.scheduler_info()["workers"]) >= n and time.monotonic() < deadline:
                time.sleep(0.05)  # the scheduler notices the death ...
            client.wait_for_workers(n, timeout=60)  # ... and the nanny's new worker joins
            _kill_one(client, rng)

    def on_epoch_end(self, estimator, row=None, **info):
        if self.moment == "epoch-end" and row["epoch"] == self.at:
            _kill_one(self._client(), random.Random(self.seed))

    def on_train_end(self, estimator, **info):
        if hasattr(self, "client_"):
            self.client_.close()
            del self.client_


def trial(
    client: Client, X, y, epochs: int, moment: str, seed: int, duration: float, strict: bool = True
) -> tuple[np.ndarray, list]:
    """One disturbed fit (an undisturbed one takes ``duration`` s); returns its weights and workers per update."""
    rng = random.Random(seed)
    timer = None
    callbacks = None
    if moment == "setup":
        timer = threading.Timer(rng.uniform(0.0, 0.3), _kill_one, (client, rng))
    elif moment == "random":
        timer = threading.Timer(rng.uniform(0.0, duration), _kill_one, (client, rng))  # mid-update, rebalance...
    else:
        at = rng.randint(1, 3) if moment == "epoch-end" else rng.randint(2, 40)
        callbacks = [("kill", Killer(moment=moment, at=at, address=client.scheduler.address, seed=seed))]
    if timer is not None:
        timer.start()
    try:
        est = DaskRegressor(client=client, callbacks=callbacks, **params(epochs)).fit(X, y)
    finally:
        if timer is not None:
            timer.cancel()
    if strict:
        client.wait_for_workers(3, timeout=60)
    else:  # the nanny may not restart a killed worker (Dask, ~1 kill in 30 here): go on with fewer
        with contextlib.suppress(TimeoutError):
            client.wait_for_workers(3, timeout=15)
    time.sleep(0.5)
    return weights(est), [u["n_workers"] for row in est.history_ for u in row["updates"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    X, y = data()
    worst, failures = 0.0, 0
    calm, trials = None, iter(range(args.trials))
    while True:
        with (
            LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None, silence_logs=logging.CRITICAL) as c,
            Client(c) as client,
        ):
            start = time.perf_counter()
            w = weights(DaskRegressor(client=client, **params(args.epochs)).fit(X, y))
            duration = time.perf_counter() - start
            calm = w if calm is None else calm
            assert np.array_equal(w, calm), "undisturbed fits on two clusters of 3 workers differ"
            for k in trials:
                moment = MOMENTS[k % len(MOMENTS)]
                try:
                    w, workers = trial(client, X, y, args.epochs, moment, seed=k, duration=duration)
                except TimeoutError as err:  # a nanny that did not restart its worker (Dask): new cluster
                    print(f"trial {k + 1:2d} {moment:18s} cluster replaced ({type(err).__name__}: {err})")
                    break
                diff = float(np.abs(w - calm).max())
                worst = max(worst, diff)
                bad = diff > TOLERANCE
                failures += bad
                print(f"trial {k + 1:2d} {moment:18s} max|dw| {diff:.2e} workers {min(workers)}..{max(workers)}"
                      f"{'  FAIL' if bad else ''}", flush=True)
            else:
                break
    print(f"{args.trials - failures} of {args.trials} within {TOLERANCE:g}; worst {worst:.2e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
