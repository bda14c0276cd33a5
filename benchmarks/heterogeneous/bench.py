"""Workers that differ in speed (issue 33): speed-based shares against equal shares and PyTorch DDP.

    python -m benchmarks.heterogeneous                 # both backends and DDP, 3 repeats (~16 min on 2 cores)
    python -m benchmarks.heterogeneous --quick         # 100 updates per run, one repeat, the parameter server
    python -m benchmarks.heterogeneous --systems ddp   # pieces: parameter-server, allreduce, ddp
    python -m benchmarks.heterogeneous --report benchmarks/heterogeneous/heterogeneous.json   # the table of a saved run

Four workers (a LocalCluster of single-threaded processes) on emulated accelerators
(:mod:`benchmarks.common.emulated`: each training forward sleeps 0.5 ms + 0.1 ms per example, divided by
the worker's speed from a JSON file, re-read when it changes), an MLP regressor (32 features, one
hidden layer of 64), batch 512, SGD.  Per system and repeat, in one cluster (:data:`CASES`):

- ``nominal``: every worker at speed 1, with equal shares first and last (the repeat's reference:
  their mean throughput, examples per second over the updates after the first 20) and with speed
  shares;
- ``half``: one worker at half speed from the start;
- ``slowdown``: one worker slows to a quarter of its speed after 150 updates (the callback rewrites
  the speeds file).

The ideal throughput is the reference's times the sum of the speeds over 4 (3.5 / 4 at half
speed, 3.25 / 4 after the slowdown).  ``ratio`` is the measured throughput over the ideal; for the
slowdown, over the rest of the fit after the slowdown, and ``recovery_s`` is the time from the
slowdown to the first half second whose throughput reaches 0.9x the ideal.  Each run is paired
with its own repeat's reference (a machine whose speed drifts, other jobs on it, moves both), and
the table gives the medians over repeats.  adadamp runs with ``shares="equal"`` and
``shares="speed"``; DDP splits every batch equally (rank ``r`` takes part ``r``).  Writes
``heterogeneous.json`` and ``heterogeneous.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from adadamp import DaskRegressor
from adadamp.callbacks import Callback
from adadamp.modules import MLP

from ..common.emulated import Emulated
from ..common.peers import local_cluster

HERE = Path(__file__).resolve().parent
WORKERS, BATCH, FEATURES, HIDDEN = 4, 512, 32, (64,)
N_DATA = 512 * 64
WARM = 20  # updates left out of the steady-state throughput (set-up, first placements)
SLOW_AT = 150  # the update after which a worker slows down
WINDOW = 0.5  # seconds of the windows the recovery is judged on


class Timeline(Callback):
    """Records when each update ends and its examples; after update ``slow_at`` writes
    ``{slow_key: slow}`` to the speeds file (the worker slows down mid-fit)."""

    def __init__(self, speeds=None, slow_key=None, slow=None, slow_at=None):
        self.speeds = speeds
        self.slow_key = slow_key
        self.slow = slow
        self.slow_at = slow_at

    def on_train_begin(self, estimator, **info):
        self.times_, self.examples_, self.slowed_at_ = [], [], None

    def on_update_end(self, estimator, record=None, **info):
        self.times_.append(time.perf_counter())
        self.examples_.append(record["batch_size"])
        if len(self.times_) == self.slow_at:
            _write_speeds(self.speeds, {self.slow_key: self.slow})
            self.slowed_at_ = time.perf_counter()


def _write_speeds(path: str, speeds: dict) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(speeds))
    os.replace(tmp, path)  # a reader never sees half a file


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_DATA, FEATURES)).astype(np.float32)
    return X, (X @ rng.normal(size=FEATURES)).astype(np.float32)


def throughput(times: list[float], examples: list[int], start: float, stop: float) -> float:
    """Examples per second of the updates that ended in ``(start, stop]``."""
    n = sum(e for t, e in zip(times, examples) if start < t <= stop)
    return n / (stop - start) if stop > start else math.nan


def summarize(times: list[float], examples: list[int], reference: float, speeds: float,
              slowed_at: float | None = None, after: float | None = None) -> dict:
    """The run's ratio to the ideal (``reference * speeds / 4``), or for a slowdown (at
    ``slowed_at``, speeds ``after`` from then on) the ratio before and after it and the recovery."""
    ideal = reference * speeds / WORKERS
    if slowed_at is None:
        got = throughput(times, examples, times[WARM - 1], times[-1])
        return {"throughput": got, "ideal": ideal, "ratio": got / ideal}
    ideal_after = reference * after / WORKERS
    before = throughput(times, examples, times[WARM - 1], slowed_at)
    rest = throughput(times, examples, slowed_at, times[-1])
    recovery = None
    for t in [slowed_at] + [t for t in times if t > slowed_at]:
        if t + WINDOW > times[-1]:
            break
        if throughput(times, examples, t, t + WINDOW) >= 0.9 * ideal_after:
            recovery = t - slowed_at
            break
    settled = throughput(times, examples, slowed_at + recovery, times[-1]) if recovery is not None else math.nan
    return {"ratio_before": before / ideal, "ratio": rest / ideal_after, "recovery_s": recovery,
            "ratio_after_recovery": settled / ideal_after, "ideal": ideal_after, "throughput": rest}


# ------------------------------------------------------------------ adadamp
def _fit(client, backend: str, shares: str, speeds: str, n_updates: int, **timeline) -> tuple:
    """One fit's update end times, examples, the time of the slowdown (or None) and its shares."""
    X, y = _data()
    est = DaskRegressor(
        module=Emulated, module__inner=MLP, module__speeds=speeds, module__n_features=FEATURES,
        module__n_outputs=1, module__hidden=HIDDEN, optimizer=torch.optim.SGD, optimizer__lr=0.01,
        batch_size=BATCH, max_epochs=math.ceil(n_updates * BATCH / N_DATA), random_state=0,
        scale_cluster=False, client=client, backend=backend, shares=shares,
        callbacks=[("timeline", Timeline(speeds=speeds, **timeline))],
    )
    est.fit(X, y)
    t = dict(est.callbacks_)["timeline"]
    shares_seen = [u["shares"] for row in est.history_ for u in row["updates"]]
    return t.times_, t.examples_, t.slowed_at_, shares_seen


