"""Update time as the cluster grows from 1 to 16 workers, with fixed per-worker compute.

    python -m benchmarks.scaling            # P = 1 2 4 8 16, 30 updates each
    python -m benchmarks.scaling --quick    # P = 1 2 4, 10 updates each

Per-worker compute is simulated by sleeping (as the simulations of the Dask paper do): the
module's forward sleeps ``--sleep`` seconds, so worker processes need no cores and 16 of them
fit on a small machine.  The batch is ``P * grads_per_worker``, so every worker gets the same
share at every P; ideal scaling keeps the update time flat.  One JSON line per P, then a
Markdown table (also written to ``benchmarks/scaling/scaling.md``, ``scaling-quick.md`` with --quick).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from distributed import Client, LocalCluster
from torch import nn

from ..common.peers import FloorPlugin, round_times

HERE = Path(__file__).resolve().parent


class SleepNet(nn.Module):
    """A tiny linear model whose forward sleeps a fixed time: simulated compute."""

    def __init__(self, delay: float = 0.05, n_features: int = 16):
        super().__init__()
        self.delay = delay
        self.linear = nn.Linear(n_features, 2)

    def forward(self, x):
        time.sleep(self.delay)
        return self.linear(x)


def fit(client, P: int, args, n_updates: int):
    from adadamp import DaskClassifier

    batch = P * args.grads_per_worker
    rng = np.random.default_rng(0)
    X = rng.standard_normal((batch * n_updates, 16), dtype=np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = SleepNet(args.sleep)
    est = DaskClassifier(
        module=module,
        optimizer=torch.optim.SGD,
        optimizer__lr=0.01,
        batch_size=batch,
        max_epochs=1,
        random_state=0,
        client=client,
        grads_per_worker=1,  # the batch on all P workers
    )
    return est.fit(X, y)


def measure(client, P: int, args) -> dict:
    fit(client, P, args, 3)  # warm-up: workers that just joined import torch and run a first step
    est = fit(client, P, args, args.updates)
    ups = [u for row in est.history_ for u in row["updates"]][args.warmup :]
    assert all(u["n_workers"] == P for u in ups), "not every update used all P workers"
    return {
        "P": P,
        "batch_size": P * args.grads_per_worker,
        "n_updates": len(ups),
        "update_s": statistics.median(u["update_time"] for u in ups),
        "compute_s": statistics.median(u["compute_time"] for u in ups),
        "overhead_s": statistics.median(u["update_time"] - u["compute_time"] for u in ups),
        "floor_s": statistics.median(round_times(client, "bench_noop", args.floor_rounds)),
    }


def table(rows: list[dict], args) -> str:
    base = rows[0]["update_s"]
    out = [
        "# adadamp scaling: update time vs workers (sleep-simulated compute)",
        "",
        (
            f"Forward sleeps {args.sleep * 1e3:.0f} ms per worker per update; {args.grads_per_worker} examples "
            f"per worker; median over {args.updates - args.warmup} updates. Timings were taken while other "
            "work may have been running."
        ),
        "",
        "| workers P | batch | update ms | ratio to P=1 | max worker compute ms | overhead ms | empty-round floor ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['P']} | {r['batch_size']} | {r['update_s'] * 1e3:.1f} | {r['update_s'] / base:.3f} "
            f"| {r['compute_s'] * 1e3:.1f} | {r['overhead_s'] * 1e3:.1f} | {r['floor_s'] * 1e3:.2f} |"
        )
    worst = max(r["update_s"] / base for r in rows)
    out += ["", f"Bar: update time at every P <= 1.15x P=1: worst {worst:.3f}x, {'PASS' if worst <= 1.15 else 'FAIL'}"]
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=None, help="default 1 2 4 8 16 (1 2 4 with --quick)")
    ap.add_argument("--updates", type=int, default=None, help="updates per P (default 30, 10 with --quick)")
    ap.add_argument("--warmup", type=int, default=2, help="first updates left out of the medians")
    ap.add_argument("--sleep", type=float, default=0.05, help="simulated compute per worker per update (s)")
    ap.add_argument("--grads-per-worker", type=int, default=32)
    ap.add_argument("--floor-rounds", type=int, default=50)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    sizes = sorted(args.workers or ([1, 2, 4] if args.quick else [1, 2, 4, 8, 16]))
    args.updates = args.updates or (10 if args.quick else 30)

    cluster = LocalCluster(
        n_workers=sizes[0], threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR
    )
    client = Client(cluster, set_as_default=False)
    rows = []
    try:
        client.register_plugin(FloorPlugin(), name=FloorPlugin.name)
        for P in sizes:  # grow only: no worker is retired between sizes
            cluster.scale(P)
            client.wait_for_workers(P, timeout=600)
            row = measure(client, P, args)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        client.close()
        cluster.close()
    text = table(rows, args)
    print(text)
    (HERE / ("scaling-quick.md" if args.quick else "scaling.md")).write_text(text)
