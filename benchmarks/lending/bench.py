"""Idle workers lent to a fit: a batch that wants one worker, on a cluster of two.

A fit of batch 64 with ``grads_per_worker=128`` wants one worker; on a 2-worker ``LocalCluster``
(one thread each) the other idles unless the allocator lends it (``adadamp.cluster.division.lend``: with
``shares="speed"``, when the fit's measured speeds say a second worker shortens an update).
Three ways, alternating, each a whole ``fit`` on the warm cluster:

- ``equal``: equal shares (the default): one worker, nothing lent;
- ``speed, max_workers=1``: speed shares, nothing to borrow;
- ``speed, lent``: speed shares, the idle worker lent.

Workloads: ``emulated`` (:mod:`benchmarks.common.emulated`: an MLP 32-64-1 whose training forward sleeps
0.5 ms + 0.1 ms per example on its worker, off the CPU; 8,192 examples, 3 epochs) and ``W2``
(:mod:`benchmarks.common.workloads`: an MLP 784-2048-10 on the CPU, 60,000 examples, 2 epochs).
Writes ``benchmarks/lending/lending.json`` and ``benchmarks/lending/lending.md``.

    python -m benchmarks.lending [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WAYS = {"equal": {"shares": "equal"}, "speed, max_workers=1": {"shares": "speed", "max_workers": 1},
        "speed, lent": {"shares": "speed"}}


def _estimator(workload: str, client, **params):
    import torch

    from adadamp import DaskClassifier, DaskRegressor
    from adadamp.modules import MLP
    from benchmarks.common.emulated import Emulated

    common = {"batch_size": 64, "grads_per_worker": 128, "random_state": 0, "client": client,
              "optimizer": torch.optim.SGD, "optimizer__lr": 0.01, "max_epochs": 3 if workload == "emulated" else 2,
              **params}
    if workload == "emulated":
        return DaskRegressor(module=Emulated, module__inner=MLP, module__n_features=32, module__n_outputs=1,
                             module__hidden=(64,), **common)
    return DaskClassifier(module=MLP, module__n_features=784, module__n_outputs=10, module__hidden=(2048,), **common)


def _data(workload: str):
    import numpy as np

    from benchmarks.common.workloads import WORKLOADS, make_data

    if workload == "emulated":
        rng = np.random.default_rng(0)
        X = rng.normal(size=(8192, 32)).astype("float32")
        return X, (X @ rng.normal(size=(32, 1))).astype("float32")
    w = WORKLOADS["W2"]
    return make_data(w.n, w.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        for workload in ("emulated", "W2"):
            X, y = _data(workload)
            _estimator(workload, client, max_epochs=1).fit(X[:2048], y[:2048])  # warm: imports, first set-ups
            for repeat in range(args.repeats):
                for way, params in WAYS.items():
                    start = time.perf_counter()
                    est = _estimator(workload, client, **params).fit(X, y)
                    wall = time.perf_counter() - start
                    updates = [u for row in est.history_ for u in row["updates"]]
                    row = {"workload": workload, "way": way, "repeat": repeat, "fit_s": round(wall, 2),
                           "examples_per_s": round(sum(u["batch_size"] for u in updates) / wall),
                           "lent_updates": round(sum(u.get("lent", 0) > 0 for u in updates) / len(updates), 3),
                           "mean_workers": round(sum(u["n_workers"] for u in updates) / len(updates), 2)}
                    print(row, flush=True)
                    rows.append(row)
    (HERE / "lending.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| workload | way | fit (s), each repeat | examples/s | / equal | updates on a lent worker | mean workers |",
             "|---|---|---|---:|---:|---:|---:|"]
    for workload in ("emulated", "W2"):
        base = [r["examples_per_s"] for r in rows if r["workload"] == workload and r["way"] == "equal"]
        for way in WAYS:
            mine = [r for r in rows if r["workload"] == workload and r["way"] == way]
            rate = sum(r["examples_per_s"] for r in mine) / len(mine)
            lines.append(f"| {workload} | {way} | {', '.join(str(r['fit_s']) for r in mine)} | {rate:,.0f} | "
                         f"{rate / (sum(base) / len(base)):.2f} | {mine[-1]['lent_updates']:.0%} | "
                         f"{mine[-1]['mean_workers']:.2f} |")
    (HERE / "lending.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
