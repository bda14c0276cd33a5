"""The all-reduce backend's benchmarks: model-size sweep, membership change, SIGKILL, calibration.

    python -m benchmarks.allreduce            # everything (~10 minutes on 2 cores)
    python -m benchmarks.allreduce --quick    # small sizes (smoke test)
    python -m benchmarks.allreduce --part sweep membership kill calibration

W1-W3 against DDP are in the throughput benchmark (``python -m benchmarks.run --peers ddp
adadamp allreduce``).  Each part runs in a fresh process; the Markdown goes to
``benchmarks/allreduce/allreduce.md`` (the raw numbers to ``benchmarks/allreduce/allreduce.json``; a part not run
keeps its last numbers there) and the simulator's calibration to
``benchmarks/allreduce/allreduce-calibration.json`` (read by ``experiments/simulate_table2.py``).

* **sweep**: MLPs of about 1M, 10M and 50M parameters at P = 2 and 4 workers: median update time
  of the all-reduce backend, of the parameter server (shared memory, as on one machine) and of
  the parameter server over sockets (shared memory off: what crosses the network between
  machines), and the bytes the client's sockets send and receive per update (``history_``).
* **membership**: a fit at P = 3 grows to 4 at a chosen update (a worker joins, set up in the
  background) and one at P = 4 loses a worker to SIGKILL; the time from the change to the end
  of the next update, beside the median update.
* **kill**: SIGKILL of one worker inside a collective (in its backward pass, while the others
  all-reduce their first buckets): largest weight difference to the undisturbed run.
* **steps**: each update's step announced with its own requests (members step right after their
  reply, while the client reads the replies and sends the next requests) against the step sent
  with the next request (``adadamp.allreduce.announce-steps`` False), interleaved, P = 2: on
  emulated devices (:mod:`benchmarks.common.emulated`: a small MLP, the forward and the optimizer step
  slept, off the CPU, as on accelerators) with steps of 0, 1 and 3 ms, and on the CPU alone (the
  1M MLP: two workers and the client share 2 cores, so nothing is free to overlap).
* **calibration**: the simulator's ring model with the overheads fitted to a real all-reduce fit
  (``adadamp.simulate.calibrate``), and how well it predicts a fit at another worker count.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository
AR, PS = "allreduce", "parameter-server"


class MLP(torch.nn.Module):
    """``d -> h -> h -> 10``: about ``h * h + (d + 12) * h`` parameters."""

    def __init__(self, d=256, hidden=1000):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                       torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


class KillInBackward(MLP):
    """Its worker SIGKILLs itself mid-backward once ``marker`` exists (the first to claim it)."""

    def __init__(self, d=256, hidden=256, marker=""):
        super().__init__(d, hidden)
        self.marker = marker

    def forward(self, x):
        h = self.net[1](self.net[0](x))
        if h.requires_grad and self.marker:
            h.register_hook(self._maybe_die)
        return self.net[4](self.net[3](self.net[2](h)))

    def _maybe_die(self, grad):
        try:
            os.rename(self.marker, self.marker + ".taken")
        except OSError:
            return grad
        os.kill(os.getpid(), signal.SIGKILL)
        return grad


_LIVE: dict = {}  # the benchmark's cluster and client (callbacks must stay clonable)
SIZES = {"1M": 920, "10M": 3050, "50M": 6950}  # hidden widths: 1.09M, 10.1M, 50.1M parameters
QUICK_SIZES = {"0.1M": 200, "1M": 920}


def _cluster(n: int):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                           silence_logs=logging.ERROR)
    return cluster, Client(cluster, set_as_default=False)


def _data(n: int, d: int = 256):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d), dtype=np.float32)
    return X, rng.integers(0, 10, n)


def _updates(est) -> list[dict]:
    return [u for row in est.history_ for u in row["updates"]]


def _steady(est, key: str) -> float:
    ups = _updates(est)[2:] or _updates(est)
    return statistics.median(u[key] for u in ups)


# ------------------------------------------------------------------ parts (each in its own process)
def part_sweep(quick: bool) -> dict:
    import dask

    from adadamp import DaskClassifier

    rows = []
    batch = 256
    X, y = _data(batch * (6 if quick else 10))
    for p in (2, 4):
        cluster, client = _cluster(p)
        try:
            for name, hidden in (QUICK_SIZES if quick else SIZES).items():
                n_params = sum(t.numel() for t in MLP(hidden=hidden).parameters())
                for label, backend, shm in (("allreduce", AR, None), ("parameter server", PS, None),
                                            ("parameter server, sockets", PS, "")):
                    config = {} if shm is None else {"adadamp.shm-dir": shm}
                    with dask.config.set(config):
                        est = DaskClassifier(module=MLP, module__hidden=hidden, optimizer=torch.optim.SGD,
                                             optimizer__lr=0.01, optimizer__momentum=0.9, batch_size=batch,
                                             max_epochs=1, random_state=0, client=client, backend=backend,
                                             scale_cluster=False, grads_per_worker=1)  # on all p workers
                        start = time.perf_counter()
                        est.fit(X, y)
                        fit_s = time.perf_counter() - start
                    rows.append({
                        "size": name, "n_params": n_params, "P": p, "backend": label,
                        "update_s": _steady(est, "update_time"), "compute_s": _steady(est, "compute_time"),
                        "sent_bytes": _steady(est, "sent_bytes"), "received_bytes": _steady(est, "received_bytes"),
                        "fit_s": fit_s,
                        "setup_s": fit_s - sum(r["dur"] for r in est.history_),
                        "loss": est.history_[-1]["train_loss"],
                    })
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            client.close()
            cluster.close()
    return {"sweep": rows}


def part_membership(quick: bool) -> dict:
    from adadamp import DaskClassifier
    from adadamp.callbacks import Callback

    hidden = 256 if quick else 920
    X, y = _data(4096)
    out = {}

    class Change(Callback):
        """At update ``at``: add a worker (``join``) or SIGKILL one (``kill``); benchmark only."""

        def __init__(self, what="join", at=8):
            self.what, self.at = what, at

        def on_update_end(self, estimator, record=None, loop=None, **info):
            cluster, client = _LIVE["cluster"], _LIVE["client"]
            if self.what == "join" and loop.n_updates == self.at + 1:
                time.sleep(2.5)  # its set-up runs in the background; the change is the look that takes it
            if loop.n_updates != self.at:
                return
            if self.what == "join":
                cluster.scale(4)
                client.wait_for_workers(4)
                time.sleep(1.0)  # the engine's next look sees it and starts its set-up
            else:
                pids = sorted(client.run(os.getpid).values())
                os.kill(pids[-1], signal.SIGKILL)

    for what, start_p in (("join", 3), ("kill", 4)):
        cluster, client = _cluster(start_p)
        _LIVE.update(cluster=cluster, client=client)
        try:
            cb = Change(what=what, at=8)
            est = DaskClassifier(module=MLP, module__hidden=hidden, optimizer=torch.optim.SGD, optimizer__lr=0.01,
                                 batch_size=256, max_epochs=1, random_state=0, client=client, backend=AR,
                                 scale_cluster=False, grads_per_worker=1, callbacks=[("change", cb)]).fit(X, y)
        finally:
            client.close()
            cluster.close()
        ups = _updates(est)
        workers = [u["n_workers"] for u in ups]
        first = next(i for i in range(1, len(workers)) if workers[i] != workers[i - 1])
        out[what] = {
            "workers": f"{workers[first - 1]} -> {workers[first]}",
            "change_to_next_update_s": ups[first]["update_time"],
            "median_update_s": statistics.median(u["update_time"] for u in ups),
            "n_params": sum(t.numel() for t in MLP(hidden=hidden).parameters()),
        }
        print(json.dumps(out[what]), file=sys.stderr, flush=True)
    return {"membership": out}


def part_kill(quick: bool) -> dict:
    import tempfile

    import cloudpickle
    import dask

    from adadamp import DaskClassifier
    from adadamp.callbacks import Callback

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    X, y = _data(2048)
    params = {"module": KillInBackward, "optimizer": torch.optim.SGD, "optimizer__lr": 0.01,
              "optimizer__momentum": 0.9, "batch_size": 128, "max_epochs": 2, "random_state": 0,
              "backend": AR, "scale_cluster": False, "grads_per_worker": 1}  # on all 4 workers

    class Arm(Callback):
        def __init__(self, marker="", at=6):
            self.marker, self.at = marker, at

        def on_update_end(self, estimator, record=None, loop=None, **info):
            if loop.n_updates == self.at:
                Path(self.marker).touch()

    with tempfile.TemporaryDirectory() as tmp, dask.config.set({"adadamp.allreduce.bucket-mb": 0.05}):
        marker = os.path.join(tmp, "kill")
        cluster, client = _cluster(4)
        try:
            calm = DaskClassifier(client=client, **params).fit(X, y)
            hurt = DaskClassifier(client=client, module__marker=marker, callbacks=[("arm", Arm(marker=marker))],
                                  **params).fit(X, y)
        finally:
            client.close()
            cluster.close()
        died = os.path.exists(marker + ".taken")

    def flat(est):
        return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()

    ups = _updates(hurt)
    workers = [u["n_workers"] for u in ups]
    hit = max(range(len(ups)), key=lambda i: ups[i]["update_time"])
    return {"kill": {
        "died_in_backward": died, "max_abs_diff": float(np.abs(flat(hurt) - flat(calm)).max()),
        "samples_seen": [hurt.history_[-1]["n_samples_seen"], calm.history_[-1]["n_samples_seen"]],
        "workers": f"{max(workers)} -> {min(workers)}", "recomputed_update_s": ups[hit]["update_time"],
        "median_update_s": statistics.median(u["update_time"] for u in ups),
    }}


def part_steps(quick: bool) -> dict:
    import dask

    from adadamp import DaskClassifier
    from adadamp.engine.backends.allreduce import ANNOUNCE_STEPS

    from ..common.emulated import Emulated, EmulatedSGD

    batch, n_updates, reps = 64, 20 if quick else 60, 1 if quick else 2
    X, y = _data(batch * n_updates)
    settings = [(f"emulated, {1e3 * s:g} ms step", {"module": Emulated, "module__inner": MLP, "module__hidden": 64,
                                                     "optimizer": EmulatedSGD, "optimizer__step_time": s})
                for s in (0.0, 1e-3, 3e-3)]
    settings.append(("CPU, 1M MLP", {"module": MLP, "module__hidden": QUICK_SIZES["0.1M"] if quick else SIZES["1M"],
                                      "optimizer": torch.optim.SGD}))
    rows = []
    cluster, client = _cluster(2)
    try:
        for label, model in settings:
            for rep in range(reps):
                for announce in (True, False):
                    with dask.config.set({ANNOUNCE_STEPS: announce}):
                        est = DaskClassifier(**model, optimizer__lr=0.01, optimizer__momentum=0.9, batch_size=batch,
                                             max_epochs=1, random_state=0, client=client, backend=AR,
                                             scale_cluster=False, grads_per_worker=1).fit(X, y)
                    rows.append({"setting": label, "announce": announce, "rep": rep,
                                 "update_s": _steady(est, "update_time"), "compute_s": _steady(est, "compute_time")})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        client.close()
        cluster.close()
    return {"steps": rows}


def part_calibration(quick: bool) -> dict:
    """Calibrate the ring model on a P = 2 fit at a constant batch; predict fits with a growing
    batch at P = 2 and at P = 1 (more processes than this machine's 2 cores would measure the
    machine, not the model)."""
    import math

    from adadamp import DaskClassifier
    from adadamp.dampers import GeoDamp
    from adadamp.simulate import RingAllReduce, calibrate, from_history

    hidden = 256 if quick else 920
    X, y = _data(4096)
    n_params = sum(t.numel() for t in MLP(hidden=hidden).parameters())

    def fit(p, batch, epochs):
        cluster, client = _cluster(p)
        try:
            return DaskClassifier(module=MLP, module__hidden=hidden, optimizer=torch.optim.SGD, optimizer__lr=0.01,
                                  batch_size=batch, max_epochs=epochs, random_state=0, client=client, backend=AR,
                                  scale_cluster=False, grads_per_worker=1).fit(X, y)
        finally:
            client.close()
            cluster.close()

    base = fit(2, 256, 2)
    # median: the first update (the group's formation, the first optimizer step) is not the rate
    cal = calibrate(base, network=RingAllReduce(bandwidth=math.inf), n_params=n_params, method="median")
    checks = {}
    for label, p in (("GeoDamp 64 -> 512, P = 2", 2), ("GeoDamp 64 -> 512, P = 1", 1)):
        est = fit(p, GeoDamp(initial=64, delay=1, factor=2, max_batch_size=512), 4)
        measured = sum(u["update_time"] for u in _updates(est))
        checks[label] = {"predicted_s": cal.predict(from_history(est)), "measured_s": measured}
    return {"calibration": {
        "n_params": n_params, "time_per_example": cal.time_per_example,
        "overhead_per_update": cal.network.overhead_per_update, "overhead_per_worker": cal.network.overhead_per_worker,
        "checks": checks,
    }}


PARTS = {"sweep": part_sweep, "membership": part_membership, "kill": part_kill, "steps": part_steps,
         "calibration": part_calibration}


# ------------------------------------------------------------------ report
def report(results: dict, quick: bool) -> str:
    import platform

    intro = (f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.platform()}, {os.cpu_count()} CPUs, torch "
             f"{torch.__version__}. `python -m benchmarks.allreduce{' --quick' if quick else ''}`; every part in a "
             "fresh process, LocalClusters of single-threaded worker processes on this machine.")
    lines = ["# The all-reduce backend: benchmarks", "", intro, ""]
    if "sweep" in results:
        lines += ["## Model-size sweep (median update after the first two; batch 256, SGD with momentum)", "",
                  ("| params | P | backend | update ms | compute ms | client sends B | client receives B | fit set-up s "
                   "| update time / allreduce's |"),
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
        rows = results["sweep"]
        for r in rows:
            ar = next(x for x in rows if x["size"] == r["size"] and x["P"] == r["P"] and x["backend"] == "allreduce")
            lines.append(f"| {r['n_params'] / 1e6:.1f}M | {r['P']} | {r['backend']} | {1e3 * r['update_s']:.1f} | "
                         f"{1e3 * r['compute_s']:.1f} | {int(r['sent_bytes']):,} | {int(r['received_bytes']):,} | {r['setup_s']:.2f} | "
                         f"{r['update_s'] / ar['update_s']:.2f} |")
        lines.append("")
    if "membership" in results:
        lines += ["## Membership change (all-reduce)", "",
                  "| change | workers | change to the end of the next update s | median update s | params |",
                  "|---|---|---:|---:|---:|"]
        for what, m in results["membership"].items():
            lines.append(f"| {what} | {m['workers']} | {m['change_to_next_update_s']:.3f} | "
                         f"{m['median_update_s']:.3f} | {m['n_params'] / 1e6:.2f}M |")
        lines.append("")
    if "kill" in results:
        k = results["kill"]
        text = (f"A worker killed itself in its backward pass while the others all-reduced their first buckets "
                  f"(died: {k['died_in_backward']}; workers {k['workers']}). Largest weight difference to the "
                  f"undisturbed run: **{k['max_abs_diff']:.2e}**; examples seen {k['samples_seen'][0]} vs "
                  f"{k['samples_seen'][1]}. The failed update took {k['recomputed_update_s']:.3f} s "
                f"(median {k['median_update_s']:.3f} s).")
        lines += ["## SIGKILL inside a collective (P = 4)", "", text, ""]
    if "steps" in results:
        lines += ["## The step beside the round trip (P = 2, batch 64, median update after the first two)", "",
                  ("Announced: each update's step goes with its own requests and the members take it right after "
                   "their reply; next request: the step goes with the next request and is taken when it arrives (as "
                   "for dampers that read the round's statistics). Runs interleaved."), "",
                  "| setting | run | announced ms | next request ms | announced / next request |",
                  "|---|---:|---:|---:|---:|"]
        rows = results["steps"]
        for r in rows:
            if not r["announce"]:
                continue
            base = next(x for x in rows if x["setting"] == r["setting"] and x["rep"] == r["rep"] and not x["announce"])
            lines.append(f"| {r['setting']} | {r['rep'] + 1} | {1e3 * r['update_s']:.2f} | {1e3 * base['update_s']:.2f} | "
                         f"{r['update_s'] / base['update_s']:.2f} |")
        lines.append("")
    if "calibration" in results:
        c = results["calibration"]
        text = (f"Fitted to a P = 2 fit at batch 256 ({c['n_params'] / 1e6:.2f}M parameters; "
                "`calibrate(history, network=RingAllReduce(bandwidth=inf), method=\"median\")`): time_per_example "
                f"{1e3 * c['time_per_example']:.4f} ms, overhead_per_update {1e3 * c['overhead_per_update']:.2f} ms "
                "(the request round trip and the all-reduce the backward pass does not hide). Predicting other fits "
                "from their schedules alone:")
        lines += ["## Simulator calibration (`RingAllReduce` + fitted overheads)", "", text, "",
                  "| fit | predicted s | measured s (its updates) | error |", "|---|---:|---:|---:|"]
        for label, chk in c["checks"].items():
            lines.append(f"| {label} | {chk['predicted_s']:.2f} | {chk['measured_s']:.2f} | "
                         f"{chk['predicted_s'] / chk['measured_s'] - 1:+.0%} |")
        note = ("The P = 1 row misses because this machine has 2 cores: two single-threaded workers beside the "
                "client do not compute twice as fast as one, while the model (like the paper's) assumes they do, "
                "and a group of one does no all-reduce, while the fitted overhead assumes it does.")
        lines += ["", note, ""]
    if "sweep" in results:
        lines += network_prediction(results["sweep"])
    return "\n".join(lines)


def network_prediction(rows: list[dict]) -> list[str]:
    """Where the backends part on a network: the sweep's measured compute and the simulator's two
    models (the client's link carries ``2 P M`` per update for the parameter server, a ring
    ``2 (P - 1) / P M`` per worker for the all-reduce)."""
    from adadamp.simulate import Centralized, RingAllReduce, gbit_per_s

    intro = ("Update time in ms = the measured compute of the sweep above + the communication model at 10 Gb/s "
             "(bandwidth only; add each backend's fixed overheads, a few ms). One machine's shared memory has no "
             "link to saturate, so the sweep above cannot show this crossover.")
    out = ["## Predicted on a network (simulator, with this sweep's compute)", "", intro, "",
           "| params | P | parameter server ms | all-reduce ms | all-reduce / parameter server |",
           "|---:|---:|---:|---:|---:|"]
    bw = gbit_per_s(10)
    for r in rows:
        if r["backend"] != "parameter server":
            continue
        nbytes = 4 * r["n_params"]
        ps = 1e3 * (r["compute_s"] + float(Centralized(bw).comm_time(r["P"], nbytes)[0]))
        ar = 1e3 * (r["compute_s"] + float(RingAllReduce(bw).comm_time(r["P"], nbytes)[0]))
        out.append(f"| {r['n_params'] / 1e6:.1f}M | {r['P']} | {ps:.1f} | {ar:.1f} | {ar / ps:.2f} |")
    return [*out, ""]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", nargs="*", default=list(PARTS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        torch.set_num_threads(1)
        print(json.dumps(PARTS[args.one](args.quick)))
        return
    suffix = "-quick" if args.quick else ""
    raw = HERE / f"allreduce{suffix}.json"
    results = json.loads(raw.read_text()) if raw.exists() else {}  # parts not run now keep their last numbers
    for part in args.part:
        cmd = [sys.executable, "-m", "benchmarks.allreduce", "--one", part] + ["--quick"] * args.quick
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"part {part} failed")
        results.update(json.loads(lines[-1]))
        raw.write_text(json.dumps(results, indent=1) + "\n")
    text = report(results, args.quick)
    print(text)
    (HERE / f"allreduce{suffix}.md").write_text(text + "\n")
    if "calibration" in results:
        (HERE / f"allreduce-calibration{suffix}.json").write_text(json.dumps(results["calibration"], indent=1) + "\n")
