"""A scikit-learn search over schedules on a shared, growing cluster (issue 51).

``GridSearchCV`` (cv=2, refit=False) over 8 candidates -- a constant batch of 64, a constant 256,
GeoDamp 64 -> 512 and Goodput, each at two learning rates -- of an MLP 32-64-1 on emulated
accelerators (:mod:`benchmarks.common.emulated`: each training forward sleeps 0.5 ms + 0.1 ms per
example on the worker, off the CPU; ``--device-scale 10``: 5 ms + 1 ms, the V100 model the
emulation is scaled from), 3 epochs of 8,192 examples, ``grads_per_worker=64``,
``max_workers=8``.  Systems, each in a process of its own:

- ``growing``: a ``LocalCluster`` started with 1 worker, every fit ``scale_cluster=True``: the
  allocator sizes it for the fits' wants, at most 8 workers; ``n_jobs`` 1, 2 and 4 (joblib's
  threading backend: the candidates share the process's client);
- ``fixed``: a ``LocalCluster`` of 8 workers that does not scale, ``n_jobs=1``;
- ``--baseline DIR``: the ``growing`` search with the adadamp found in ``DIR`` (a checkout of
  an earlier commit, e.g. ``git worktree add /tmp/before 958f624``), n_jobs 1 and 4.

Reported: the search's wall time (``search.fit``, the cluster already started), the
candidates' mean fit time (``mean_fit_time``, Pollux's job completion time), and the CPU seconds
the search took in all the processes (this one, the workers and their nannies) against what the
machine's cores could give in that wall time, and this process's CPU seconds per second (its
Python threads -- the fits' clients, one per candidate at once -- share one interpreter lock):
where either nears 1, the machine bounds the search, not the (emulated) accelerators.  And the
emulated accelerators' busy time (the model's sleep of each worker's forward, summed over every
update of the search, from the updates' ``shares``) against what 8 of them give in the wall time:
where that nears 1, the 8 workers bound the search.  Writes ``benchmarks/search/search.json`` and
``benchmarks/search/search.md`` (``search-x10.*`` with ``--device-scale 10``).

    python -m benchmarks.search [--baseline /tmp/before] [--repeats 1] [--device-scale 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import ClassVar

from adadamp.callbacks import Callback

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository


class DeviceTime(Callback):
    """Sums the emulated accelerators' busy seconds over every update of every fit in this
    process (the threading backend's fits): each worker with a share sleeps one forward's time."""

    lock = threading.Lock()
    seconds: ClassVar[list[float]] = [0.0]
    scale = 1.0  # the emulated model's times, times this

    def on_update_end(self, estimator, record=None, **info):
        from benchmarks.common.emulated import FIXED_S, PER_EXAMPLE_S

        busy = DeviceTime.scale * sum(FIXED_S + PER_EXAMPLE_S * n for n in record.get("shares") or () if n)
        with DeviceTime.lock:
            DeviceTime.seconds[0] += busy


def _cpu_seconds(client) -> tuple[float, float]:
    """CPU seconds used so far by all processes (this one, the cluster's workers and their
    nannies) and by this one."""
    import psutil

    def used(pids):
        total = 0.0
        for pid in pids:
            try:
                t = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total

    def here():
        p = psutil.Process()
        return [p.pid, p.ppid()]  # the worker and its nanny

    pids = {os.getpid(), *(pid for pair in client.run(here).values() for pid in pair)}
    return used(pids), used([os.getpid()])


def _search(system: str, n_jobs: int, device_scale: float = 1.0) -> dict:
    import joblib
    import numpy as np
    import torch
    from distributed import Client, LocalCluster
    from sklearn.model_selection import GridSearchCV
    from torch import nn

    from adadamp import DaskRegressor
    from adadamp.dampers import GeoDamp, Goodput
    from benchmarks.common.emulated import FIXED_S, PER_EXAMPLE_S, Emulated

    class MLP(nn.Module):
        def __init__(self, features: int = 32, hidden: int = 64):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

        def forward(self, x):
            return self.net(x)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(8192, 32)).astype("float32")
    y = (X @ rng.normal(size=(32, 1)) + 0.1 * rng.normal(size=(8192, 1))).astype("float32")
    schedules = [64, 256, GeoDamp(initial=64, delay=1, factor=2, max_batch_size=512), Goodput(initial=64)]
    grid = {"batch_size": schedules, "optimizer__lr": [0.01, 0.03]}
    scale = system != "fixed"
    with LocalCluster(n_workers=1 if scale else 8, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=40) as cluster, Client(cluster) as client:
        DeviceTime.scale = device_scale
        est = DaskRegressor(module=Emulated, module__inner=MLP, module__fixed=FIXED_S * device_scale,
                            module__per_example=PER_EXAMPLE_S * device_scale, optimizer=torch.optim.SGD, max_epochs=3,
                            grads_per_worker=64, max_workers=8, scale_cluster=scale, random_state=0, client=client,
                            callbacks=[DeviceTime()])
        search = GridSearchCV(est, grid, cv=2, refit=False, n_jobs=n_jobs, error_score="raise")
        start, cpu = time.perf_counter(), _cpu_seconds(client)
        with joblib.parallel_backend("threading", n_jobs=n_jobs):
            search.fit(X, y)
        wall = time.perf_counter() - start
        after = _cpu_seconds(client)
        cpu, mine = after[0] - cpu[0], after[1] - cpu[1]  # workers that retired meanwhile are not counted
        import adadamp

        return {"system": system, "n_jobs": n_jobs, "adadamp": os.path.dirname(adadamp.__file__), "wall_s": round(wall, 2),
                "mean_fit_s": round(float(np.mean(search.cv_results_["mean_fit_time"])), 2),
                "cpu_s": round(cpu, 1), "cpu_busy": round(cpu / (wall * os.cpu_count()), 2),
                "client_busy": round(mine / wall, 2),
                "devices_busy": round(DeviceTime.seconds[0] / (8 * wall), 2),
                "scores": [float(s) for s in search.cv_results_["mean_test_score"]],
                "workers_at_end": len(client.scheduler_info()["workers"])}


def _run(system: str, n_jobs: int, code: str | None, scale: float = 1.0) -> dict:
    # Run by path from a neutral folder, so that ``code`` (first on the path) is the adadamp imported,
    # in this process and in the workers it spawns; the benchmarks package stays this checkout's (a
    # folder holding only a link to it goes before ``code``, whose benchmarks may be laid out otherwise).
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "benchmarks").symlink_to(HERE.parent, target_is_directory=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tmp, code, str(ROOT)) if p)}
        cmd = [sys.executable, str(HERE / "bench.py"), "--one", system, str(n_jobs), "--device-scale", str(scale)]
        out = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True, check=True, timeout=1800)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["code"] = "baseline" if code else "this"
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="a checkout of an earlier adadamp to compare with")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--device-scale", type=float, default=1.0,
                        help="the emulated accelerators' times, times this (10: the V100 model)")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_search(args.one[0], int(args.one[1]), args.device_scale)))
        return
    rows = []
    for _ in range(args.repeats):
        rows.append(_run("fixed", 1, None, args.device_scale))
        for n_jobs in (1, 2, 4):
            rows.append(_run("growing", n_jobs, None, args.device_scale))
        if args.baseline:
            for n_jobs in (1, 4):
                rows.append(_run("growing", n_jobs, args.baseline, args.device_scale))
    name = "search" if args.device_scale == 1 else f"search-x{args.device_scale:g}"
    (HERE / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    fixed = [r["wall_s"] for r in rows if r["system"] == "fixed"]
    head = ("| code | cluster | n_jobs | search wall (s) | / fixed 8 workers | mean fit (s) | CPU (s) | "
            f"CPU / ({os.cpu_count()} cores x wall) | this process's CPU / wall | device time / (8 x wall) | "
            "workers at end |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['code']} | {r['system']} | {r['n_jobs']} | {r['wall_s']:.1f} | "
                     f"{r['wall_s'] / min(fixed):.2f} | {r['mean_fit_s']:.2f} | {r.get('cpu_s', float('nan')):.1f} | "
                     f"{r.get('cpu_busy', float('nan')):.2f} | {r.get('client_busy', float('nan')):.2f} | "
                     f"{r.get('devices_busy', float('nan')):.2f} | "
                     f"{r['workers_at_end']} |")
    (HERE / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
