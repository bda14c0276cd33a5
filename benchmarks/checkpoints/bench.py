"""What periodic checkpoints cost a long fit: the same fit with and without ``checkpoint_every``.

An MLP ``features``-``hidden``-1 (:class:`adadamp.modules.MLP`; 32-64-1 by default, whose updates
take ~2 ms: what a write costs shows most) on 2,048 synthetic examples, batch 64 (32 updates an
epoch), ``--epochs`` epochs (150), on a warm ``LocalCluster`` of 2 single-threaded workers; the
fits alternate, ``--repeats`` times each.  Reports the whole ``fit``, the last ten epochs' mean
time (where a checkpoint that grows with the history costs most) and the ratio of each with
checkpoints to without.  Writes ``benchmarks/checkpoints/checkpoints.json`` and ``benchmarks/checkpoints/checkpoints.md``.

    python -m benchmarks.checkpoints [--epochs 150] [--every 20] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def fit(client, epochs: int, every: int | None, folder: Path, features: int = 32, hidden: int = 64) -> dict:
    from adadamp import DaskRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2048, features)).astype("float32")
    y = X @ rng.normal(size=features).astype("float32")
    path = None if every is None else folder / f"fit-{time.monotonic_ns()}.ckpt"
    est = DaskRegressor(module__hidden=(hidden,), batch_size=64, max_epochs=epochs, random_state=0, client=client,
                        checkpoint=path, checkpoint_every=every)
    start = time.perf_counter()
    est.fit(X, y)
    seconds = time.perf_counter() - start
    return {"fit_s": seconds, "last_epochs_s": statistics.mean(r["dur"] for r in est.history_[-10:]),
            "first_epochs_s": statistics.mean(r["dur"] for r in est.history_[1:11])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    runs = {"without": [], "with": []}
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client, tempfile.TemporaryDirectory() as folder:
        shape = {"features": args.features, "hidden": args.hidden}
        fit(client, 2, None, Path(folder), **shape)  # warm
        for _ in range(args.repeats):
            runs["without"].append(fit(client, args.epochs, None, Path(folder), **shape))
            runs["with"].append(fit(client, args.epochs, args.every, Path(folder), **shape))
    best = {k: {m: min(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
    ratio = {m: best["with"][m] / best["without"][m] for m in best["with"]}
    result = {"epochs": args.epochs, "every": args.every, "features": args.features, "hidden": args.hidden, "repeats": args.repeats, "runs": runs, "best": best,
              "ratio": ratio}
    (HERE / "checkpoints.json").write_text(json.dumps(result, indent=1))
    lines = ["| | whole fit (s) | epochs 2-11 (s each) | last 10 epochs (s each) |", "|---|---|---|---|"]
    for k in ("without", "with"):
        b = best[k]
        lines.append(f"| {k} checkpoints | {b['fit_s']:.1f} | {b['first_epochs_s']:.3f} | {b['last_epochs_s']:.3f} |")
    lines.append(f"| ratio | {ratio['fit_s']:.3f}x | {ratio['first_epochs_s']:.3f}x | {ratio['last_epochs_s']:.3f}x |")
    (HERE / "checkpoints.md").write_text(
        f"# Periodic checkpoints on a long fit\n\n`python -m benchmarks.checkpoints --epochs {args.epochs} --every "
        f"{args.every} --repeats {args.repeats} --features {args.features} --hidden {args.hidden}` (best of "
        f"{args.repeats}; 2 workers, 32 updates an epoch).\n\n"
        + "\n".join(lines) + "\n")
    print("\n".join(lines))
