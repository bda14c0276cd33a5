"""Update time across emulated hosts on shaped links (issue 29, item 4), beside the simulator's.

    python -m benchmarks.netbed                 # P = 2 and 4, 1M and 10M parameters, 1 Gb/s, 10 Gb/s, unshaped
    python -m benchmarks.netbed --P 2 --rates unshaped 1gbit --sizes 1M     # a piece (results are merged)
    python -m benchmarks.netbed --report        # rewrite benchmarks/netbed/netbed.md from benchmarks/netbed/netbed.json
    python -m benchmarks.netbed --quick --out DIR                           # smoke test (~30 s)
    python -m benchmarks.netbed --step-ms 2 --out DIR   # an emulated device's optimizer step (2 ms, off the CPU)

Needs what ``tests/system/netbed`` needs (Linux, root, iproute2).  For each P a test bed of ``1 + P`` hosts
(network namespaces, each with its own /dev/shm, joined through a bridge by veth links that ``tc``
tbf shapes both ways, the client's link included): the Dask scheduler on host 0, one
single-threaded worker on each of hosts 1..P, the client in this process.  On it, with the links
shaped to each rate in turn, for MLPs ``256 -> h -> h -> 10`` (``benchmarks.allreduce.MLP``):

* **parameter-server** and **allreduce**: ``DaskClassifier(backend=...)``, SGD with momentum,
  batch 64 (so communication dominates), one epoch of ``--updates`` updates; the median
  ``update_time`` of ``history_``'s updates after the first ``SKIP``.
* **ddp**: PyTorch ``DistributedDataParallel`` with gloo, one process per worker host (the same
  namespaces, started beside the idle Dask workers), the same model, optimizer and 64 / P examples
  per rank; the median time between the ends of consecutive steps on rank 0 (forward, backward
  with the all-reduce, optimizer step) after the first ``SKIP``; its compute is the slowest rank's
  median forward + backward under ``no_sync()``.

The simulator (:mod:`adadamp.simulate`): for every system, model and P, ``calibrate`` (median)
fits the compute rate and the fixed overheads to the *unshaped* run, with the rate an unshaped link
carries in that system as the bandwidth (:func:`effective_rates`, from the unshaped rows of every
model size; ``Centralized(full_duplex=True)`` for the parameter server: P + 1 models each way
through the client's link; ``RingAllReduce`` for the all-reduce backend and DDP: 2 (P - 1) / P M
per worker link); the shaped rows are then predicted at the slower of tbf's rate and that one,
nothing else changed, and compared with the measurement.
This machine's kernel has no netem, so no delay or loss is emulated (the simulator's latency terms
are zero here).  All hosts share this machine's cores: with 2 cores and P = 4 the workers compete
for CPU, so ratios within a run mean something, absolute times are not a cluster's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

from benchmarks.allreduce import bench as _ar
from benchmarks.allreduce.bench import MLP, _data
from benchmarks.common import emulated as _emulated
from benchmarks.common.emulated import EmulatedSGD

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository
PS, AR, DDP = "parameter-server", "allreduce", "ddp"
SYSTEMS = (PS, AR, DDP)
SIZES = {"1M": 920, "10M": 3050, "50M": 6950}  # hidden widths: 1.09M, 10.1M, 50.1M parameters
QUICK_SIZES = {"0.1M": 200}
RATES = ("1gbit", "10gbit", "unshaped")
BATCH = 64
SKIP = 3  # updates left out at the start of a fit (worker set-up, the first optimizer step)
DDP_PORT = 29531
#: what an unshaped veth link carries here, bytes/s (measured with a TCP stream between the bed's
#: namespaces on this machine): the client's link to a host, and one host's to another
VETH_CLIENT, VETH_HOST = 5.0e9, 2.8e9


def _n_params(hidden: int) -> int:
    return sum(t.numel() for t in MLP(hidden=hidden).parameters())


def _bed_module():
    tests = str(ROOT / "tests" / "system")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import netbed

    return netbed


# ------------------------------------------------------------------ the systems
def _record(batches, workers, compute, update) -> dict:
    """The steady updates (after ``SKIP``): medians and the per-update lists the simulator fits."""
    keep = slice(SKIP, None) if len(update) > SKIP + 1 else slice(None)
    rec = {"batch": [int(b) for b in batches[keep]], "workers": [int(w) for w in workers[keep]],
           "compute": [float(c) for c in compute[keep]], "update": [float(u) for u in update[keep]]}
    rec["update_s"], rec["compute_s"] = statistics.median(rec["update"]), statistics.median(rec["compute"])
    return rec


def _optimizer(step_s: float) -> tuple[type, dict]:
    """SGD, or with ``step_s`` an emulated device's (:class:`benchmarks.common.emulated.EmulatedSGD`: every step
    also sleeps ``step_s``, off the CPU)."""
    return (EmulatedSGD, {"step_time": step_s}) if step_s else (torch.optim.SGD, {})


def run_adadamp(client, backend: str, hidden: int, p: int, n_updates: int, step_s: float = 0.0) -> dict:
    from adadamp import DaskClassifier

    X, y = _data(BATCH * n_updates)
    optimizer, extra = _optimizer(step_s)
    est = DaskClassifier(module=MLP, module__hidden=hidden, optimizer=optimizer, optimizer__lr=0.01,
                         **{f"optimizer__{k}": v for k, v in extra.items()},
                         optimizer__momentum=0.9, batch_size=BATCH, max_epochs=1, random_state=0, client=client,
                         backend=backend, scale_cluster=False, grads_per_worker=1).fit(X, y)  # on all p workers
    ups = [u for row in est.history_ for u in row["updates"]]
    rec = _record([u["batch_size"] for u in ups], [u["n_workers"] for u in ups],
                  [u["compute_time"] for u in ups], [u["update_time"] for u in ups])
    rec["sent_bytes"] = statistics.median(u["sent_bytes"] for u in ups[SKIP:])
    rec["received_bytes"] = statistics.median(u["received_bytes"] for u in ups[SKIP:])
    if set(rec["workers"]) != {p}:
        raise RuntimeError(f"{backend}: updates ran on {set(rec['workers'])} workers, not {p}")
    return rec


def ddp_rank(rank: int, world: int, master: str, hidden: int, steps: int, out: str, step_s: float = 0.0) -> None:
    """One DDP rank (run on a worker host by :func:`run_ddp`)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{DDP_PORT}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = DistributedDataParallel(MLP(hidden=hidden))
    optimizer, extra = _optimizer(step_s)
    opt = optimizer(model.parameters(), lr=0.01, momentum=0.9, **extra)
    crit = torch.nn.CrossEntropyLoss()
    X, y = _data(BATCH * steps)
    share = BATCH // world

    def batch(i):
        lo = i * BATCH + rank * share
        return torch.from_numpy(X[lo:lo + share]), torch.from_numpy(y[lo:lo + share])

    compute = []  # forward + backward without the all-reduce
    for i in range(steps):
        xb, yb = batch(i)
        dist.barrier()
        start = time.perf_counter()
        with model.no_sync():
            crit(model(xb), yb).backward()
        compute.append(time.perf_counter() - start)
        opt.zero_grad()
    dist.barrier()
    ends = [time.perf_counter()]
    for i in range(steps):  # the steps: one all-reduce each; rank 0 times step end to step end
        xb, yb = batch(i)
        opt.zero_grad()
        crit(model(xb), yb).backward()
        opt.step()
        ends.append(time.perf_counter())
    dist.barrier()
    slowest = torch.tensor([statistics.median(compute[SKIP:] or compute)])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        update = np.diff(ends)
        rec = _record([BATCH] * steps, [world] * steps, [float(slowest)] * steps, update)
        Path(out).write_text(json.dumps(rec))
    dist.barrier()  # every rank is past its last collective: leave without gloo's teardown, which
    os._exit(0)  # sometimes aborts ("terminate called without an active exception") as ranks exit


