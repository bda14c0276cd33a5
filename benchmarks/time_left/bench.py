"""The time left that ``verbose=1``, ``ProgressBar`` and the live page show, against the truth.

For the quick start's fits (digits, the embedded cluster) and a synthetic task on a LocalCluster of
2 workers, constant and GeoDamp batches: at each epoch's start, the estimate and the time the fit
really took from there.  ``python -m benchmarks.time_left`` prints a table (error = told / took - 1).
"""

from __future__ import annotations

import time

import numpy as np
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits

from adadamp import DaskClassifier
from adadamp.callbacks import Callback
from adadamp.dampers import GeoDamp

TOLD: dict[int, tuple[float, float | None]] = {}


class Watch(Callback):
    def on_epoch_begin(self, estimator, eta=None, epoch=None, **info):
        TOLD[epoch] = (time.monotonic(), eta)


def run(name: str, X, y, **params) -> None:
    TOLD.clear()
    DaskClassifier(random_state=0, callbacks=[Watch()], **params).fit(X, y)
    end = time.monotonic()
    cells = []
    for epoch, (at, eta) in sorted(TOLD.items())[1:]:
        cells.append(f"{epoch}: {eta:.2f}/{end - at:.2f} ({eta / (end - at) - 1:+.0%})")
    print(f"| {name} | " + ", ".join(cells) + " |", flush=True)


def main() -> None:
    print("| fit | epoch: told s / took s (error) |\n|---|---|")
    X, y = load_digits(return_X_y=True)
    X = X / 16
    run("digits, constant 32, embedded", X, y, optimizer__lr=3e-3, max_epochs=20)
    run("digits, GeoDamp 16 x2 every 3, embedded", X, y, batch_size=GeoDamp(initial=16, delay=3, factor=2),
        max_epochs=20)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6000, 64)).astype("float32")
    y = (X[:, :8].sum(1) > 0).astype(int) + 2 * (X[:, 8:16].sum(1) > 0)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster):
        run("6000 x 64, constant 32, 2 workers", X, y, batch_size=32, max_epochs=12)
        run("6000 x 64, GeoDamp 32 x2 every 2, 2 workers", X, y, batch_size=GeoDamp(initial=32, delay=2, factor=2),
            max_epochs=16)
