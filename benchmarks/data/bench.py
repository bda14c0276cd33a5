"""Benchmarks of the data paths (issue 15): a lazy Dataset's loading overlapped with compute, W1
from a dask array against W1 from NumPy, where the set-up time goes, and the client's and
workers' peak memory against the size of a dask array trained on.

    python -m benchmarks.data                 # all three (about 5 minutes on 2 cores)
    python -m benchmarks.data --quick         # tiny sizes (smoke test)
    python -m benchmarks.data --part overlap  # one part: overlap, dask, setup, memory, stream, stream-zarr

Every part runs on one LocalCluster of 2 single-threaded worker processes and compares within
the run (ratios).  The numbers go to ``benchmarks/data/data.md`` (``data-quick.md`` with ``--quick``),
the memory plot to ``benchmarks/data/data-memory.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch
from distributed import Client, LocalCluster

from ..common.workloads import WORKLOADS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository
READ_SECONDS = 0.002  # the simulated read of one example


class SlowReads(torch.utils.data.Dataset):
    """Examples that take ``READ_SECONDS`` each to read (a sleep: a disk or a decoder)."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        time.sleep(READ_SECONDS)
        return self.X[i], self.y[i]


@contextlib.contextmanager
def cluster(n_workers: int = 2, memory_limit="auto"):
    with (
        LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=None, memory_limit=memory_limit,
                     silence_logs=logging.ERROR) as c,
        Client(c) as client,
    ):
        client.wait_for_workers(n_workers)
        yield client


class Peak:
    """Peak RSS (MB) of this process and, separately, of its descendants (the workers), sampled."""

    def __init__(self, every: float = 0.05):
        self.client = self.workers = 0.0
        self._every, self._stop = every, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        me = psutil.Process()
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.client = max(self.client, me.memory_info().rss / 2**20)
                total = 0
                for p in me.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
                self.workers = max(self.workers, total / 2**20)
            self._stop.wait(self._every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _updates(est, skip_epochs: int = 0) -> list[dict]:
    return [u for row in est.history_[skip_epochs:] for u in row["updates"]]


def _mlp(n_in: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(n_in, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )


# ------------------------------------------------------------------ (1) loading overlaps compute
def overlap(quick: bool) -> list[str]:
    """Per update: the time with a lazy Dataset read at ``READ_SECONDS`` per example against the
    time to compute the same update from resident arrays, and against their sum."""
    from adadamp import DaskClassifier

    n, batch, width = (1024, 64, 256) if quick else (4096, 128, 3072)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 256), dtype=np.float32)
    y = rng.integers(0, 10, n)
    kwargs = {"module": _mlp(256, width), "optimizer": torch.optim.SGD, "optimizer__lr": 0.01, "batch_size": batch,
                  "max_epochs": 2, "random_state": 0, "grads_per_worker": 1}  # on both workers
    with cluster() as client:
        DaskClassifier(**{**kwargs, "max_epochs": 1}).fit(X[:512], y[:512])  # warm the workers up
        compute = DaskClassifier(**kwargs).fit(X, y)
        lazy = DaskClassifier(**kwargs).fit(SlowReads(X, y))
        del client
    per_worker = batch // 2
    load = _load_seconds(SlowReads(X, y), per_worker)
    t_compute = statistics.median(u["update_time"] for u in _updates(compute, 1))
    t_lazy = statistics.median(u["update_time"] for u in _updates(lazy, 1))
    bound = max(load, t_compute)
    return [
        "## A lazy Dataset: loading overlapped with compute",
        "",
        (f"{n} examples, batch {batch} ({per_worker} per worker), {READ_SECONDS * 1e3:.0f} ms per example read, "
        f"MLP 256-{width}-{width}-10; medians over the second epoch's updates."),
        "",
        "| per update | seconds | / max(load, compute) |",
        "|---|---|---|",
        f"| load ({per_worker} seeded reads, measured alone) | {load:.3f} | |",
        f"| compute (resident arrays) | {t_compute:.3f} | |",
        f"| load + compute (no overlap) | {load + t_compute:.3f} | {(load + t_compute) / bound:.2f}x |",
        f"| **lazy Dataset, loaded ahead** | {t_lazy:.3f} | **{t_lazy / bound:.2f}x** (goal <= 1.2x) |",
        "",
    ]


