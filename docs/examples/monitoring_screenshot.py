"""The screenshot of the monitoring guide: a GeoDamp fit growing its LocalCluster from 1 to 4 workers,
its live page on the Dask dashboard captured by headless Chromium.

    python docs/examples/monitoring_screenshot.py docs/_static/monitoring-page.png
"""

import logging
import subprocess
import sys

import dask
import numpy as np
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits

from adadamp import DaskClassifier
from adadamp.dampers import GeoDamp


def main(out: str) -> None:
    routes = [*dask.config.get("distributed.scheduler.http.routes"), "adadamp.dashboard"]
    with (
        dask.config.set({"distributed.scheduler.http.routes": routes}),
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        X, y = load_digits(return_X_y=True)
        X = np.tile((X / 16).astype(np.float32), (4, 1))
        y = np.tile(y, 4)
        DaskClassifier(
            batch_size=GeoDamp(initial=64, delay=1, factor=2), max_epochs=5, grads_per_worker=64, max_workers=4,
            scale_cluster=True, validation_fraction=0.1, random_state=0, client=client,
        ).fit(X, y)
        page = cluster.dashboard_link.replace("/status", "/adadamp")
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1180,1060",
             "--virtual-time-budget=8000", f"--screenshot={out}", page],
            check=True, capture_output=True,
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "monitoring-page.png")
