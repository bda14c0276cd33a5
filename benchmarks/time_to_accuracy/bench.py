"""Holt & Sievert 2021's Table 1, measured: time to a target test accuracy, the cluster really growing.

The paper trains WRN-16-4 on CIFAR-10 for 200 epochs: a constant batch of 128 on one worker with
the learning rate divided by 5 at epochs 60, 120 and 180 takes 200 minutes (78,200 updates);
GeoDamp from 256 growing the batch by 5 at the same epochs (to 5.1k, the learning rate decaying
beyond) with one worker per 128 examples (up to 40) takes 70 minutes (14,960 updates), 2.9x
sooner -- simulated.  Here the same two schedules, scaled to a task that runs in minutes on this
machine (``benchmarks.common.accuracy_tasks``, task ``blobs4``; emulated devices,
``benchmarks/common/emulated.py``), run for real to the task's target test accuracy:

- constant: batch 32 on 1 worker, learning rate / 2 every 3 epochs (:class:`GeoDampLR`);
- GeoDamp: batch 64 (the paper's "(*2)") x 2 every 3 epochs up to 256, then learning rate / 2,
  with one worker per 32 examples: 2 -> 4 -> 8 workers, on a LocalCluster that starts with the
  first batch's workers and that the fit grows (``scale_cluster=True``: new worker processes).

Both on both backends.  ``adadamp.simulate`` predicts each run before it starts: calibrated on one
run of another schedule (GeoDamp 32 -> 256 doubling every epoch, on 1 -> 8 warm workers that the
fit takes as the batch grows), it times the run's schedule up to the epoch where the target was
reached.  A growth step's cost: the update where the workers grew, less the median update of its
epoch, and the updates that waited for a worker (``Membership.waits``) or for a worker's set-up.

Writes ``time_to_accuracy.md``, ``.json`` and ``.png`` beside this file.
Run: ``python -m benchmarks.time_to_accuracy`` (about 6 minutes on 2 cores; ``--repeats 2``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import re
import subprocess
import time
from pathlib import Path

import dask
import numpy as np
from distributed import Client, LocalCluster

from adadamp.dampers import GeoDamp, GeoDampLR
from adadamp.simulate import calibrate, from_history, schedule_updates

from ..common.accuracy_tasks import TASKS, Task, estimator, measure

HERE = Path(__file__).resolve().parent
PAPER = {"constant": 200.19, "geodamp": 69.87}  # minutes, Table 1: max batch 128 and 5.1k (*2)
#: The emulated device (seconds per training forward, per example): the paper's T4 took 1.2 ms per
#: example on WRN-16-4 (200 min for 78,200 updates of 128, overheads included); 0.5 ms per example
#: and 2 ms per forward keep its regime (an update is mostly computation) in a run of minutes.
DEVICE = (2e-3, 0.5e-3)
BACKENDS = ("parameter-server", "allreduce")
GPW = 32  # examples per worker per update: the base batch on one worker


def runs(task: Task) -> dict[str, dict]:
    """The two schedules of Table 1, scaled: damper, cluster bounds and the simulator's view of them."""
    b, delay = task.base_batch, 3
    return {
        "constant": {
            "label": f"constant {b}, 1 worker, lr / 2 every {delay} epochs",
            "damper": GeoDampLR(initial=b, delay=delay, factor=2), "max_workers": 1,
            "schedule": {"initial": b, "factor": 1, "delay": delay},
        },
        "geodamp": {
            "label": f"GeoDamp {2 * b} x 2 every {delay} epochs to {8 * b}, 2 -> 8 workers",
            "damper": GeoDamp(initial=2 * b, delay=delay, factor=2, max_batch_size=8 * b), "max_workers": 8,
            "schedule": {"initial": 2 * b, "factor": 2, "delay": delay, "max_batch_size": 8 * b},
        },
    }