#: The runs of one repeat: (shares, case), the reference (all nominal, equal shares) first and last.
CASES = [("equal", "nominal"), ("speed", "nominal"), ("equal", "half"), ("speed", "half"),
         ("equal", "slowdown"), ("speed", "slowdown"), ("equal", "nominal")]


def run_adadamp(backend: str, n_updates: int, repeats: int) -> list[dict]:
    cluster, client = local_cluster(WORKERS)
    runs = []  # (repeat, shares, case, timeline)
    with cluster, client, tempfile.TemporaryDirectory() as tmp:
        speeds = os.path.join(tmp, "speeds.json")
        info = client.scheduler_info()["workers"]
        slow = str(max(info.values(), key=lambda w: str(w["name"]))["name"])
        _write_speeds(speeds, {})
        _fit(client, backend, "equal", speeds, 3 * WARM)  # the cluster's first fit warms its workers up
        for repeat in range(repeats):
            for shares, case in CASES:
                _write_speeds(speeds, {slow: 0.5} if case == "half" else {})
                extra = {"slow_key": slow, "slow": 0.25, "slow_at": SLOW_AT} if case == "slowdown" else {}
                n = n_updates + (SLOW_AT if case == "slowdown" else 0)
                runs.append((repeat, shares, case, _fit(client, backend, shares, speeds, n, **extra)))
    return _report(backend, runs)


def _report(system: str, runs: list) -> list[dict]:
    """One row per (shares, case): the median over repeats of each run's ratio to the ideal, the
    ideal being the mean throughput of the repeat's two reference runs (all nominal, equal shares)
    times the sum of the speeds over 4: paired within a repeat, so that a machine whose speed
    drifts between repeats (other jobs on it) moves the run and its reference together."""
    by_repeat: dict[int, list] = {}
    for repeat, shares, case, t in runs:
        if case == "nominal" and shares == "equal":
            by_repeat.setdefault(repeat, []).append(throughput(t[0], t[1], t[0][WARM - 1], t[0][-1]))
    cells: dict[tuple, list[dict]] = {}
    for repeat, shares, case, (times, examples, slowed, seen) in runs:
        reference = float(np.mean(by_repeat[repeat]))
        result = summarize(times, examples, reference, {"nominal": 4, "half": 3.5, "slowdown": 4}[case],
                           slowed, 3.25 if slowed else None)
        result["tail_excess"] = tail_excess(times, slowed)
        if seen:
            result["last_shares"] = seen[-1]
        cells.setdefault((shares, case), []).append(result)
    rows = []
    for (shares, case), results in cells.items():
        row = {"system": system, "shares": shares, "case": case, "repeats": results}
        for key in ("ratio", "throughput", "ideal", "ratio_before", "recovery_s", "ratio_after_recovery", "tail_excess"):
            values = [r[key] for r in results if key in r]
            if values:
                known = [v for v in values if v is not None]
                row[key] = float(np.median(known)) if len(known) == len(values) else None
                row[f"{key}_range"] = [min(known), max(known)] if known else None
        if "last_shares" in results[-1]:
            row["last_shares"] = results[-1]["last_shares"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "repeats"}), flush=True)
    return rows


def tail_excess(times: list[float], slowed: float | None) -> float:
    """What backup computation could save at most: the time of the updates (after the first
    ``WARM``, and after a slowdown's first second) beyond 1.5x the median update, over all of it."""
    start = WARM if slowed is None else next((i for i, t in enumerate(times) if t > slowed + 1.0), len(times) - 1)
    steps = np.diff(times[start - 1:])
    return float(np.maximum(steps - 1.5 * np.median(steps), 0).sum() / steps.sum())


