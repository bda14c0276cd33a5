"""The live training page on the Dask dashboard (issue 18, item 1): fits publish their progress as
Dask events, the scheduler's HTTP server serves ``/adadamp`` and its JSON, and a real headless
Chromium renders it with the numbers of ``history_``."""

import json
import re
import subprocess
import urllib.request

import numpy as np
import pytest
from sklearn.datasets import load_digits

from adadamp import DaskClassifier, dashboard
from adadamp.dampers import GeoDamp


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return (X / 16).astype(np.float32), y


def _page(cluster) -> str:
    return cluster.dashboard_link.replace("/status", "/adadamp")


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _geodamp_fit(digits):
    X, y = digits
    return DaskClassifier(batch_size=GeoDamp, batch_size__initial=32, batch_size__delay=1, batch_size__factor=2,
                          max_epochs=3, validation_fraction=0.1, random_state=0).fit(X, y)


def test_the_page_data_is_the_fits_history(client, cluster, digits):
    est = _geodamp_fit(digits)
    summary = json.loads(_get(_page(cluster) + "/data.json"))
    assert summary["name"] == "DaskClassifier" and summary["fits"][0]["fit"] == summary["fit"]  # the newest fit
    assert summary["params"]["batch_size"] == "GeoDamp" and summary["params"]["batch_size__factor"] == "2"
    p = summary["progress"]
    assert p["state"] == "finished" and p["epoch"] == 3 and p["epochs"] == 3
    assert p["updates"] == est.loop_.n_updates and p["examples_seen"] == est.history_[-1]["n_samples_seen"]
    assert p["train_loss"] == est.history_[-1]["train_loss"] and p["valid_loss"] == est.history_[-1]["valid_loss"]

    updates = json.loads(_get(_page(cluster) + f"/data.json?fit={summary['fit']}&what=updates"))
    records = [u for row in est.history_ for u in row["updates"]]
    assert updates["update"] == list(range(1, len(records) + 1))
    assert updates["batch_size"] == [u["batch_size"] for u in records]
    assert updates["loss"] == [u["loss"] for u in records]
    assert updates["n_workers"] == [u["n_workers"] for u in records]
    epochs = json.loads(_get(_page(cluster) + f"/data.json?fit={summary['fit']}&what=epochs"))
    assert epochs["train_loss"] == [row["train_loss"] for row in est.history_]
    assert epochs["n_updates"] == [row["n_updates"] for row in est.history_]


def test_long_fits_are_thinned_for_the_page(monkeypatch):
    rows = [{"update": k, "time": k / 10, "loss": 1.0 / k} for k in range(1, 5001)]
    monkeypatch.setattr(dashboard, "MAX_POINTS", 1000)

    class Events:  # the scheduler's get_events, with one fit's records in it
        @staticmethod
        def get_events(topic):
            if topic == dashboard.TOPIC:
                return [(0.0, {"kind": "start", "fit": "f", "name": "X", "params": {}, "n_data": 1, "epochs": 1,
                               "time": 0.0})]
            return [(0.0, {"kind": "updates", "rows": rows[:2500]}), (0.0, {"kind": "updates", "rows": rows[2500:]})]

    data = dashboard.fit_data(Events(), "f")
    assert len(data["updates"]["update"]) == 1001 and data["updates"]["update"][-1] == 5000  # the last one kept
    assert data["progress"]["updates"] == 5000 and data["progress"]["state"] == "running"


def test_publishing_never_stops_a_fit():
    publisher = dashboard.Publisher(None, "X", {}, n_data=10, epochs=1)  # no client: nothing to publish to
    publisher.update(1, {"loss": np.float64(0.5), "batch_size": 4})
    publisher.epoch({"epoch": 1, "train_loss": np.float32(0.5), "updates": []}, eta=np.float64(1.0))
    publisher.end()


def test_chromium_renders_the_live_page(client, cluster, digits, chromium):
    est = _geodamp_fit(digits)
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000", "--dump-dom",
         _page(cluster)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout

    def cell(name: str) -> str:
        match = re.search(f'id="progress-{name}"[^>]*>([^<]*)<', dom)
        assert match, f"no {name} on the page:\n{dom[-3000:]}"
        return match.group(1)

    assert cell("epoch") == "3 / 3" and int(cell("updates")) == est.loop_.n_updates
    assert int(cell("examples_seen")) == est.history_[-1]["n_samples_seen"]
    assert float(cell("train_loss")) == pytest.approx(est.history_[-1]["train_loss"], rel=1e-5)
    plotted = re.search(r"points plotted: (\d+)", dom)  # Bokeh loaded and its data source polled the fit
    assert plotted and int(plotted.group(1)) == est.loop_.n_updates
    assert "GeoDamp" in dom and "finished" in dom