class Membership(logging.Handler):
    """Counts what ``adadamp.engine.membership`` logs about the workers of a fit."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[tuple[float, str]] = []

    def emit(self, record):
        self.messages.append((record.created, record.getMessage()))

    def counts(self) -> dict:
        joins = [m for _, m in self.messages if " join, " in m]
        cold = sum(int(re.search(r"(\d+) set up while", m).group(1)) for m in joins)
        starts = [float(re.search(r"in ([\d.]+) s", m).group(1)) for _, m in self.messages if "brought the" in m]
        return {"waits": sum("waiting up to" in m for _, m in self.messages), "joins": len(joins),
                "cold_joins": cold, "worker_starts_s": starts}


#: What a worker process has imported when it is forked (``--start forkserver``).
PRELOAD = ["distributed", "numpy", "torch", "sklearn", "adadamp.worker.plugin", "benchmarks.common.accuracy_tasks"]


@contextlib.contextmanager
def local_cluster(n: int, start: str = "forkserver"):
    """``n`` single-threaded worker processes; the ones the fit adds start the same way.

    ``start="forkserver"``: worker processes are forked from a server process that imported torch
    and adadamp (``PRELOAD``), so that a worker starting costs this 2-core machine ~0.3 s of CPU
    rather than the ~3 s of a fresh interpreter importing torch, time the training workers share
    here but that a worker starting on another host would not take from them.  ``"spawn"``:
    Dask's default.
    """
    if start == "forkserver":
        import multiprocessing

        import distributed.utils

        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
        distributed.utils._forkserver_preload_set = True  # Dask's own (shorter) preload list is not set over ours
    with (
        dask.config.set({"distributed.worker.multiprocessing-method": start}),  # for the workers added later too
        LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                     silence_logs=logging.ERROR) as cluster,
    ):
        yield cluster


def warm_up(task: Task, client, n: int, backend: str) -> None:
    """One epoch on 1,024 examples on the ``n`` workers: process start and first imports out of the run."""
    X, y, *_ = task.data()
    estimator(task, client=client, batch_size=GPW * n, grads_per_worker=GPW, min_workers=n, max_workers=n,
              max_epochs=1, backend=backend).fit(X[:1024], y[:1024])


def growth_steps(history: list[dict]) -> list[dict]:
    """Each update where the workers grew: its seconds, its epoch's median update, the excess in updates."""
    steps, last = [], None
    for row in history:
        times = [u["update_time"] for u in row["updates"]]
        median = float(np.median(times))
        for u in row["updates"]:
            if last is not None and u["n_workers"] > last:
                steps.append({"epoch": row["epoch"], "workers": [last, u["n_workers"]], "update_s": u["update_time"],
                              "median_s": median, "excess_updates": (u["update_time"] - median) / median})
            last = u["n_workers"]
    return steps


