"""Where a whole ``fit`` call's time goes besides its updates, phase by phase (issue 30).

    python -m benchmarks.setup_phases                     # W1, both backends, 10 fits each (~1 min)
    python -m benchmarks.setup_phases --fits 3 --backends parameter-server --quick

One warm LocalCluster of 2 single-threaded worker processes (the benchmarks' ``local_cluster``),
one warm-up fit per backend, then ``--fits`` consecutive ``est.fit(X, y)`` calls of W1 timed as a
user times them.  Each phase is timed by wrapping the function that does it (a benchmark's
instrumentation: the library is not changed).  Phases are listed in the order a fit meets them;
indented ones are parts of the phase above.  ``updates`` is the sum of the history's
``update_time``; ``non-update`` is the rest of the call, which the issue's bar holds to
``<= 0.15 s + data bytes / 2 GB/s``.  ``gc`` is the time Python's garbage collector ran during the
call (``gc.callbacks``), whatever phase it fell in.

Writes ``benchmarks/setup_phases/setup_phases.md`` (``setup_phases-quick.md`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import inspect
import json
import statistics
import time
from pathlib import Path

import torch

from ..common.peers import local_cluster
from ..common.workloads import WORKLOADS

HERE = Path(__file__).resolve().parent
BAR_S, BAR_BYTES_PER_S = 0.15, 2e9

PHASES: collections.Counter = collections.Counter()


def _wrap(owner, name: str, label) -> None:
    """Add the time of every call of ``owner.name`` to ``PHASES[label]`` (``label(args)`` may name it)."""
    static = inspect.getattr_static(owner, name)
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            PHASES[label(args) if callable(label) else label] += time.perf_counter() - start

    if isinstance(static, classmethod):  # f is bound already
        setattr(owner, name, staticmethod(timed))
    else:
        setattr(owner, name, timed)


def instrument() -> list[tuple[str, int]]:
    """Wrap the phases of a fit; returns ``(label, depth)`` in the order a fit meets them."""
    from adadamp import dashboard, estimators
    from adadamp.cluster import policy as cluster
    from adadamp.engine import loop, membership, session, transport
    from adadamp.engine.backends import allreduce, base, parameter_server
    from adadamp.estimators import fitting
    from adadamp.wire import shm

    def op(args):
        calls = args[1] if len(args) > 1 else []
        return f"RPC {calls[0][1].removeprefix('adadamp_')}" if calls else "RPC (none)"

    order = [
        ("check params", 1, estimators.BaseDaskEstimator, "_check_params"),
        ("data source (validation, conversion)", 1, fitting, "make_source"),
        ("module build (initial state)", 1, fitting, "initial_state"),
        ("state copied (warm start)", 1, fitting, "continued_state"),
        ("session (open, train, release)", 1, session, "train"),
        ("backend built (placement plan)", 2, base.Backend, "__init__"),
        ("backend acquired", 2, base.Backend, "__enter__"),
        ("module payload (pickle)", 3, parameter_server.ParameterServer, "module_payload"),
        ("module payload (pickle)", 3, allreduce.AllReduce, "module_payload"),
        ("shared memory created", 3, shm.SharedBuffers, "create"),
        ("data into shared memory", 3, shm.SharedBuffers, "share_data"),
        ("flat weights bound", 3, parameter_server.ParameterServer, "bind"),
        ("flat weights bound", 3, allreduce.AllReduce, "bind"),
        ("worker plugin registered", 3, cluster, "register_worker_plugin"),
        ("first look at the workers", 3, membership.Membership, "refresh"),
        ("scheduler's worker list", 4, cluster, "live_workers"),
        ("placement", 4, base.Backend, "_place"),
        ("channels opened", 4, transport.Transport, "connect"),
        ("fit loop", 2, loop.FitLoop, "run"),
        ("live page opened", 3, dashboard.Publisher, "__init__"),
        ("epochs (run_epoch)", 3, base.Backend, "run_epoch"),
        ("updates, whole (Backend.update)", 4, base.Backend, "update"),
        ("after each update (FitLoop._on_update)", 4, loop.FitLoop, "_on_update"),
        ("all-reduce group formed", 4, allreduce.AllReduce, "_form_group"),
        ("live page closed", 3, dashboard.Publisher, "end"),
        ("released", 2, base.Backend, "__exit__"),
        ("members released", 3, membership.Membership, "release"),
        ("kept backend claimed", 2, session.KeptBackend, "claim"),
        ("commit (attributes, history)", 1, fitting.FitMixin, "_commit"),
    ]
    for label, _, owner, name in order:
        _wrap(owner, name, label)
    _wrap(transport.Transport, "call_all", op)
    seen, labels = set(), []
    for label, depth, *_ in order:
        if label not in seen:
            seen.add(label)
            labels.append((label, depth))
    return labels


@contextlib.contextmanager
def gc_time():
    """Seconds the garbage collector ran inside the block, and its collections per generation."""
    out = {"gc": 0.0, "collections": [0, 0, 0]}
    start = [0.0]

    def cb(phase, info):
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            out["gc"] += time.perf_counter() - start[0]
            out["collections"][info["generation"]] += 1

    gc.callbacks.append(cb)
    try:
        yield out
    finally:
        gc.callbacks.remove(cb)


_WORKER_GC = {"gc": 0.0, "start": 0.0}


def _worker_gc_hook(dask_worker=None) -> None:
    """Installed in each worker (``client.run``): add up the time its garbage collector runs."""
    def cb(phase, info):
        if phase == "start":
            _WORKER_GC["start"] = time.perf_counter()
        else:
            _WORKER_GC["gc"] += time.perf_counter() - _WORKER_GC["start"]

    if cb.__qualname__ not in {getattr(c, "__qualname__", None) for c in gc.callbacks}:
        gc.callbacks.append(cb)


def _worker_gc_read(dask_worker=None) -> float:
    out, _WORKER_GC["gc"] = _WORKER_GC["gc"], 0.0
    return out


def one_fit(client, wl, X, y, backend: str) -> dict:
    from adadamp import DaskClassifier

    est = DaskClassifier(
        module=wl.module(), optimizer=torch.optim.SGD, optimizer__lr=wl.lr, optimizer__momentum=wl.momentum,
        batch_size=wl.batch_size, max_epochs=wl.epochs, random_state=0, client=client, backend=backend,
    )
    PHASES.clear()
    client.run(_worker_gc_read)
    with gc_time() as g:
        start = time.perf_counter()
        est.fit(X, y)
        fit_s = time.perf_counter() - start
    updates = sum(u["update_time"] for row in est.history_ for u in row["updates"])
    worker_gc = max(client.run(_worker_gc_read).values())
    return {"worker gc": worker_gc, "backend": backend, "fit": fit_s, "updates": updates, "non-update": fit_s - updates,
            "gc": g["gc"], "gc collections": g["collections"], **PHASES}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=["parameter-server", "allreduce"])
    ap.add_argument("--fits", type=int, default=10)
    ap.add_argument("--workload", default="W1", choices=list(WORKLOADS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    labels = instrument()
    wl = WORKLOADS[args.workload]
    X, y = wl.data(args.quick)
    bar = BAR_S + (X.nbytes + y.nbytes) / BAR_BYTES_PER_S
    torch.set_num_threads(1)
    cluster, client = local_cluster(2)
    rows = []
    try:
        client.wait_for_workers(2)
        client.run(_worker_gc_hook)
        for backend in args.backends:
            one_fit(client, wl, X, y, backend)  # warm-up: imports, the workers' first torch calls
            for i in range(args.fits):
                row = one_fit(client, wl, X, y, backend)
                row["fit #"] = i + 1
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        client.close()
        cluster.close()
    text = table(rows, labels, bar, args)
    print(text)
    out = args.out or HERE / ("setup_phases-quick.md" if args.quick else "setup_phases.md")
    out.write_text(text)


def table(rows: list[dict], labels: list[tuple[str, int]], bar: float, args) -> str:
    rpcs = sorted({k for r in rows for k in r if k.startswith("RPC ")})
    out = [
        (f"# Phases of a whole `fit` ({args.workload}{', --quick' if args.quick else ''}, warm LocalCluster of 2 "
        "single-threaded workers)"),
        "",
        (f"{args.fits} fits per backend; seconds; median and max over each backend's consecutive fits. The bar for "
        f"non-update time: {bar:.3f} s (0.15 s + data bytes / 2 GB/s)."),
        "",
    ]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    head = "| phase | " + " | ".join(f"{b} median | {b} max" for b in backends) + " |"
    out += [head, "|---" + "|---:" * (2 * len(backends)) + "|"]
    names = [("fit (whole call)", 0, "fit"), ("updates (history)", 0, "updates"),
             ("non-update", 0, "non-update")] + [(lbl, d, lbl) for lbl, d in labels]
    names += [(k, 4, k) for k in rpcs] + [("gc (any phase)", 1, "gc"), ("workers' gc (any phase, slowest)", 1, "worker gc")]
    for title, depth, key in names:
        cells = []
        for b in backends:
            vals = [r.get(key, 0.0) for r in rows if r["backend"] == b]
            cells += [f"{statistics.median(vals):.4f}", f"{max(vals):.4f}"]
        indent = "&nbsp;&nbsp;" * max(0, depth - 1)
        out.append(f"| {indent}{title} | " + " | ".join(cells) + " |")
    out += ["", "Non-update time of each fit, in order:", ""]
    for b in backends:
        vals = [r["non-update"] for r in rows if r["backend"] == b]
        within = sum(v <= bar for v in vals)
        out.append(f"- {b}: " + ", ".join(f"{v:.3f}" for v in vals) + f" ({within} of {len(vals)} within the bar)")
    return "\n".join(out) + "\n"
