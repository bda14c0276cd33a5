"""What the training kit costs: mixed precision and ``torch.compile`` against float32 eager, for an
adadamp fit and for plain single-process PyTorch doing the same updates, as ratios in one run.

The claim measured: adadamp adds nothing to PyTorch's own ratio (``bf16 / fp32`` and ``compiled /
eager`` within 10% of plain PyTorch's).  On a CPU without bfloat16 instructions mixed precision is
slower than float32 for both; that is PyTorch's number.

Workload: an MLP ``features``-``hidden``-``hidden``-10 (classification, cross-entropy, SGD with
momentum) on ``n`` synthetic examples, batch ``batch``, ``epochs`` epochs.  adadamp: a warm
``LocalCluster`` of 2 single-threaded workers, the parameter server, the batch on both workers;
plain: one process with 2 torch threads, the same batches' sizes.  Each variant's fit is timed
whole (``fit`` call; plain: the loop) and, for adadamp, its updates alone (without the fit's fixed
cost of setting up workers and data, which a short fit's ratio otherwise dilutes), after one warm
fit per variant (the compiled variants' first compilation is excluded from both).  Variants
alternate, ``--repeats`` times; medians.

    python -m benchmarks.kit [--quick] [--repeats 3] [--epochs 4] [--out benchmarks/kit]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

#: variant -> the estimator's parameters for it
VARIANTS = {
    "fp32": {},
    "bf16-mixed": {"precision": "bf16-mixed"},
    "16-mixed": {"precision": "16-mixed"},
    "compiled": {"compile": True},
}


def _data(n: int, features: int):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, features)).astype("float32")
    y = (X[:, :10].argmax(axis=1)).astype("int64")
    return X, y


def _module(features: int, hidden: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def ours(client, variant: str, shape: dict) -> tuple[float, float, float]:
    """Seconds of one adadamp ``fit``, of its updates alone (the history's ``update_time``: without
    the fit's fixed cost of setting up the workers and placing the data), and of the workers'
    forward and backward passes in them (``compute_time``, the slower worker's)."""
    import torch

    from adadamp import DaskClassifier

    X, y = _data(shape["n"], shape["features"])
    est = DaskClassifier(module=_module(shape["features"], shape["hidden"]), optimizer=torch.optim.SGD,
                         optimizer__lr=0.05, optimizer__momentum=0.9, batch_size=shape["batch"],
                         max_epochs=shape["epochs"], random_state=0, client=client, min_workers=2,
                         grads_per_worker=shape["batch"] // 2, **VARIANTS[variant],
                         **({"compile__backend": shape["compiler"]} if variant == "compiled" else {}))
    start = time.perf_counter()
    est.fit(X, y)
    updates = [u for row in est.history_ for u in row["updates"]]
    return time.perf_counter() - start, sum(u["update_time"] for u in updates), sum(u["compute_time"] for u in updates)


def plain(variant: str, shape: dict) -> float:
    """Seconds of the same updates in one process: autocast (+ GradScaler for 16-mixed) or
    ``torch.compile``, as a PyTorch user writes them."""
    import torch
    from torch import nn

    X, y = (torch.from_numpy(a) for a in _data(shape["n"], shape["features"]))
    model = _module(shape["features"], shape["hidden"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    forward = torch.compile(model, backend=shape["compiler"]) if variant == "compiled" else model
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(variant)
    scaler = torch.amp.GradScaler("cpu") if variant == "16-mixed" else None
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(shape["epochs"]):
        perm = torch.from_numpy(rng.permutation(len(X)))
        for i in range(0, len(X), shape["batch"]):
            idx = perm[i:i + shape["batch"]]
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(forward(X[idx]), y[idx])
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
    return time.perf_counter() - start


def report(rows: list[dict], shape: dict) -> str:
    """The markdown table: seconds and ratios to fp32 for both, and our ratio over plain's."""
    lines = [
        "# The training kit's cost (`python -m benchmarks.kit`)",
        "",
        (f"MLP {shape['features']}-{shape['hidden']}-{shape['hidden']}-10, {shape['n']} examples, batch "
         f"{shape['batch']}, {shape['epochs']} epochs; adadamp on 2 single-threaded workers (parameter server), "
         "plain PyTorch in one process with 2 threads. Medians of the whole fit; ratios to fp32 eager in the "
         "same run."),
        "",
        ("Seconds: adadamp's whole fit, its updates, its workers' compute in them; plain's loop. Ratios: each "
        "variant's seconds over fp32's, then adadamp's ratio over plain's (1.00: adadamp adds nothing)."),
        "",
        ("| variant | fit s | updates s | compute s | plain s | fit / fp32 | updates / fp32 | compute / fp32 | "
        "plain / fp32 | fit: ours / plain | compute: ours / plain |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['ours_s']:.2f} | {r['updates_s']:.2f} | {r['compute_s']:.2f} | "
                     f"{r['plain_s']:.2f} | {r['ours_ratio']:.2f} | {r['updates_ratio']:.2f} | "
                     f"{r['compute_ratio']:.2f} | {r['plain_ratio']:.2f} | {r['relative']:.2f} | "
                     f"{r['compute_relative']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny size, one repeat (the suite's smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    import torch
    from distributed import Client, LocalCluster

    shape = {"n": 4096, "features": 256, "hidden": 1024, "batch": 256, "epochs": args.epochs, "compiler": "inductor"}
    repeats = args.repeats
    if args.quick:
        # (torch.compile's eager backend: the harness, without inductor's first C++ compilation)
        shape, repeats = {"n": 256, "features": 16, "hidden": 32, "batch": 64, "epochs": 1, "compiler": "eager"}, 1
    times = {(who, v): [] for who in ("ours", "updates", "compute", "plain") for v in VARIANTS}
    threads = torch.get_num_threads()
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        for variant in VARIANTS:  # warm: the compiled variants compile here, both sides
            ours(client, variant, shape)
            torch.set_num_threads(2)
            plain(variant, shape)
            torch.set_num_threads(threads)
        for _ in range(repeats):
            for variant in VARIANTS:
                whole, updates, compute = ours(client, variant, shape)
                times["ours", variant].append(whole)
                times["updates", variant].append(updates)
                times["compute", variant].append(compute)
                torch.set_num_threads(2)
                times["plain", variant].append(plain(variant, shape))
                torch.set_num_threads(threads)
    median = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for variant in VARIANTS:
        ours_ratio = median["ours", variant] / median["ours", "fp32"]
        updates_ratio = median["updates", variant] / median["updates", "fp32"]
        compute_ratio = median["compute", variant] / median["compute", "fp32"]
        plain_ratio = median["plain", variant] / median["plain", "fp32"]
        rows.append({"variant": variant, "ours_s": median["ours", variant], "updates_s": median["updates", variant],
                     "compute_s": median["compute", variant], "plain_s": median["plain", variant],
                     "ours_ratio": ours_ratio, "updates_ratio": updates_ratio, "compute_ratio": compute_ratio,
                     "plain_ratio": plain_ratio, "relative": ours_ratio / plain_ratio,
                     "compute_relative": compute_ratio / plain_ratio})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kit.json").write_text(json.dumps({"shape": shape, "repeats": repeats, "rows": rows,
                                                   "times": {f"{a}/{b}": v for (a, b), v in times.items()}}, indent=1))
    text = report(rows, shape)
    (args.out / "kit.md").write_text(text)
    print(text)