def one_run(task: Task, name: str, spec: dict, backend: str, start: str = "forkserver") -> dict:
    """A fresh LocalCluster with the first batch's workers (warmed up), then the fit to the target,
    growing the cluster with the batch."""
    first = -(-spec["damper"].initial // GPW)
    handler = Membership()
    log = logging.getLogger("adadamp.engine.membership")
    with local_cluster(first, start) as cluster, Client(cluster) as client:
        warm_up(task, client, first, backend)
        est = estimator(task, client=client, batch_size=spec["damper"], grads_per_worker=GPW,
                        max_workers=spec["max_workers"], scale_cluster=True, backend=backend)
        log.addHandler(handler)
        level = log.level
        log.setLevel(logging.INFO)
        try:
            run = measure(task, est, f"{name}, {backend}")
        finally:
            log.removeHandler(handler)
            log.setLevel(level)
    out = run.summary()
    out.update(key=name, backend=backend, membership=handler.counts(), growth=growth_steps(run.history),
               epoch_times=[row["dur"] for row in run.history], trace=from_history(run.history))
    return out


def calibration(task: Task, backend: str, start: str = "forkserver") -> dict:
    """The simulator calibrated on GeoDamp 32 -> 256 (x 2 every epoch) on 8 warm workers the fit takes
    as the batch grows (not scaled: no process starts), 4 epochs."""
    with local_cluster(8, start) as cluster, Client(cluster) as client:
        warm_up(task, client, 8, backend)
        est = estimator(task, client=client, batch_size=GeoDamp(initial=GPW, delay=1, factor=2, max_batch_size=8 * GPW),
                        grads_per_worker=GPW, max_workers=8, max_epochs=4, backend=backend)
        run = measure(task, est, "calibration", stop=False)
    trace = from_history(run.history)
    return {"calibration": calibrate(trace), "setup": run.setup, "workers": sorted(set(trace.n_workers.tolist()))}


def predict(cal: dict, task: Task, spec: dict, run: dict) -> dict:
    """The simulator's time to target for ``run``: its schedule up to the epoch the target was
    reached (from the schedule alone, and from the run's own record), plus the calibration's set-up."""
    epochs = round(run["epoch_at_target"] or task.max_epochs)
    planned = schedule_updates(n_data=task.n_train, epochs=epochs, grads_per_worker=GPW, max_workers=spec["max_workers"],
                               **spec["schedule"])
    c = cal["calibration"]
    return {"predicted": c.predict(planned) + cal["setup"], "from_record": c.predict(run["trace"]) + cal["setup"],
            "updates_planned": planned.n_updates}


def run_all(task_name: str = "blobs4", repeats: int = 1, backends=BACKENDS, device=DEVICE,
            start: str = "forkserver", only=None) -> dict:
    task = dataclasses.replace(TASKS[task_name], fixed=device[0], per_example=device[1])
    specs = {k: v for k, v in runs(task).items() if not only or k in only}
    began = time.perf_counter()
    cals, results = {}, []
    for r in range(repeats):
        for backend in backends:
            if backend not in cals:  # next to the backend's first runs: the machine's load drifts
                cals[backend] = calibration(task, backend, start)
            for name, spec in specs.items():
                run = one_run(task, name, spec, backend, start)
                run.update(repeat=r, **predict(cals[backend], task, spec, run))
                run.pop("trace")
                results.append(run)
                print(json.dumps({k: run[k] for k in ("name", "time_to_target", "epoch_at_target", "predicted",
                                                      "membership")}, default=str), flush=True)
    return {
        "task": task_name, "about": task.about, "target": task.target, "n_train": task.n_train,
        "device": {"fixed_ms": task.fixed * 1e3, "per_example_ms": task.per_example * 1e3}, "start": start,
        "calibration": {backend: _calibration_row(cal) for backend, cal in cals.items()},
        "runs": results, "labels": {k: v["label"] for k, v in specs.items()},
        "seconds": time.perf_counter() - began, "commit": _commit(),
    }


def _calibration_row(cal: dict) -> dict:
    c = cal["calibration"]
    return {"us_per_example": c.time_per_example * 1e6, "ms_per_update": c.network.overhead_per_update * 1e3,
            "ms_per_worker": c.network.overhead_per_worker * 1e3, "s_per_epoch": c.time_per_epoch,
            "s_per_rescale": c.time_per_rescale, "s_setup": cal["setup"], "workers": cal["workers"]}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def ratios(result: dict) -> list[dict]:
    """Per backend and repeat: constant / GeoDamp, measured and predicted."""
    out = []
    by = {(r["backend"], r["repeat"], r["key"]): r for r in result["runs"]}
    for (backend, rep, key), r in by.items():
        if key != "constant" or (backend, rep, "geodamp") not in by:
            continue
        g = by[(backend, rep, "geodamp")]
        if r["time_to_target"] and g["time_to_target"]:
            out.append({"backend": backend, "repeat": rep, "measured": r["time_to_target"] / g["time_to_target"],
                        "predicted": r["predicted"] / g["predicted"]})
    return out


def report(result: dict) -> str:
    d = result["device"]
    paper = PAPER["constant"] / PAPER["geodamp"]
    lines = [
        "# Time to accuracy: Holt & Sievert's Table 1, measured",
        "",
        (
            f"Task `{result['task']}`: {result['about']}; target test accuracy {result['target']}. Emulated devices: "
            f"each training forward sleeps {d['fixed_ms']:.1f} ms + {d['per_example_ms']:.2f} ms per example on its "
            "worker (`benchmarks/common/emulated.py`). SGD lr 0.05, momentum 0.9, seed 0. Each run: a fresh LocalCluster "
            "with the first batch's workers (warmed up by a 1,024-example fit), then the fit to the target with "
            "`scale_cluster=True` (the cluster grows by starting worker processes). Time to target: from the `fit` "
            "call to the end of the first epoch at the target, test evaluation excluded."
        ),
        "",
        (
            "| run | backend | time to target s | epoch | updates | workers | simulator s (error) "
            "| from record s (error) | waits | set up while waiting | growth steps: excess in updates |"
        ),
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in result["runs"]:
        t = r["time_to_target"]
        steps = ", ".join(f"{s['workers'][0]}->{s['workers'][1]}: {s['excess_updates']:.1f}" for s in r["growth"]) or "-"
        lines.append(
            f"| {result['labels'][r['key']]} | {r['backend']} | {t:.1f} | {r['epoch_at_target']:.0f} "
            f"| {r['updates_at_target']} | {r['workers']} | {_error(r['predicted'], t)} | {_error(r['from_record'], t)} "
            f"| {r['membership']['waits']} | {r['membership']['cold_joins']} | {steps} |"
            if t else f"| {result['labels'][r['key']]} | {r['backend']} | not reached | | | {r['workers']} | | | | | |"
        )
    lines += ["", "| backend | constant / GeoDamp, measured | predicted by the simulator | paper (Table 1, simulated) |",
              "|---|---:|---:|---:|"]
    for q in ratios(result):
        lines.append(f"| {q['backend']} | {q['measured']:.2f}x | {q['predicted']:.2f}x | {paper:.2f}x (200 / 70 min) |")
    lines += [
        "",
        (
            f"Simulator: calibrated, per backend, on one run of GeoDamp {GPW} -> {8 * GPW} (x 2 every epoch, 4 "
            "epochs) on 8 warm workers taken as the batch grows (1, 2, 4, 8; no process starts); each run predicted "
            "from its schedule alone (`schedule_updates`) up to the epoch where it reached the target, plus the "
            "calibration run's time outside its epochs:"
        ),
        "",
        "| backend | us per example | ms per update | ms per worker | ms per epoch | s per worker-count change | set-up s |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {b} | {c['us_per_example']:.1f} | {c['ms_per_update']:.2f} | {c['ms_per_worker']:.2f} "
            f"| {c['s_per_epoch'] * 1e3:.0f} | {c['s_per_rescale']:.2f} | {c['s_setup']:.2f} |"
            for b, c in result["calibration"].items()
        ),
        "",
        f"Full run: {result['seconds'] / 60:.1f} min (commit {result['commit']}).",
    ]
    return "\n".join(lines) + "\n"


def _error(predicted: float, measured: float | None) -> str:
    return f"{predicted:.1f} ({predicted / measured - 1:+.0%})" if measured else f"{predicted:.1f}"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in result["runs"]:
        if r["repeat"]:
            continue
        ax.plot([p["time"] for p in r["curve"]], [p["accuracy"] for p in r["curve"]], marker="o",
                linestyle="-" if r["backend"] == "parameter-server" else "--", label=f"{r['key']}, {r['backend']}")
    ax.axhline(result["target"], color="grey", linewidth=0.8)
    ax.set_xlabel("seconds since fit()")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(max(0.5, min(p["accuracy"] for r in result["runs"] for p in r["curve"]) - 0.01), 1.0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="blobs4", choices=sorted(TASKS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--device-ms", type=float, nargs=2, default=[DEVICE[0] * 1e3, DEVICE[1] * 1e3],
                        metavar=("FIXED", "PER_EXAMPLE"), help="the emulated device, ms per forward and per example")
    parser.add_argument("--start", default="forkserver", choices=["forkserver", "spawn"],
                        help="how worker processes start (see local_cluster)")
    parser.add_argument("--runs", nargs="+", choices=["constant", "geodamp"], help="only these schedules")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    result = run_all(args.task, args.repeats, args.backends, (args.device_ms[0] / 1e3, args.device_ms[1] / 1e3),
                     args.start, args.runs)
    text = report(result)
    (args.out / "time_to_accuracy.md").write_text(text)
    (args.out / "time_to_accuracy.json").write_text(json.dumps(result, indent=1, default=str))
    plot(result, args.out / "time_to_accuracy.png")
    print(text)
