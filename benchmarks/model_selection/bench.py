"""Model selection as a user runs it (issue 30): ``GridSearchCV``, 3 folds, over 8 candidates (two
batch-size schedules x four learning rates) on W1-sized data, timed whole.

    python -m benchmarks.model_selection                          # every system (~10 min on 2 cores)
    python -m benchmarks.model_selection --systems adadamp skorch-1 --quick
    python -m benchmarks.model_selection --systems adadamp-joblib-dask skorch-joblib-dask

Systems (each in a fresh Python process, data made before the clock starts):

- ``adadamp``: ``GridSearchCV(DaskClassifier(client=...))`` on a warm LocalCluster of 2
  single-threaded workers (``n_jobs=1``: each fit uses both workers).
- ``adadamp-2``: the same search with ``n_jobs=2`` on joblib's threads, each fit with
  ``max_workers=1``: two fits at once, each on its own worker (as skorch's ``n_jobs=2``).
- ``adadamp-joblib-dask``: the same search inside ``joblib.parallel_backend("dask")``: each fit is a
  task on a worker, whose estimator trains there (``max_workers=1``: the worker its task runs on).
- ``skorch-1`` / ``skorch-2``: skorch's ``NeuralNetClassifier`` in ``GridSearchCV`` with
  ``n_jobs=1`` (2 torch threads) / ``n_jobs=2`` (joblib's processes, 1 torch thread each).
- ``skorch-joblib-dask``: skorch's search inside ``joblib.parallel_backend("dask")`` on the same
  cluster (one fit per single-threaded worker).
- ``plain``: the 24 fits as plain PyTorch loops in one process (2 threads), scored on the held-out
  fold: the floor.

The schedules: a constant batch of 512, and 256 growing to 512 after the first of the 2 epochs
(adadamp's ``GeoDamp(initial=256, delay=1, factor=2)``; skorch and the plain loops set the batch
size at each epoch's start).  Writes ``benchmarks/model_selection/model_selection.md`` (``-quick`` with ``--quick``)
and the raw rows to ``model_selection.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..common.workloads import WORKLOADS, mlp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository
SYSTEMS = ("plain", "adadamp", "adadamp-2", "skorch-1", "skorch-2", "adadamp-joblib-dask", "skorch-joblib-dask")
LRS = (0.005, 0.01, 0.02, 0.05)
SCHEDULES = ("constant-512", "256-then-512")
EPOCHS, FOLDS, MOMENTUM = 2, 3, 0.9


def batch_at(schedule: str, epoch: int) -> int:
    return 512 if schedule == "constant-512" or epoch >= 1 else 256


def data(quick: bool):
    return WORKLOADS["W1"].data(quick)


# ------------------------------------------------------------------ the systems
def _adadamp_grid():
    from adadamp.dampers import Constant, GeoDamp

    schedules = {"constant-512": Constant(batch_size=512), "256-then-512": GeoDamp(initial=256, delay=1, factor=2)}
    return {"batch_size": [schedules[s] for s in SCHEDULES], "optimizer__lr": list(LRS)}


def run_adadamp(X, y, joblib_dask: bool = False, n_jobs: int = 1) -> dict:
    import joblib
    from sklearn.model_selection import GridSearchCV

    from adadamp import DaskClassifier

    from ..common.peers import local_cluster

    torch.set_num_threads(1)
    cluster, client = local_cluster(2)
    try:
        client.wait_for_workers(2)
        parallel = joblib_dask or n_jobs > 1  # several fits at once: one worker each
        est = DaskClassifier(module=mlp(), optimizer=torch.optim.SGD, optimizer__momentum=MOMENTUM, max_epochs=EPOCHS,
                             random_state=0, client=None if joblib_dask else client, max_workers=1 if parallel else None)
        search = GridSearchCV(est, _adadamp_grid(), cv=FOLDS, refit=False, error_score="raise",
                              n_jobs=-1 if joblib_dask else n_jobs)
        with client.as_current():
            start = time.perf_counter()
            with joblib.parallel_backend("dask" if joblib_dask else "threading"):
                search.fit(X, y)
            wall = time.perf_counter() - start
    finally:
        client.close()
        cluster.close()
    return _result(search, wall)


def _skorch_net(threads: int):
    """skorch's classifier with the schedule as a parameter (``schedule``): each epoch's batch size is
    set on the training loader's batch sampler as the epoch begins (skorch builds the loader once)."""
    from skorch import NeuralNetClassifier

    class ScheduledNet(NeuralNetClassifier):
        def __init__(self, *args, schedule: str = "constant-512", **kwargs):
            super().__init__(*args, **kwargs)
            self.schedule = schedule

        def get_iterator(self, dataset, training=False):
            loader = super().get_iterator(dataset, training=training)
            if training:
                self.train_loader_ = loader
            return loader

        def on_epoch_begin(self, net, **kwargs):
            super().on_epoch_begin(net, **kwargs)  # the epoch's history row
            self.train_loader_.batch_sampler.batch_size = batch_at(self.schedule, len(self.history) - 1)

    torch.set_num_threads(threads)
    net = ScheduledNet(module=mlp, criterion=nn.CrossEntropyLoss, optimizer=torch.optim.SGD,
                       optimizer__momentum=MOMENTUM, max_epochs=EPOCHS, batch_size=512, train_split=None,
                       iterator_train__shuffle=True, verbose=0)
    return net, {"schedule": list(SCHEDULES), "lr": list(LRS)}