def run_ddp(bed, hidden: int, p: int, n_updates: int, step_s: float = 0.0) -> dict:
    hosts = bed.hosts[1:1 + p]
    out = os.path.join(bed.logs, f"ddp-{hidden}-{p}.json")
    with contextlib.suppress(FileNotFoundError):
        os.remove(out)
    procs = [h.popen([sys.executable, "-m", "benchmarks.netbed", "--ddp-rank", str(r), str(p), hosts[0].address,
                      str(hidden), str(n_updates), out, str(step_s)], os.path.join(bed.logs, f"h{h.index}-ddp.log"),
                     env={"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
             for r, h in enumerate(hosts)]
    try:
        for proc in procs:
            proc.wait(timeout=300)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for h in hosts:
        h.procs = [q for q in h.procs if q not in procs]
    if any(proc.returncode for proc in procs) or not os.path.exists(out):
        logs = [Path(bed.logs, f"h{h.index}-ddp.log").read_text()[-2000:] for h in hosts]
        raise RuntimeError("DDP failed:\n" + "\n".join(logs))
    return json.loads(Path(out).read_text())


# ------------------------------------------------------------------ one bed per P
def measure(p: int, rates, sizes: dict, systems, n_updates: int, save, step_s: float = 0.0) -> None:
    """Start a bed of ``1 + p`` hosts and measure every rate x size x system on it; ``save(row)``
    after each measurement."""
    import cloudpickle
    from distributed import Client

    netbed = _bed_module()
    cloudpickle.register_pickle_by_value(_ar)  # the model's class travels to the hosts by value
    cloudpickle.register_pickle_by_value(_emulated)  # and the emulated device's optimizer
    bed = netbed.Netbed(hosts=1 + p).start()
    client = None
    try:
        address = bed.start_scheduler(bed.hosts[0])
        for host in bed.hosts[1:]:
            bed.start_worker(host, address)
        client = Client(address, set_as_default=False, timeout=60)
        client.wait_for_workers(p, timeout=120)
        for rate in rates:
            bed.shape(None if rate == "unshaped" else rate)
            for size, hidden in sizes.items():
                for system in systems:
                    start = time.perf_counter()
                    rec = run_ddp(bed, hidden, p, n_updates, step_s) if system == DDP else run_adadamp(
                        client, system, hidden, p, n_updates, step_s)
                    row = {"system": system, "size": size, "n_params": _n_params(hidden), "P": p, "rate": rate,
                           "wall_s": time.perf_counter() - start, **rec}
                    print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}), flush=True)
                    save(row)
    finally:
        if client is not None:
            client.close()
        bed.stop()