# ------------------------------------------------------------------ PyTorch DDP
def _ddp_rank(rank: int, port: int, speeds: str, n_updates: int, slow_at: int | None, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ADADAMP_EMULATED_NAME=f"rank{rank}")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORKERS)
    X, y = (torch.from_numpy(a) for a in _data())
    torch.manual_seed(0)
    model = DistributedDataParallel(Emulated(MLP, speeds=speeds, n_features=FEATURES, n_outputs=1, hidden=HIDDEN))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = torch.nn.MSELoss()
    times, slowed = [], None
    dist.barrier()
    for update in range(n_updates):
        epoch, k = divmod(update, N_DATA // BATCH)
        idx = np.random.default_rng([0, epoch]).permutation(N_DATA)[k * BATCH:(k + 1) * BATCH]
        idx = torch.from_numpy(np.array_split(idx, WORKERS)[rank])  # equal shares, as DDP does
        opt.zero_grad()
        crit(model(X[idx]).squeeze(-1), y[idx]).backward()
        opt.step()
        times.append(time.perf_counter())
        if slow_at is not None and update + 1 == slow_at:
            if rank == 0:
                _write_speeds(speeds, {f"rank{WORKERS - 1}": 0.25})
            slowed = time.perf_counter()
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "slowed": slowed}))
    dist.destroy_process_group()


def _ddp(speeds: str, n_updates: int, slow_at: int | None = None) -> tuple:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        mp.spawn(_ddp_rank, args=(port, speeds, n_updates, slow_at, out), nprocs=WORKERS, join=True)
        res = json.loads(Path(out).read_text())
    return res["times"], [BATCH] * len(res["times"]), res["slowed"], None


def run_ddp(n_updates: int, repeats: int) -> list[dict]:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        speeds = os.path.join(tmp, "speeds.json")
        for repeat in range(repeats):
            for shares, case in CASES:
                if shares != "equal":  # DDP splits every batch equally
                    continue
                _write_speeds(speeds, {f"rank{WORKERS - 1}": 0.5} if case == "half" else {})
                n = n_updates + (SLOW_AT if case == "slowdown" else 0)
                runs.append((repeat, shares, case, _ddp(speeds, n, SLOW_AT if case == "slowdown" else None)))
    return _report("ddp", runs)


# ------------------------------------------------------------------ report
def table(rows: list[dict], n_updates: int, repeats: int) -> str:
    def cell(r, key, fmt=".2f"):
        v = r.get(key)
        if key not in r:
            return "-"
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "never" if key == "recovery_s" else "-"
        lo, hi = r.get(f"{key}_range") or (v, v)
        return f"{v:{fmt}} ({lo:{fmt}}-{hi:{fmt}})" if repeats > 1 else f"{v:{fmt}}"

    lines = [
        "# Workers that differ in speed (issue 33)", "",
        (f"4 workers on emulated accelerators (0.5 ms + 0.1 ms per example per training forward, divided by "
         f"the worker's speed), MLP regressor 32-64-1, batch {BATCH}, {n_updates} updates per run "
         f"(+{SLOW_AT} before a slowdown), {repeats} repeats (medians, range in brackets). Ratio: throughput "
         "over the ideal (the throughput of the same repeat's all-nominal runs with equal shares, times the sum "
         "of the speeds over 4); for a slowdown, over the rest of the fit; recovery: the time until a "
         f"{WINDOW} s window first reaches 0.9x the ideal; tail excess: the share of the time in updates beyond "
         "1.5x the median update (what backup computation could save at most). "
         "`python -m benchmarks.heterogeneous`."), "",
        ("| system | shares | case | examples/s | ideal | ratio | recovery s | ratio after recovery | tail excess "
        "| last update's shares |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['system']} | {r['shares']} | {r['case']} | {r['throughput']:.0f} | {r['ideal']:.0f} | "
            f"{cell(r, 'ratio')} | {cell(r, 'recovery_s', '.1f')} | {cell(r, 'ratio_after_recovery')} | "
            f"{cell(r, 'tail_excess', '.3f')} | {r.get('last_shares', '-')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 updates per run, one repeat, the parameter server")
    parser.add_argument("--systems", nargs="+", default=None, choices=["parameter-server", "allreduce", "ddp"])
    parser.add_argument("--updates", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--report", metavar="JSON", help="write the table of an earlier run's JSON and exit")
    args = parser.parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(table(saved["rows"], saved["n_updates"], saved["repeats"]))
        return
    systems = args.systems or (["parameter-server"] if args.quick else ["parameter-server", "allreduce", "ddp"])
    n_updates = args.updates or (100 if args.quick else 250)
    repeats = args.repeats or (1 if args.quick else 3)
    rows = []
    for system in systems:
        rows += run_ddp(n_updates, repeats) if system == "ddp" else run_adadamp(system, n_updates, repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "heterogeneous-quick" if args.quick else "heterogeneous"
    (out / f"{name}.json").write_text(json.dumps({"n_updates": n_updates, "repeats": repeats, "rows": rows}, indent=1))
    text = table(rows, n_updates, repeats)
    (out / f"{name}.md").write_text(text)
    print(text)