def run_skorch(X, y, n_jobs: int, joblib_dask: bool = False) -> dict:
    import joblib
    from sklearn.model_selection import GridSearchCV

    net, grid = _skorch_net(threads=2 if n_jobs == 1 and not joblib_dask else 1)
    search = GridSearchCV(net, grid, cv=FOLDS, refit=False, error_score="raise", n_jobs=n_jobs)
    if not joblib_dask:
        start = time.perf_counter()
        search.fit(X, y)
        return _result(search, time.perf_counter() - start)
    from ..common.peers import local_cluster

    cluster, client = local_cluster(2)
    try:
        client.wait_for_workers(2)
        with client.as_current(), joblib.parallel_backend("dask"):
            start = time.perf_counter()
            search.fit(X, y)
            wall = time.perf_counter() - start
    finally:
        client.close()
        cluster.close()
    return _result(search, wall)


def run_plain(X, y) -> dict:
    """The same 24 fits as plain PyTorch loops (shuffled batches, the schedule per epoch), each scored
    by accuracy on its held-out fold."""
    from sklearn.model_selection import StratifiedKFold

    torch.set_num_threads(2)
    start = time.perf_counter()
    scores = {}
    folds = list(StratifiedKFold(FOLDS).split(X, y))
    for schedule in SCHEDULES:
        for lr in LRS:
            accs = []
            for train, test in folds:
                torch.manual_seed(0)
                model = mlp()
                opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
                crit = nn.CrossEntropyLoss()
                Xt, yt = torch.from_numpy(X[train]), torch.from_numpy(y[train])
                for epoch in range(EPOCHS):
                    order = torch.randperm(len(Xt))
                    for idx in order.split(batch_at(schedule, epoch)):
                        opt.zero_grad()
                        crit(model(Xt[idx]), yt[idx]).backward()
                        opt.step()
                with torch.no_grad():
                    pred = model(torch.from_numpy(X[test])).argmax(1).numpy()
                accs.append(float((pred == y[test]).mean()))
            scores[f"{schedule}, lr={lr}"] = float(np.mean(accs))
    wall = time.perf_counter() - start
    best = max(scores, key=scores.get)
    return {"wall_s": wall, "n_fits": len(SCHEDULES) * len(LRS) * FOLDS, "best": best, "best_score": scores[best]}


def _result(search, wall: float) -> dict:
    res = search.cv_results_
    k = int(np.argmax(res["mean_test_score"]))
    fit_s = float(np.sum(res["mean_fit_time"]) * FOLDS)
    return {"wall_s": wall, "n_fits": len(res["params"]) * FOLDS, "fits_s": fit_s,
            "best": str(res["params"][k]), "best_score": float(res["mean_test_score"][k])}


def run_system(system: str, quick: bool) -> dict:
    X, y = data(quick)
    if system == "plain":
        return run_plain(X, y)
    if system == "adadamp":
        return run_adadamp(X, y)
    if system == "adadamp-2":
        return run_adadamp(X, y, n_jobs=2)
    if system == "adadamp-joblib-dask":
        return run_adadamp(X, y, joblib_dask=True)
    if system == "skorch-joblib-dask":
        return run_skorch(X, y, n_jobs=-1, joblib_dask=True)
    return run_skorch(X, y, n_jobs=int(system.rsplit("-", 1)[1]))


# ------------------------------------------------------------------ driver
def table(rows: list[dict], quick: bool, n: int) -> str:
    by = {r["system"]: r for r in rows if "error" not in r}
    skorch = by.get("skorch-1")
    out = [
        f"# Model selection: GridSearchCV, {FOLDS} folds x 8 candidates{' (--quick)' if quick else ''}",
        "",
        (f"W1-sized data ({n:,} x 784; each fit trains on {FOLDS - 1}/{FOLDS} of it for {EPOCHS} epochs); candidates: "
        f"batch {' / '.join(SCHEDULES)} x lr {', '.join(map(str, LRS))}. Wall time of the whole search "
        "(`search.fit`, refit=False); **fits s**: the fits' own time as the search records it (`mean_fit_time`)."),
        "",
        "| system | wall s | vs skorch n_jobs=1 | fits s | s per fit | best candidate | best accuracy |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for system in SYSTEMS:
        r = by.get(system)
        if r is None:
            continue
        vs = f"{skorch['wall_s'] / r['wall_s']:.2f}x" if skorch else "-"
        fits = f"{r['fits_s']:.1f}" if "fits_s" in r else "-"
        out.append(f"| {system} | {r['wall_s']:.1f} | {vs} | {fits} | {r['wall_s'] / r['n_fits']:.2f} "
                   f"| {r['best']} | {r['best_score']:.4f} |")
    out += ["", "**vs skorch n_jobs=1**: skorch's wall time divided by the system's (above 1: faster)."]
    errors = [r for r in rows if "error" in r]
    out += [f"- {r['system']} failed: `{r['error'].splitlines()[-1] if r['error'] else ''}`" for r in errors]
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--quick", action="store_true", help="4,096 examples instead of 60,000")
    ap.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps({"system": args.one, **run_system(args.one, args.quick)}), flush=True)
        return
    raw = HERE / ("model_selection-quick.json" if args.quick else "model_selection.json")
    rows = {r["system"]: r for r in (json.loads(raw.read_text()) if raw.exists() else [])}
    for system in args.systems:
        cmd = [sys.executable, "-m", "benchmarks.model_selection", "--one", system] + ["--quick"] * args.quick
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=1800)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if proc.returncode == 0 and lines else {"system": system,
                                                                            "error": proc.stderr[-2000:]}
        print(json.dumps(row), flush=True)
        rows[system] = row  # merged with earlier pieces
    raw.write_text(json.dumps(list(rows.values()), indent=1) + "\n")
    text = table(list(rows.values()), args.quick, len(data(args.quick)[0]))
    print(text)
    (HERE / ("model_selection-quick.md" if args.quick else "model_selection.md")).write_text(text)