# ------------------------------------------------------------------ the simulator
def _bandwidth(rate: str, system: str) -> float:
    from adadamp.simulate import gbit_per_s

    if rate == "unshaped":
        return VETH_CLIENT if system == PS else VETH_HOST
    return gbit_per_s(float(rate.removesuffix("gbit")))


def _network(system: str, bandwidth: float):
    """The simulator's network for ``system``: the client's full-duplex link for the parameter
    server, a ring for the all-reduce backend and DDP."""
    from adadamp.simulate import Centralized, RingAllReduce

    return Centralized(bandwidth, full_duplex=True) if system == PS else RingAllReduce(bandwidth)


def _models_per_update(system: str, p: int) -> float:
    """Model-sized messages the bottleneck link carries per update, as the simulator counts them."""
    return float(_network(system, 1.0).comm_time(p, n_bytes=1.0)[0])


def effective_rates(rows: list[dict]) -> dict:
    """``(system, P) -> bytes/s`` that an unshaped link carries *in this system*: the slope of the
    unshaped rows' time beyond compute against their bytes across model sizes, capped at the veth's
    rate.  A sender also copies and serializes what it sends, on cores that P workers share here, so
    it moves bytes slower than a bare TCP stream; a shaped link is then as slow as the slower of tbf's
    rate and this one (the two stages pipeline; their costs do not add)."""
    out = {}
    for system, p in {(r["system"], r["P"]) for r in rows if r["rate"] == "unshaped"}:
        points = [(_models_per_update(system, p) * 4 * r["n_params"], r["update_s"] - r["compute_s"])
                  for r in rows if (r["system"], r["P"], r["rate"]) == (system, p, "unshaped")]
        veth = _bandwidth("unshaped", system)
        slope = np.polyfit(*zip(*points), 1)[0] if len({b for b, _ in points}) >= 2 else 0.0
        out[system, p] = min(veth, 1.0 / slope) if slope > 0 else veth
    return out