def _load_seconds(dataset, per_worker: int, repeats: int = 5) -> float:
    """Seconds to read one worker's share as a worker does (seeded, one at a time), alone."""
    from adadamp.worker.loading import ExampleLoader

    loader = ExampleLoader(dataset, seed=0, encode=np.asarray, threads=2)
    try:
        times = []
        for k in range(repeats):
            start = time.perf_counter()
            loader.load(k, range(k * per_worker, (k + 1) * per_worker))
            times.append(time.perf_counter() - start)
    finally:
        loader.close()
    return statistics.median(times)


# ------------------------------------------------------------------ (2) W1 from a dask array
def dask_vs_numpy(quick: bool) -> list[str]:
    """W1 trained from NumPy and from a dask array of the same data: throughput and set-up."""
    import dask.array as da

    from adadamp import DaskClassifier

    wl = WORKLOADS["W1"]
    X, y = wl.data(quick)
    kwargs = {"module": wl.module(), "optimizer": torch.optim.SGD, "optimizer__lr": wl.lr,
                  "optimizer__momentum": wl.momentum, "batch_size": wl.batch_size, "max_epochs": wl.epochs, "random_state": 0,
                  "grads_per_worker": 1}  # on both workers
    makers = {
        "numpy": lambda: (X, y),
        "dask array": lambda: (da.from_array(X, chunks=len(X) // 16), da.from_array(y, chunks=len(X) // 16)),
    }
    runs = {label: [] for label in makers}
    with cluster() as client:
        for _ in range(5):
            for label, make in makers.items():  # alternating, so a drifting machine hits both alike
                Xi, yi = make()
                if label == "dask array":
                    Xi, yi = client.persist([Xi, yi])  # the data lives on the workers before the fit
                    client.wait_for_workers(2)
                start = time.perf_counter()
                est = DaskClassifier(**kwargs, client=client).fit(Xi, yi)
                wall = time.perf_counter() - start
                steady = _updates(est, 1)
                runs[label].append({
                    "samples_per_s": sum(u["batch_size"] for u in steady) / sum(u["update_time"] for u in steady),
                    "median_update_ms": 1e3 * statistics.median(u["update_time"] for u in steady),
                    "setup_s": wall - sum(r["dur"] for r in est.history_),
                    "loss": est.history_[-1]["train_loss"],
                })
    rows = {label: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for label, rs in runs.items()}
    ratio = rows["dask array"]["samples_per_s"] / rows["numpy"]["samples_per_s"]
    paired = statistics.median(
        d["samples_per_s"] / n["samples_per_s"] for d, n in zip(runs["dask array"], runs["numpy"])
    )
    typical = rows["numpy"]["median_update_ms"] / rows["dask array"]["median_update_ms"]
    lines = [
        "## W1 from a dask array vs from NumPy",
        "",
        (f"W1 ({len(X)} x 784, batch {wl.batch_size}, {wl.epochs} epochs, 16 partitions), 5 fits each on one "
         "warm cluster, numpy and dask fits alternating; throughput = examples / update time over the second "
         "epoch (medians of the 5)."),
        "",
        "| data | samples/s | median update (ms) | set-up s (fit wall - epochs) | final train loss |",
        "|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['samples_per_s']:.0f} | {r['median_update_ms']:.2f} | {r['setup_s']:.2f} | "
                     f"{r['loss']:.4f} |")
    lines += [
        "",
        (f"dask / numpy throughput: **{ratio:.2f}x** (paired per repeat: {paired:.2f}x; from the median update: "
         f"{typical:.2f}x; goal >= 0.95x)"),
        "",
    ]
    return lines


# ------------------------------------------------------------------ (3) set-up
def setup(quick: bool) -> list[str]:
    """Where a fit's time before its first update goes: torch's first optimizer in a process, the
    first fit on a fresh cluster, a fit on a warm one, placing W1's data with and without shared
    memory, and ``partial_fit`` called again on the same data with and without the kept call."""
    import dask

    from adadamp import DaskClassifier
    from adadamp.engine import session
    from adadamp.engine.backends import Backend

    wl = WORKLOADS["W1"]
    X, y = wl.data(quick)
    placements, set_ups = [], []
    place, enter = Backend._place, Backend.__enter__

    def timed_place(self, workers):  # instrumentation: how long placing the data takes
        start = time.perf_counter()
        out = place(self, workers)
        placements.append(time.perf_counter() - start)
        return out

    def timed_enter(self):  # and the whole backend set-up (shared memory, workers, placement)
        start = time.perf_counter()
        out = enter(self)
        set_ups.append(time.perf_counter() - start)
        return out

    Backend._place = timed_place
    Backend.__enter__ = timed_enter
    start = time.perf_counter()
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    first_optimizer = time.perf_counter() - start

    def est(client, **kw):
        return DaskClassifier(module=wl.module(), optimizer=torch.optim.SGD, optimizer__lr=wl.lr,
                              batch_size=wl.batch_size, random_state=0, client=client, grads_per_worker=1, **kw)

    def fit_setup(client) -> tuple[float, float, float]:
        e = est(client, max_epochs=1)
        start = time.perf_counter()
        e.fit(X, y)
        return time.perf_counter() - start - e.history_[-1]["dur"], set_ups[-1], placements[-1]

    def partial_fit_overhead(client) -> float:
        e, extra = est(client), []
        for _ in range(20):  # a partial_fit loop of 20 calls on the same data
            start = time.perf_counter()
            e.partial_fit(X, y)
            extra.append(time.perf_counter() - start - e.history_[-1]["dur"])
        return statistics.median(extra[1:])

    with cluster() as client:
        fresh, _, _ = fit_setup(client)
        warm = [fit_setup(client) for _ in range(3)]
        with dask.config.set({"adadamp.shm-dir": None}):
            socket = [fit_setup(client) for _ in range(3)]
        kept = partial_fit_overhead(client)
        keep, session.KEEP_SECONDS = session.KEEP_SECONDS, 0.0
        try:
            not_kept = partial_fit_overhead(client)
        finally:
            session.KEEP_SECONDS = keep
    Backend._place = place
    Backend.__enter__ = enter
    gib = (X.nbytes + y.nbytes) / 2**30
    warm_setup = statistics.median(w[0] for w in warm)
    shm_enter, shm_place = (statistics.median(w[k] for w in warm) for k in (1, 2))
    socket_enter, socket_place = (statistics.median(w[k] for w in socket) for k in (1, 2))
    return [
        "## Set-up: before the first update",
        "",
        (f"W1 ({len(X)} x 784 float32, {gib * 1024:.0f} MiB), one epoch per fit; set-up = fit wall time minus the "
        "epoch's time (validation, building, worker set-up, data placement)."),
        "",
        "| what | seconds |",
        "|---|---|",
        (f"| torch's first optimizer in a process (imports torch._dynamo; any PyTorch script pays it) | "
        f"{first_optimizer:.3f} |"),
        f"| set-up, first fit on a fresh cluster | {fresh:.3f} |",
        f"| set-up, fit on a warm cluster (median of 3) | {warm_setup:.3f} |",
        f"| fresh - warm | **{fresh - warm_setup:.3f}** (goal <= 1 s) |",
        (f"| backend set-up, workers map the data from shared memory | {shm_enter:.3f} "
         f"(of which placing {shm_place:.3f}); {gib / shm_enter:.2f} GiB/s |"),
        (f"| backend set-up, data over sockets (`adadamp.shm-dir: None`) | {socket_enter:.3f} "
         f"(of which placing {socket_place:.3f}); {gib / socket_enter:.2f} GiB/s |"),
        (f"| 20 partial_fit calls on the same data, median beyond their updates: kept call resumed | "
         f"**{kept:.3f}** (goal <= 0.05 s) |"),
        f"| the same, set up again each call | {not_kept:.3f} |",
        "",
    ]


# ------------------------------------------------------------------ (4) memory against data size
def memory(quick: bool) -> list[str]:
    """The client's and the workers' peak RSS while fitting one epoch on dask arrays made on the workers."""
    import dask.array as da

    from adadamp import DaskRegressor

    sizes_gb = (0.05, 0.1, 0.2) if quick else (0.5, 2.0, 4.0)
    features = 500
    results = []
    for gb in sizes_gb:
        n = int(gb * 2**30 / (4 * features))
        with cluster() as client:
            chunk = max(1024, n // 32)
            X = da.random.default_rng(0).standard_normal((n, features), chunks=(chunk, features), dtype=np.float32)
            y = X[:, :4].sum(axis=1)
            X, y = client.persist([X, y])
            client.wait_for_workers(2)
            est = DaskRegressor(module=torch.nn.Linear(features, 1), optimizer=torch.optim.SGD, optimizer__lr=1e-3,
                                batch_size=8192, max_epochs=1, random_state=0, client=client)
            base_client = psutil.Process().memory_info().rss / 2**20
            with Peak() as peak:
                start = time.perf_counter()
                est.fit(X, y)
                wall = time.perf_counter() - start
            results.append({"gb": gb, "n": n, "client_peak": peak.client, "client_before": base_client,
                            "workers_peak": peak.workers, "fit_s": wall})
    spread = max(r["client_peak"] for r in results) - min(r["client_peak"] for r in results)
    lines = [
        "## Peak memory against the size of a dask array",
        "",
        (f"float32 dask arrays of {features} features made on the workers (`da.random`), persisted, then one epoch "
        "(batch 8192, a linear model); RSS sampled every 50 ms."),
        "",
        "| data GB | examples | client RSS before (MB) | client peak (MB) | workers' peak, both (MB) | fit s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['gb']} | {r['n']} | {r['client_before']:.0f} | {r['client_peak']:.0f} | "
                     f"{r['workers_peak']:.0f} | {r['fit_s']:.1f} |")
    lines += ["", f"client peak spread across sizes: **{spread:.0f} MB** (goal <= 100 MB)", ""]
    _plot(results)
    return lines


# ------------------------------------------------------------------ (5) bigger than memory: streamed
def _write_parquet(path: Path, n: int, features: int, files: int, sort_labels: bool = False) -> None:
    """``n`` rows of ``features`` float32 columns ``f*`` and an int64 ``label`` in ``files`` Parquet
    files, written file by file (never all in memory); ``sort_labels``: files sorted by label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = n // files
    chunks = []
    for k, (X, label) in enumerate(_labelled_rows(features, [rows] * files)):
        if sort_labels:
            chunks.append((X, label))
        else:
            _write_file(pa, pq, path / f"part-{k:04d}.parquet", X, label)
    if sort_labels:  # blocks that are not alike: the worst case for a windowed shuffle
        X = np.concatenate([c[0] for c in chunks])
        label = np.concatenate([c[1] for c in chunks])
        order = np.argsort(label, kind="stable")
        for k in range(files):
            part = order[k * rows : (k + 1) * rows]
            _write_file(pa, pq, path / f"part-{k:04d}.parquet", X[part], label[part])


def _labelled_rows(features: int, sizes: list[int]):
    """Blocks of ``sizes`` rows of standard normal float32 features and their int64 label (the
    sign along one random direction, :func:`_sorted_weights`), drawn one block at a time."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(features).astype(np.float32)
    for size in sizes:
        X = rng.standard_normal((size, features), dtype=np.float32)
        yield X, (X @ w > 0).astype(np.int64)


def _write_file(pa, pq, path: Path, X: np.ndarray, label: np.ndarray) -> None:
    columns = {f"f{j}": X[:, j] for j in range(X.shape[1])}
    pq.write_table(pa.table({**columns, "label": label.astype(np.float32)}), path)


def _parquet_arrays(path: Path):
    """Features and labels from one float32 array of the frame (one partitioning for both)."""
    import dask.dataframe as dd

    rows = dd.read_parquet(str(path)).to_dask_array(lengths=True)
    return rows[:, :-1], rows[:, -1].astype(np.int64)


def streamed(quick: bool, fmt: str = "parquet") -> list[str]:
    """A dataset 3x the cluster's memory on local disk (Parquet, or ``fmt="zarr"``: one float32
    array, a chunk per 1600 rows) streamed, against the same model on a part that fits
    (persisted); then (Parquet) the accuracy cost of the streamed order against a full shuffle."""
    import dask

    from adadamp import DaskClassifier

    from ..common.emulated import Emulated

    limit = int(1.5 * 2**30)  # per worker: ~600 MB of it is torch, pyarrow and Dask before any data
    features = 512 if quick else 2048
    total = (0.05 if quick else 3.0) * 2 * limit  # 3x the two workers' memory_limit
    n = int(total // (4 * features + 8))
    files = 16 if quick else n // 1600  # files of at most what a streamed block may hold here (~13 MB)
    # one file, one partition: dask fuses small Parquet files into partitions of 75 MB, which a
    # streamed fit would cut again, reading each fused partition once per piece
    dask.config.set({"dataframe.parquet.minimum-partition-size": 1})
    model = {"module": Emulated, "module__inner": torch.nn.Linear, "module__in_features": features,
             "module__out_features": 2, "module__per_example": 0.3e-3, "optimizer": torch.optim.SGD, "optimizer__lr": 0.01,
             "batch_size": 1024, "random_state": 0, "grads_per_worker": 512}
    results = {}
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        (root / "big").mkdir()
        if fmt == "zarr":
            X, y = _write_zarr(root / "big", n, features, n // files)
        else:
            _write_parquet(root / "big", n, features, files)
            X, y = _parquet_arrays(root / "big")
        write_s = time.perf_counter() - start
        on_disk = sum(f.stat().st_size for f in (root / "big").rglob("*") if f.is_file())
        small = n // 24  # fits: persisted
        Xs, ys = X[:small], y[:small]
        runs = {"streamed": (X, y, 1, "stream" if quick else "auto"), "persisted": (Xs, ys, 4, "persist")}
        for label, (Xi, yi, epochs, how) in runs.items():
            with cluster(memory_limit=limit) as client, Peak() as peak:  # fresh workers each
                t0 = time.perf_counter()
                est = DaskClassifier(**model, max_epochs=epochs, dask_data=how, client=client).fit(Xi, yi)
                wall = time.perf_counter() - t0
            ups = _updates(est, 1 if epochs > 1 else 0)
            results[label] = {"n": len(Xi), "epochs": epochs, "wall": wall, "path": est.meta_["data"],
                              "per_s": sum(u["batch_size"] for u in ups) / sum(u["update_time"] for u in ups),
                              "epoch_per_s": est.history_[-1]["n_samples_seen"] / sum(r["dur"] for r in est.history_),
                              "peak": peak.workers}
        window = dask.config.get("adadamp.stream.window", 8)
        if fmt == "zarr":
            return _stream_lines(results, fmt, limit, features, total, on_disk, files, write_s)
        # the order's accuracy cost: files sorted by label, streamed (window 8 of 64 blocks) vs persisted
        (root / "sorted").mkdir()
        n_acc = 20_000 if quick else 200_000
        _write_parquet(root / "sorted", n_acc, 32, 64, sort_labels=True)
        Xa, ya = _parquet_arrays(root / "sorted")
        test_X = np.random.default_rng(1).standard_normal((20_000, 32), dtype=np.float32)
        truth = (test_X @ _sorted_weights(32) > 0).astype(np.int64)
        accuracy = {how: [] for how in ("stream", "persist")}
        for how, scores in accuracy.items():
            with cluster(memory_limit=limit) as client:
                for seed in range(3):
                    est = DaskClassifier(module=torch.nn.Linear, module__in_features=32, module__out_features=2,
                                         optimizer=torch.optim.SGD, optimizer__lr=0.05, batch_size=256, max_epochs=3,
                                         random_state=seed, dask_data=how, client=client).fit(Xa, ya)
                    scores.append(float((est.predict(test_X) == truth).mean()))
    lines = _stream_lines(results, fmt, limit, features, total, on_disk, files, write_s)
    acc_s, acc_p = (100 * statistics.mean(accuracy[k]) for k in ("stream", "persist"))
    lines += [
        (f"Accuracy cost of the streamed order: {n_acc} rows x 32 features in 64 Parquet files sorted by label "
         f"(blocks not alike: the worst case), 3 epochs, batch 256, logistic regression, 3 seeds; held-out "
         f"accuracy streamed (window {window} blocks) **{acc_s:.1f}%** against a full shuffle (persisted) "
         f"**{acc_p:.1f}%**: {acc_s - acc_p:+.1f} points (goal within 0.5)."),
        "",
    ]
    return lines


def _stream_lines(results: dict, fmt: str, limit: int, features: int, total: float, on_disk: int, files: int,
                  write_s: float) -> list[str]:
    s, p = results["streamed"], results["persisted"]
    ratio = s["per_s"] / p["per_s"]
    stored = (f"{files} Parquet files on local disk, written in {write_s:.0f} s; read with "
              "`dask.dataframe.read_parquet`" if fmt == "parquet" else
              f"a Zarr array of {files} chunks on local disk, written in {write_s:.0f} s; read with "
              "`dask.array.from_zarr`")
    lines = [
        f"## Data bigger than the cluster's memory, streamed from {'Parquet' if fmt == 'parquet' else 'Zarr'}",
        "",
        (f"2 workers of memory_limit {limit / 2**30:.1f} GiB. {s['n']} rows x {features} float32 features + a label "
         f"({on_disk / 2**30:.1f} GiB in {stored}; "
         f"{total / 2**30:.1f} GiB in memory: {total / (2 * limit):.1f}x the workers' memory); "
         "a linear model on emulated accelerators (`benchmarks/common/emulated.py`: each "
         "training forward sleeps 0.5 ms + 0.3 ms per example, off the CPU, so compute per block exceeds its "
         "read), batch 1024. Against the same model on the first 1/24 of the rows (fits: persisted), 4 epochs, "
         "throughput over epochs 2-4. Throughput = examples / update time; epoch rate = examples / epoch time."),
        "",
        "| data | path | rows | epochs | examples/s (updates) | examples/s (epochs) | fit s | workers' peak RSS, both (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        lines.append(f"| {label} | {r['path']} | {r['n']} | {r['epochs']} | {r['per_s']:.0f} | "
                     f"{r['epoch_per_s']:.0f} | {r['wall']:.1f} | {r['peak']:.0f} |")
    return lines + [
        "",
        (f"streamed / persisted throughput: **{ratio:.2f}x** (goal >= 0.8x); workers' peak "
         f"{s['peak']:.0f} MB against their 2 x {limit / 2**20:.0f} MB limit."),
        "",
    ]


def _write_zarr(path: Path, n: int, features: int, rows: int):
    """``n`` rows of :func:`_labelled_rows`, written as two Zarr arrays
    ``X`` (float32, a chunk per ``rows`` rows) and ``y``, chunk by chunk; returns them lazily."""
    import dask.array as da
    import zarr

    Xz = zarr.open_array(str(path / "X.zarr"), mode="w", shape=(n, features), chunks=(rows, features), dtype="f4")
    yz = zarr.open_array(str(path / "y.zarr"), mode="w", shape=(n,), chunks=(rows,), dtype="i8")
    starts = range(0, n, rows)
    for start, (X, label) in zip(starts, _labelled_rows(features, [min(rows, n - s) for s in starts])):
        Xz[start : start + len(X)] = X
        yz[start : start + len(X)] = label
    return da.from_zarr(str(path / "X.zarr")), da.from_zarr(str(path / "y.zarr"))


def _sorted_weights(features: int) -> np.ndarray:
    """The labelling direction :func:`_write_parquet` draws (its first draw of its generator)."""
    return np.random.default_rng(0).standard_normal(features).astype(np.float32)


def _plot(results: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    gb = [r["gb"] for r in results]
    ax.plot(gb, [r["client_peak"] / 1024 for r in results], "o-", label="client")
    ax.plot(gb, [r["workers_peak"] / 1024 for r in results], "s-", label="workers (both)")
    ax.plot(gb, gb, ":", color="grey", label="the data")
    ax.set_xlabel("dask array (GB)")
    ax.set_ylabel("peak RSS (GB)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "data-memory.png", dpi=120)


PARTS = {"overlap": overlap, "dask": dask_vs_numpy, "setup": setup, "memory": memory, "stream": streamed,
         "stream-zarr": lambda quick: streamed(quick, fmt="zarr")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", nargs="+", default=list(PARTS), choices=list(PARTS))
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # run one part here, write its lines there
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.child is not None:
        args.child.write_text("\n".join(PARTS[args.part[0]](args.quick)))
        return
    lines = [f"# Data benchmarks ({time.strftime('%Y-%m-%d')}, {psutil.cpu_count()} cores)", ""]
    for part in args.part:  # each part in a fresh process: its memory is its own
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "part.md"
            cmd = [sys.executable, "-m", "benchmarks.data", "--part", part, "--child", str(out)]
            subprocess.run(cmd + (["--quick"] if args.quick else []), check=True, cwd=ROOT)
            lines += out.read_text().splitlines() + [""]
        print("\n".join(lines), flush=True)
    out = HERE / ("data-quick.md" if args.quick else "data.md")
    out.write_text("\n".join(lines) + "\n")
    print(f"written to {out}")
