"""Run the throughput benchmarks: plain PyTorch, DDP, skorch and adadamp (both backends) on W1-W3, plus the floor.

    python -m benchmarks.run                      # everything, 3 repeats (a few minutes)
    python -m benchmarks.run --quick              # tiny sizes, 1 repeat (smoke test)
    python -m benchmarks.run --workload W1 --peers plain adadamp floor --repeats 5

Each run is a fresh Python process (clean peak memory, no shared state); it prints one
JSON line.  At the end a Markdown table is printed and written to ``benchmarks/run/results.md``
(``results-quick.md`` with ``--quick``).  See benchmarks/README.md for the columns.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import torch

from ..common import peers
from ..common.workloads import WORKLOADS, full_loss

PEERS = ("plain", "ddp", "skorch", "adadamp", "allreduce", "floor")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository


# ------------------------------------------------------------------ one run (child process)
class PeakRSS:
    """Peak resident memory (MB) of this process plus all its descendants, sampled every 0.5 s.

    Sampling reads every descendant's /proc entry; at 50 ms that slowed adadamp's two worker
    processes by about 10 % on 2 cores (measured), so the samples are sparse: training memory is
    flat after the first updates.
    """

    def __init__(self):
        self.peak, self._stop = 0.0, threading.Event()
        self.own_peak = 0.0  # this process alone (adadamp: the client; plain: the training loop)
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        try:
            import psutil
        except ImportError:
            return
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                if p is me:
                    self.own_peak = max(self.own_peak, rss / 2**20)
            self.peak = max(self.peak, total / 2**20)
            self._stop.wait(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        # Fallback / floor: getrusage high-water marks (KB on Linux) of self and reaped children.
        usage = sum(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        self.peak = max(self.peak, usage / 1024)


def run_one(peer: str, name: str, quick: bool) -> dict:
    wl = WORKLOADS[name]
    with PeakRSS() as mem:
        if peer == "floor":
            res = peers.run_floor(wl, quick)
        else:
            X, y = wl.data(quick)
            if peer == "ddp":
                res = peers.run_ddp(wl, X, y, quick)
            else:
                res = getattr(peers, f"run_{peer}")(wl, X, y)
    if peer != "floor":
        # after the peak window: the benchmark's own loss pass over all of X is no peer's memory
        torch.set_num_threads(2)
        res["final_loss"] = full_loss(res.pop("module"), X, y)
        res["samples_per_s"] = len(X) * wl.epochs / res["fit_s"]  # the headline: the whole call
        res["updates_per_s"] = res["n_updates"] / res["fit_s"]
        res["steady_samples_per_s"] = len(X) * wl.epochs / res["train_s"]
    return {"workload": name, "peer": peer, "quick": quick, **res, "peak_rss_mb": mem.peak, "own_peak_mb": mem.own_peak}


# ------------------------------------------------------------------ driver (parent process)
def spawn_one(peer: str, name: str, quick: bool, repeat: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.run", "--one", peer, name] + ["--quick"] * quick
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"workload": name, "peer": peer, "repeat": repeat, "error": proc.stderr.strip()[-2000:]}
    return {**json.loads(lines[-1]), "repeat": repeat}


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def paired_ratio(rows: list[dict], plain: list[dict]) -> float | None:
    """Median over repeats of samples/s divided by the plain loop's in the same repeat.

    Repeats are interleaved, so the pair ran minutes apart at most: steadier than the ratio of
    medians on a machine whose speed drifts.
    """
    base = {r["repeat"]: r["samples_per_s"] for r in plain}
    ratios = [r["samples_per_s"] / base[r["repeat"]] for r in rows if r["repeat"] in base]
    return statistics.median(ratios) if ratios else None


def fmt(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def tables(records: list[dict], quick: bool) -> str:
    ok = [r for r in records if "error" not in r]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in ok:
        groups.setdefault((r["workload"], r["peer"]), []).append(r)
    names = sorted({r["workload"] for r in records})
    summary = {}
    for (name, peer), rows in groups.items():
        if peer == "floor":
            summary[name, peer] = {k: med(rows, k) for k in ("floor_ms", "floor_weights_ms", "channel_floor_ms", "peak_rss_mb")}
            continue
        keys = ("samples_per_s", "updates_per_s", "final_loss", "fit_s", "train_s", "steady_samples_per_s",
                "first_fit_s")
        s = {k: med(rows, k) for k in keys}
        if peer == "ddp":
            s["ddp"] = {k: med(rows, k) for k in ("start_s", "init_s", "data_s", "first_fit_s", "fit_s", "script_s")}
        s["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rows)
        s["own_peak_mb"] = max(r.get("own_peak_mb", 0.0) for r in rows)
        s["n"] = len(rows)
        for key in ("sent_bytes", "received_bytes"):
            if all(key in r for r in rows):
                s[key] = med(rows, key)
        if peer in ("adadamp", "allreduce") and "breakdown" in rows[0]:
            s["setup_s"] = med(rows, "setup_s")
            s["bd"] = {k: statistics.median(r["breakdown"][k] for r in rows) for k in rows[0]["breakdown"]}
            s["worker_peak_mb"] = max(r.get("worker_peak_mb", 0.0) for r in rows)
        summary[name, peer] = s

    out = [
        f"# adadamp benchmarks{' (--quick)' if quick else ''}",
        "",
        (
            f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.platform()}, {os.cpu_count()} CPUs, "
            f"torch {torch.__version__}. Timings were taken while other work may have been running."
        ),
        "",
        "## Throughput of the whole fit (median over repeats)",
        "",
        "**whole fit**: the training call as its user times it (`est.fit(X, y)` on a warm cluster; a script's",
        "model, optimizer and loop in a warm process), samples/s and ratios from it; **steady**: its epochs only;",
        "**first fit**: the first call on a fresh cluster (adadamp; cluster start excluded) or in fresh processes.",
        "",
        (
            "| workload | peer | whole fit s | samples/s | ratio to plain | paired ratio | steady s | steady samples/s "
            "| steady ratio to plain | first fit s | final loss | loss vs plain | peak RSS MB | runs |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        base = summary.get((name, "plain"))
        for peer in PEERS[:5]:
            s = summary.get((name, peer))
            if s is None:
                continue
            ratio = s["samples_per_s"] / base["samples_per_s"] if base else None
            steady = s["steady_samples_per_s"] / base["steady_samples_per_s"] if base else None
            paired = paired_ratio(groups.get((name, peer), []), groups.get((name, "plain"), []))
            dloss = f"{100 * (s['final_loss'] / base['final_loss'] - 1):+.2f}%" if base else "-"
            out.append(
                f"| {name} | {peer} | {s['fit_s']:.2f} | {s['samples_per_s']:,.0f} | {fmt(ratio, '.2f')} "
                f"| {fmt(paired, '.2f')} | {s['train_s']:.2f} | {s['steady_samples_per_s']:,.0f} "
                f"| {fmt(steady, '.2f')} | {s['first_fit_s']:.2f} | {s['final_loss']:.4f} | {dloss} "
                f"| {s['peak_rss_mb']:,.0f} | {s['n']} |"
            )

    ddps = {name: summary[name, "ddp"]["ddp"] for name in names if (name, "ddp") in summary}
    if ddps:
        out += ["", "## PyTorch DDP's whole script (median s)", ""]
        out += [
            "From `mp.spawn` to the ranks' exit: process start (to rank 0's first line: interpreter, imports), the",
            "gloo group's init, the data made, then two training runs (model wrapped, loop between barriers).",
            "",
            "| workload | process start | group init | data load | first fit | whole fit | whole script |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        out += [
            f"| {n} | " + " | ".join(f"{d[k]:.2f}" for k in ("start_s", "init_s", "data_s", "first_fit_s", "fit_s",
                                                            "script_s")) + " |"
            for n, d in ddps.items()
        ]

    floors = {name: summary[name, "floor"] for name in names if (name, "floor") in summary}
    if floors:
        out += ["", "## Round-trip floors (e): one synchronous empty round to both workers", ""]
        out += [
            "Dask RPC: `client.rpc(addr).<op>()` fanned out in `client.sync` (the bar's floor); channel: the engine's",
            "data plane (`adadamp.wire.channel`, a plain TCP socket per worker served by a worker thread).",
            "",
            "| workload | Dask RPC empty round ms | Dask RPC round with weights each way ms | channel empty round ms |",
            "|---|---:|---:|---:|",
        ]
        out += [
            f"| {n} | {f['floor_ms']:.2f} | {f['floor_weights_ms']:.2f} | {fmt(f.get('channel_floor_ms'), '.3f')} |"
            for n, f in floors.items()
        ]

    mems = [(name, peer) for name in names for peer in PEERS[:5] if (name, peer) in summary]
    if mems:
        out += ["", "## Peak memory (MB)", ""]
        out += [
            "The peak resident memory of the run's process tree (adadamp: client, scheduler, nannies and workers;",
            "DDP: every rank) and of its first process alone (adadamp: the client, with the LocalCluster's scheduler",
            "in it; DDP: the parent that spawned the ranks; sampled every 0.5 s), and for adadamp the largest peak",
            "of a worker in any update (`history_`'s `peak_memory`: resident memory, or a GPU's).",
            "",
            "| workload | peer | process tree | first process | a worker |",
            "|---|---|---:|---:|---:|",
        ]
        out += [f"| {name} | {peer} | {summary[name, peer]['peak_rss_mb']:,.0f} "
                f"| {summary[name, peer]['own_peak_mb']:,.0f} "
                f"| {fmt(summary[name, peer].get('worker_peak_mb'), ',.0f')} |" for name, peer in mems]

    bds = {(name, peer): summary[name, peer] for name in names for peer in ("adadamp", "allreduce")
           if "bd" in summary.get((name, peer), {})}
    if bds:
        out += ["", "## adadamp per-update breakdown (median ms over updates, from history_)", ""]
        cols = ["workload", "backend", "compute", "comm", "aggregate", "step", "other", "update", "overhead", "floor"]
        cols += ["overhead / floor", "overhead / weights floor", "rest of the fit s"]
        out += ["| " + " | ".join(cols) + " |", "|---" + "|---:" * (len(cols) - 1) + "|"]
        for (name, peer), s in bds.items():
            b = {k: 1e3 * v for k, v in s["bd"].items()}
            floor = floors.get(name, {})
            ratios = [b["overhead"] / floor[k] if k in floor else None for k in ("floor_ms", "floor_weights_ms")]
            cells = " | ".join(f"{b[k]:.2f}" for k in ("compute", "comm", "aggregate", "step", "other", "update"))
            out.append(
                f"| {name} | {'parameter-server' if peer == 'adadamp' else peer} | {cells} | {b['overhead']:.2f} "
                f"| {fmt(floor.get('floor_ms'), '.2f')} "
                f"| {fmt(ratios[0], '.2f')} | {fmt(ratios[1], '.2f')} | {s['setup_s']:.2f} |"
            )

    out += ["", "## Bars", "", "| bar | value | pass |", "|---|---|---|"]
    for text, value, passed in bars(summary, floors):
        out.append(f"| {text} | {value} | {'PASS' if passed else 'FAIL'} |")
    errors = [r for r in records if "error" in r]
    if errors:
        out += ["", "## Failed runs", ""]
        out += [
            f"- {r['workload']} {r['peer']} #{r['repeat']}: `{(r['error'].splitlines() or ['no output'])[-1]}`"
            for r in errors
        ]
    return "\n".join(out) + "\n"


def bars(summary: dict, floors: dict):
    def sps(name, peer):
        return summary.get((name, peer), {}).get("samples_per_s")

    def steady(name, peer):
        return summary.get((name, peer), {}).get("steady_samples_per_s")

    # issue 30: the whole fit, as its user times it
    for name in ("W1", "W2", "W3"):
        for peer in ("adadamp", "allreduce"):
            a, b = sps(name, peer), sps(name, "ddp")
            if a and b:
                yield f"{name}: {peer} whole fit >= 1x ddp's", f"{a / b:.2f}x", a >= b
    a, b = sps("W1", "adadamp"), sps("W1", "plain")
    if a and b:
        yield "W1: adadamp whole fit >= 0.8x plain's", f"{a / b:.2f}x", a >= 0.8 * b
    for name, peer, factor in (("W1", "ddp", 1.0), ("W3", "ddp", 1.0), ("W1", "plain", 0.7), ("W2", "ddp", 1.0)):
        a, b = steady(name, "adadamp"), steady(name, peer)
        if a and b:
            yield f"{name}: adadamp steady samples/s >= {factor:g}x {peer}", f"{a / b:.2f}x", a >= factor * b
    for name, f in floors.items():
        s = summary.get((name, "adadamp"))
        if s:
            ratio = s["bd"]["overhead"] * 1e3 / f["floor_ms"]
            yield f"{name}: per-update overhead <= 2x floor", f"{ratio:.2f}x", ratio <= 2
    a, b = summary.get(("W1", "adadamp")), summary.get(("W1", "plain"))
    if a and b:
        rel = a["final_loss"] / b["final_loss"] - 1
        yield "W1: final loss within 1% of plain", f"{100 * rel:+.2f}%", abs(rel) <= 0.01
    for name in ("W1", "W2", "W3"):  # the all-reduce backend (issue 16)
        ar, ddp, ps = (summary.get((name, p)) for p in ("allreduce", "ddp", "adadamp"))
        if ar and ddp:
            ratio = ar["steady_samples_per_s"] / ddp["steady_samples_per_s"]
            yield f"{name}: allreduce steady samples/s >= 1x ddp", f"{ratio:.2f}x", ratio >= 1.0
        if ar and ps:
            rel = ar["final_loss"] / ps["final_loss"] - 1
            yield f"{name}: allreduce final loss within 0.1% of the parameter server", f"{100 * rel:+.3f}%", abs(rel) <= 1e-3
        if ar and "received_bytes" in ar:
            got, sent = ar["received_bytes"], ar["sent_bytes"]
            yield (f"{name}: allreduce bytes the client receives per update < 4 KB (sent: {sent:,.0f}, the indices)",
                   f"{got:,.0f}", got < 4096)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    ap.add_argument("--repeats", type=int, default=None, help="runs per (workload, peer); default 3, 1 with --quick")
    ap.add_argument("--quick", action="store_true", help="tiny data sizes for a smoke test")
    ap.add_argument("--out", type=Path, default=None, help="Markdown output (default benchmarks/run/results.md)")
    ap.add_argument("--one", nargs=2, metavar=("PEER", "WORKLOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(*args.one, args.quick)), flush=True)
        return
    repeats = args.repeats or (1 if args.quick else 3)
    records = []
    for repeat in range(repeats):  # interleave peers so slow drifts of the machine hit all of them
        for name in args.workload:
            for peer in args.peers:
                rec = spawn_one(peer, name, args.quick, repeat)
                print(json.dumps(rec), flush=True)
                records.append(rec)
    text = tables(records, args.quick)
    print(text)
    out = args.out or HERE / ("results-quick.md" if args.quick else "results.md")
    out.write_text(text)