def _wire_bytes(rate: str, system: str, p: int, n_bytes: float) -> float:
    """The model's bytes ``M`` once tbf's bucket is taken off: a link idle between updates holds
    ``burst`` bytes of credit that leave at the veth's speed, so each direction of the bottleneck
    link (the client's for the parameter server: ``P M``; a worker's for a ring: ``2 (P - 1) / P M``)
    pays the rate only on the rest."""
    if rate == "unshaped":
        return n_bytes
    burst = float(_bed_module()._burst(rate))
    per_direction = p if system == PS else 2 * (p - 1) / p
    return max(0.0, per_direction * n_bytes - burst) / per_direction


def predictions(rows: list[dict]) -> dict:
    """``(system, size, P, rate) -> (predicted update s, the same with tbf's bucket taken off the
    bytes, calibrated here?)`` from the unshaped rows' calibrations (at :func:`effective_rates`)."""
    from adadamp.simulate import UpdateTrace, calibrate, update_times

    rates = effective_rates(rows)
    out = {}
    for base in (r for r in rows if r["rate"] == "unshaped"):
        system, p = base["system"], base["P"]
        net = _network(system, rates[system, p])
        trace = UpdateTrace(base["batch"], base["workers"], [0] * len(base["batch"]), base["compute"], base["update"])
        cal = calibrate(trace, network=net, n_params=base["n_params"], method="median")
        for r in rows:
            if (r["system"], r["size"], r["P"]) != (system, base["size"], p):
                continue
            rate = min(_bandwidth(r["rate"], system), rates[system, p])
            shaped = dataclasses.replace(cal.network, bandwidth=rate)
            bucket = r["rate"] != "unshaped" and rate < rates[system, p]  # tbf's credit helps only where tbf is the limit
            n_bytes = 4 * r["n_params"]
            pred = [float(update_times([BATCH], [p], time_per_example=cal.time_per_example, n_params=n,
                                       network=shaped, bytes_per_param=1)[0])
                    for n in (n_bytes, _wire_bytes(r["rate"], system, p, n_bytes) if bucket else n_bytes)]
            out[system, r["size"], p, r["rate"]] = (*pred, r["rate"] == "unshaped")
    return out


# ------------------------------------------------------------------ report
def _label(rate: str) -> str:
    return "unshaped" if rate == "unshaped" else f"{rate.removesuffix('gbit')} Gb/s"


def _ratios(rows: list[dict]) -> dict:
    """``(size, P, rate) -> (allreduce / parameter server, allreduce / DDP)`` update times."""
    ix = {(r["system"], r["size"], r["P"], r["rate"]): r["update_s"] for r in rows}
    return {k[1:]: (v / ix.get((PS, *k[1:]), math.nan), v / ix.get((DDP, *k[1:]), math.nan))
            for k, v in ix.items() if k[0] == AR}


def _measured(rows: list[dict]) -> str:
    """How many updates each row's median is over (the updates after ``SKIP``), by count."""
    by: dict[int, set] = {}
    for r in rows:
        by.setdefault(len(r["update"]), set()).add((r["n_params"], r["size"], r["system"]))
    if len(by) == 1:
        return f"{next(iter(by))} measured per fit"
    common = max(by, key=lambda n: len(by[n]))
    rest = "; ".join(f"{n} for " + ", ".join(f"{size} {system}" for _, size, system in sorted(by[n]))
                     for n in sorted(by) if n != common)
    return f"{common} measured per fit ({rest})"


def report(results: dict, repeat: dict | None = None) -> str:
    rows = results["rows"]
    pred = predictions(rows)
    meta = results.get("meta", {})
    lines = ["# Update time across emulated hosts on shaped links", "",
             (f"{meta.get('when', '?')}, {meta.get('machine', '?')}. `python -m benchmarks.netbed` (see its "
              "docstring). Scheduler on host 0, one single-threaded worker on each of P other hosts (network "
              "namespaces, own /dev/shm, so no shared memory), the client in the root namespace on its own link; "
              f"every link tbf-shaped both ways. Batch {BATCH} (64 / P per worker), SGD with momentum"
              + (f" (an emulated device's step: every optimizer step of every system also sleeps {meta['step_ms']:g} ms, "
                 f"off the CPU, `--step-ms {meta['step_ms']:g}`)" if meta.get("step_ms") else "") + "; median update "
              f"after the first {SKIP}, {_measured(rows)}. **All hosts share this machine's CPU cores**: ratios within a row mean "
              "something, absolute times are not a cluster's (at P = 4 and 8, four and eight workers share 2 cores). No delay or loss "
              "(no netem in this kernel)."), "",
             ("Predicted: `adadamp.simulate` calibrated (`calibrate(..., method=\"median\")`) on the unshaped run of "
              "the same system, model and P (`Centralized(full_duplex=True)` for the parameter server, "
              "`RingAllReduce` for the others), with the rate an unshaped link carries in that system as its "
              "bandwidth (below); a shaped row is predicted at the slower of tbf's rate and that one, nothing else "
              "changed. Error = |pred - meas| / meas (`cal.`: the calibration point itself). "
              "Last two columns: this row's update time over the parameter server's and DDP's."), "",
             ("| params | P | link | system | update ms | compute ms | predicted ms (error) | with tbf's bucket ms "
              "(error) | / parameter server | / DDP |"), "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    order = {s: i for i, s in enumerate(SYSTEMS)}
    rate_order = {r: i for i, r in enumerate(RATES)}
    index = {(r["system"], r["size"], r["P"], r["rate"]): r for r in rows}
    errors: tuple[list, list] = ([], [])
    for r in sorted(rows, key=lambda r: (r["n_params"], r["P"], rate_order.get(r["rate"], 9), order[r["system"]])):
        k = (r["system"], r["size"], r["P"], r["rate"])
        cells = []
        for i in (0, 1):
            if k not in pred:
                cells.append("")
                continue
            err = abs(pred[k][i] - r["update_s"]) / r["update_s"]
            if not pred[k][2]:
                errors[i].append(err)
            cells.append(f"{1e3 * pred[k][i]:.1f} ({'cal.' if pred[k][2] else f'{err:.0%}'})")
        for other in (PS, DDP):
            o = index.get((other, r["size"], r["P"], r["rate"]))
            cells.append("" if o is None or other == r["system"] else f"{r['update_s'] / o['update_s']:.2f}")
        lines.append(f"| {r['n_params'] / 1e6:.1f}M | {r['P']} | {_label(r['rate'])} | {r['system']} | "
                     f"{1e3 * r['update_s']:.1f} | {1e3 * r['compute_s']:.1f} | " + " | ".join(cells) + " |")
    if errors[0]:
        lines += ["", (f"Simulator error on the shaped rows ({len(errors[0])} predictions): median "
                       f"{statistics.median(errors[0]):.0%}, max {max(errors[0]):.0%}; with tbf's bucket taken off "
                       f"the bytes: median {statistics.median(errors[1]):.0%}, max {max(errors[1]):.0%}."), "",
                  ("tbf lets a bucket of 4 ms at the rate (at least 64 KiB: 500 KB at 1 Gb/s, 5 MB at 10 Gb/s) leave "
                   "at the veth's speed after an idle spell, which a real link does not: at 10 Gb/s a 1M model's "
                   "4.4 MB fits in it, so those rows are close to unshaped. The second prediction takes the bucket "
                   "off the bytes each direction of the bottleneck link carries per update, where tbf is the "
                   "slower stage."), "",
                  ("The rate an unshaped link carries in a system (`effective_rates`): the slope of the unshaped rows' "
                   "time beyond compute against their bytes across the model sizes, capped at the veth's rate "
                   f"({VETH_CLIENT / 1e9:.1f} GB/s client link, {VETH_HOST / 1e9:.1f} GB/s host to host, a bare TCP "
                   "stream): the senders copy and serialize on the cores the P workers share, so they move bytes "
                   "slower than a bare stream, and a shaped link is as slow as the slower stage (the two pipeline; "
                   "their costs do not add). GB/s: " + ", ".join(
                       f"{s} P = {p}: {v / 1e9:.2f}" for (s, p), v in sorted(effective_rates(rows).items())) + ".")]
        lines.append("")
        for system in SYSTEMS:
            errs = [abs(v[1] - index[k]["update_s"]) / index[k]["update_s"] for k, v in pred.items()
                    if not v[2] and k[0] == system]
            if errs:
                lines.append(f"- {system}: median error {statistics.median(errs):.0%}, max {max(errs):.0%}, "
                             f"{sum(e <= 0.15 for e in errs)} of {len(errs)} within 15% (with the bucket).")
    lines += ["", ("The compute column is each system's own: the parameter server's slowest worker's gradient; the "
                   "all-reduce backend's slowest member's loading, the optimizer step it owed and its forward and "
                   "backward with the bucketed all-reduce the backward pass overlaps; DDP's slowest rank's forward "
                   "and backward under `no_sync()`. The parameter server's client reads the first workers' "
                   "gradients while it still writes the last workers' weights, so its link carries P + 1 models "
                   "a direction per update, not 2 P (the paper's `Centralized` model, the default). At P = 8 eight "
                   "single-threaded workers share 2 cores: compute grows with P here, which it would not on a "
                   "cluster.")]
    sent = sorted({(r["P"], int(r["sent_bytes"]), int(r["received_bytes"])) for r in rows if r["system"] == AR})
    if sent:
        lines += ["", "The all-reduce backend's client, bytes per update (sent / received, every model size and link): "
                  + ", ".join(f"P = {p}: {a} / {b}" for p, a, b in sent) + "."]
    if repeat:
        first, again = _ratios(rows), _ratios(repeat["rows"])
        lines += ["", "## A second run", "", ("Some settings run again (`netbed-repeat.json`, same machine, minutes "
                                              "later): the all-reduce backend's update time over the parameter "
                                              "server's and over DDP's, both runs."), "",
                  "| params | P | link | / parameter server | / DDP | first run: / parameter server | / DDP |",
                  "|---:|---:|---|---:|---:|---:|---:|"]
        for k in sorted(again, key=lambda k: (SIZES.get(k[0], 0), k[1], RATES.index(k[2]))):
            if k in first:
                lines.append(f"| {k[0]} | {k[1]} | {_label(k[2])} | {again[k][0]:.2f} | {again[k][1]:.2f} | "
                             f"{first[k][0]:.2f} | {first[k][1]:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one small model, P = 2, unshaped and 1 Gb/s, few updates")
    ap.add_argument("--P", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--rates", nargs="*", default=list(RATES), choices=RATES)
    ap.add_argument("--sizes", nargs="*", default=["1M", "10M"], choices=list(SIZES))
    ap.add_argument("--systems", nargs="*", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--updates", type=int, default=12, help=f"updates per fit (the first {SKIP} are left out)")
    ap.add_argument("--out", type=Path, default=HERE, help="where netbed.json and netbed.md go")
    ap.add_argument("--report", action="store_true", help="only rewrite the Markdown from the JSON")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="an emulated device's optimizer step: every step of every system also sleeps this long")
    ap.add_argument("--ddp-rank", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ddp_rank:
        rank, world, master, hidden, steps, out, step_s = args.ddp_rank
        ddp_rank(int(rank), int(world), master, int(hidden), int(steps), out, float(step_s))
        return
    torch.set_num_threads(1)
    sizes = QUICK_SIZES if args.quick else {s: SIZES[s] for s in args.sizes}
    P, rates, n_updates = ([2], ["unshaped", "1gbit"], 6) if args.quick else (args.P, args.rates, args.updates)
    args.out.mkdir(parents=True, exist_ok=True)
    raw, md = args.out / "netbed.json", args.out / "netbed.md"
    results = json.loads(raw.read_text()) if raw.exists() else {"rows": []}

    def save(row):
        results["rows"] = [r for r in results["rows"]
                           if (r["system"], r["size"], r["P"], r["rate"]) != (row["system"], row["size"], row["P"], row["rate"])]
        results["rows"].append(row)
        results["meta"] = {"when": time.strftime("%Y-%m-%d"), "machine": (
            f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}"), "step_ms": args.step_ms}
        raw.write_text(json.dumps(results, indent=1) + "\n")

    if not args.report:
        for p in P:
            measure(p, rates, sizes, args.systems, n_updates, save, args.step_ms / 1e3)
    again = args.out / "netbed-repeat.json"
    text = report(results, json.loads(again.read_text()) if again.exists() else None)
    md.write_text(text)
    print(text)
