"""Reproduce the structure of Holt & Sievert (2021) Table 2 with ``adadamp.simulate``.

Rows: the Table 1 batch-size schedules (WRN-16-4 on CIFAR-10, 200 epochs,
50,000 examples, 128 examples per worker).  Columns: the centralized
parameter server (what adadamp implements) and two decentralized ring
all-reduce networks, ``decentralized-moderate`` (54 Gb/s, 0.05 us) and
``decentralized-high`` (800 Gb/s, 0.025 us), all for a 2.75 M-parameter model.

Pure arithmetic (no Dask, no torch); runs in about a second::

    python experiments/simulate_table2.py

It prints the table and writes ``experiments/simulate_table2.md`` beside
this file.  How the two free numbers are derived from the paper is written
into that file.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_sim = importlib.import_module("adadamp.simulate")  # after the sys.path fix above
Centralized = _sim.Centralized
RingAllReduce = _sim.RingAllReduce
UpdateTrace = _sim.UpdateTrace
gbit_per_s = _sim.gbit_per_s
predict_time = _sim.predict_time
schedule_updates = _sim.schedule_updates

N_DATA = 50_000  # CIFAR-10 training set
EPOCHS = 200
GRADS_PER_WORKER = 128  # notes/algorithms.md §5.2
N_PARAMS = 2_750_000  # "about 2.75 million weights" (paper, "Experiments")
BYTES_PER_PARAM = 4

# label: (initial batch, max batch, paper updates, paper max workers, Table 1 minutes)
TABLE1 = {
    "5.1k (*2)": (256, 5120, 14_960, 40, 69.87),
    "3.2k": (128, 3200, 29_480, 25, 107.17),
    "16k": (128, 16_000, 29_240, 125, 107.49),
    "640": (128, 640, 34_520, 5, 116.86),
    "128": (128, 128, 78_200, 1, 200.19),
}
# label: (centralized, decentralized-moderate, decentralized-high) minutes, paper Table 2
TABLE2 = {
    "5.1k (*2)": (69.9, 45.1, 43.5),
    "3.2k": (107.2, 67.7, 65.5),
    "16k": (107.5, 67.7, 65.7),
    "640": (116.9, 73.6, 71.8),
    "128": (200.2, 121.7, 121.5),
}
COLUMNS = ("centralized", "decentralized-moderate", "decentralized-high")
LATENCY_MODERATE = 0.05e-6
MODERATE = RingAllReduce(bandwidth=gbit_per_s(54), latency=LATENCY_MODERATE)
HIGH = RingAllReduce(bandwidth=gbit_per_s(800), latency=0.025e-6)
TIE = 0.01  # paper differences below 1% are read as ties


def schedules() -> dict[str, UpdateTrace]:
    """Per-update (batch, workers) of every Table 1 row."""
    return {
        label: schedule_updates(
            n_data=N_DATA,
            epochs=EPOCHS,
            initial=init,
            factor=5,
            delay=60,
            max_batch_size=cap,
            grads_per_worker=GRADS_PER_WORKER,
        )
        for label, (init, cap, *_rest) in TABLE1.items()
    }


def minutes(trace: UpdateTrace, tpe: float, network) -> float:
    t = predict_time(
        trace.batch_sizes,
        trace.n_workers,
        time_per_example=tpe,
        n_params=N_PARAMS,
        network=network,
        bytes_per_param=BYTES_PER_PARAM,
    )
    return t / 60.0


def derive_time_per_example(traces: dict[str, UpdateTrace]) -> float:
    """Seconds per example from the single-worker run without overhead.

    The "128" row never has more than one worker.  The paper's Fig. 5 caption:
    "The point with about 80k model updates represents a single worker, so
    there's no overhead in this decentralized simulation", so its 121.7 min
    (Table 2, decentralized-moderate) are pure gradient computation over
    200 epochs x 50,000 examples.
    """
    tr = traces["128"]
    return TABLE2["128"][1] * 60.0 / tr.n_examples


def fit_centralized(traces: dict[str, UpdateTrace], tpe: float, per_worker: bool = True) -> Centralized:
    """Fit overhead_per_update (and overhead_per_worker) to Table 1's minutes.

    The model is linear in the two overheads: minutes = base + c0 * updates +
    c1 * sum(P) / 60, where base is compute plus the 54 Gb/s transfers.  Least
    squares on relative errors (each row divided by its Table 1 minutes),
    coefficients kept >= 0.
    """
    bare = Centralized(bandwidth=gbit_per_s(54), latency=LATENCY_MODERATE)
    rows, ys = [], []
    for label, tr in traces.items():
        paper = TABLE1[label][4]
        base = minutes(tr, tpe, bare)
        cols = [tr.n_updates / 60.0] + ([float(tr.n_workers.sum()) / 60.0] if per_worker else [])
        rows.append(np.array(cols) / paper)
        ys.append((paper - base) / paper)
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    coef = np.maximum(coef, 0.0)
    return replace(
        bare,
        overhead_per_update=float(coef[0]),
        overhead_per_worker=float(coef[1]) if per_worker else 0.0,
    )


def orderings(table: dict[str, tuple[float, ...]]) -> list[tuple[str, str]]:
    """Pairwise relations a < b (or a ~ b within TIE) of a results table."""
    out = []
    labels = list(table)
    for j, col in enumerate(COLUMNS):  # rows within a column
        for a in range(len(labels)):
            for b in range(a + 1, len(labels)):
                x, y = table[labels[a]][j], table[labels[b]][j]
                out.append((f"{col}: {labels[a]} vs {labels[b]}", _rel(x, y)))
    for label in labels:  # columns within a row
        v = table[label]
        for a in range(3):
            for b in range(a + 1, 3):
                out.append((f"{label}: {COLUMNS[a]} vs {COLUMNS[b]}", _rel(v[a], v[b])))
    return out


def _values(table: dict[str, tuple[float, ...]], key: str) -> tuple[float, float]:
    """The two numbers a relation name from :func:`orderings` compares."""
    head, pair = key.split(": ")
    a, b = pair.split(" vs ")
    if head in COLUMNS:
        j = COLUMNS.index(head)
        return table[a][j], table[b][j]
    return table[head][COLUMNS.index(a)], table[head][COLUMNS.index(b)]


def _sign(x: float, y: float) -> str:
    return "~" if x == y else ("<" if x < y else ">")


def _rel(x: float, y: float) -> str:
    if abs(x - y) <= TIE * max(x, y):
        return "~"
    return "<" if x < y else ">"


def main() -> str:
    traces = schedules()
    tpe = derive_time_per_example(traces)
    central = fit_centralized(traces, tpe)
    central_bw_only = fit_centralized(traces, tpe, per_worker=False)
    networks = (central, MODERATE, HIGH)
    ours = {label: tuple(minutes(tr, tpe, net) for net in networks) for label, tr in traces.items()}
    bw_only = {label: minutes(tr, tpe, central_bw_only) for label, tr in traces.items()}

    ours_rel, paper_rel = dict(orderings(ours)), dict(orderings(TABLE2))
    agree = [k for k in paper_rel if ours_rel[k] == paper_rel[k]]
    differ = [k for k in paper_rel if ours_rel[k] != paper_rel[k]]
    strict = [k for k in paper_rel if paper_rel[k] != "~"]
    strict_ok = [k for k in strict if ours_rel[k] == paper_rel[k]]
    sign_ok = [k for k in strict if _sign(*_values(ours, k)) == paper_rel[k]]

    # What per-worker cost would make a ring match the paper's decentralized columns?
    implied = []
    for j, net in ((1, MODERATE), (2, HIGH)):
        extra = np.array([TABLE2[lb][j] - ours[lb][j] for lb in traces]) * 60.0
        x = np.array([float((tr.n_workers - 1).sum()) for tr in traces.values()])
        implied.append(float(x @ extra / (x @ x)))

    lines = []
    w = lines.append
    w("# Holt & Sievert (2021) Table 2, reproduced with `adadamp.simulate`")
    w("")
    w("Generated by `python experiments/simulate_table2.py` (closed-form arithmetic; no cluster).")
    w("Training time in minutes, ours / paper. WRN-16-4 (2.75 M float32 parameters = 11 MB),")
    w("CIFAR-10 (50,000 examples), 200 epochs, 128 examples per worker, batch x5 every 60 epochs.")
    w("")
    w(
        "| Max batch | Updates (ours / paper) | Max workers | Centralized | Decentralized (moderate, 54 Gb/s)"
        " | Decentralized (high, 800 Gb/s) |"
    )
    w("|---|---|---|---|---|---|")
    for label, tr in traces.items():
        _, _, up, mw, _ = TABLE1[label]
        cells = " | ".join(f"{ours[label][j]:.1f} / {TABLE2[label][j]:.1f}" for j in range(3))
        w(f"| {label} | {tr.n_updates:,} / {up:,} | {int(tr.n_workers.max())} / {mw} | {cells} |")
    w("")
    w("## Parameters and where they come from")
    w("")
    w(f"- `time_per_example` = **{tpe * 1e3:.4f} ms**. The paper states no per-example compute time, and")
    w("  Table 1 alone cannot give one: every row runs at most 128 examples per worker, so compute per")
    w("  update is the same in every row and only (compute + fixed overhead) per update is identifiable.")
    w('  The one extra anchor: the single-worker ("128") run in the decentralized simulation, which the')
    w("  paper says has no overhead (Fig. 5 caption), took 121.7 min for 200 x 50,000 examples.")
    w("  That is the only Table 2 number used as an input; the rest of both decentralized columns is")
    w("  predicted. (Cross-check, not used: the authors' repository measures about 78 ms per")
    w("  128-example gradient on the T4, 0.61 ms/example, `adadamp-experiments`")
    w("  `exp-dask/simulation-sleep-time/Calculation.ipynb`.)")
    w("- Centralized: `Centralized(bandwidth=54 Gb/s, latency=0.05 us, overhead_per_update,")
    w("  overhead_per_worker)` (the paper: centralized uses the same network as decentralized-moderate).")
    w("  The two overheads are fitted to Table 1's five training times (least squares on relative")
    w(
        f"  error): **overhead_per_update = {central.overhead_per_update * 1e3:.1f} ms**, **overhead_per_worker ="
        f" {central.overhead_per_worker * 1e3:.1f} ms** per worker per update, on top of"
    )
    w(f"  2 x 11 MB / 54 Gb/s = {2 * N_PARAMS * BYTES_PER_PARAM / gbit_per_s(54) * 1e3:.2f} ms per worker on the wire.")
    w("  So the centralized column is a fit, not a prediction (the paper's centralized column *is* Table 1).")
    w("- Decentralized: `RingAllReduce(54 Gb/s, 0.05 us)` and `RingAllReduce(800 Gb/s, 0.025 us)`,")
    w("  per update `2 (P-1)/P * M / bandwidth + 2 (P-1) * latency` (at most 3.3 ms and 0.22 ms here).")
    w("")
    w("## Orderings")
    w("")
    w(
        f"Pairwise relations in the table (rows within each column, columns within each row; a gap under"
        f" {TIE:.0%} counts as a tie `~`): **{len(agree)} of {len(paper_rel)} agree with the paper**;"
        f" of the paper's {len(strict)} strict relations (gap over {TIE:.0%}), **{len(strict_ok)} are reproduced**"
        f" with our own 1% tie band and **{len(sign_ok)} have the same direction** without it."
    )
    w("")
    if differ:
        w("| relation | paper | ours |")
        w("|---|---|---|")
        for k in differ:
            w(f"| {k} | {paper_rel[k]} | {ours_rel[k]} |")
        w("")
    w("Reproduced: growing the batch (and the workers) beats the constant-128 run under every")
    w("architecture; 5.1k (*2) is fastest and 640 is slowest of the growing schedules; 3.2k and 16k")
    w("are within 1% of each other; decentralized beats centralized for every schedule; 800 Gb/s is")
    w("never slower than 54 Gb/s, and the two are equal for the single-worker run.")
    w("")
    w("## What does not match, honestly")
    w("")
    t1_err = [abs(ours[lb][0] - TABLE1[lb][4]) / TABLE1[lb][4] for lb in traces]
    w(f"- Centralized: the two-overhead fit reproduces Table 1 to within {max(t1_err):.0%} (worst: 5.1k (*2),")
    w("  whose first 60 epochs use 256-example batches on 2 workers). With `overhead_per_worker = 0` (bandwidth")
    bw_err = max(abs(bw_only[lb] - TABLE1[lb][4]) / TABLE1[lb][4] for lb in traces)
    w(f"  term only) the best fit is off by up to {bw_err:.0%}: at 54 Gb/s shipping 11 MB costs 3.3 ms per worker,")
    w("  while Table 1 implies tens of ms per worker per update; the paper attributes this to Dask's")
    w("  overhead (items 1, 3 and 4 of its centralized-update list: broadcast, gather, serialization and")
    w("  scheduling), which is what `overhead_per_worker` stands for.")
    dec_err = [abs(ours[lb][j] - TABLE2[lb][j]) / TABLE2[lb][j] for lb in traces for j in (1, 2)]
    w(
        f"- Decentralized: our ring model predicts much shorter growing-batch runs than the paper (off by up to"
        f" {max(dec_err):.0%}), e.g. 5.1k (*2) {ours['5.1k (*2)'][1]:.1f} vs 45.1 min at 54 Gb/s. With 128 examples"
    )
    w(
        f"  per worker, compute is {tpe * 128 * 1e3:.0f} ms per update at any batch size, and an 11 MB ring all-reduce adds"
    )
    w("  at most 3.3 ms, so our decentralized time is about (updates x 93 ms). The paper's decentralized")
    w(
        f"  columns instead imply a cost of about {implied[0] * 1e3:.0f} ms (moderate) / {implied[1] * 1e3:.0f} ms (high)"
        " per extra worker"
    )
    w("  per update beyond our model (least-squares fit of the gap on sum(P - 1)); no network with the")
    w("  stated bandwidth and latency explains that, so it most likely comes from the paper's")
    w("  sleep-based simulation running on Dask (per-task costs that remain without a parameter server).")
    w("  Our decentralized numbers are therefore a network-only lower bound; the paper's are closer to")
    w('  "ring all-reduce plus a Dask per-worker cost".')
    moderate_gap = [TABLE2[lb][1] - TABLE2[lb][2] for lb in traces]
    ours_gap = [ours[lb][1] - ours[lb][2] for lb in traces]
    per_worker_gap = [
        (TABLE2[lb][1] - TABLE2[lb][2]) * 60.0 / float(tr.n_workers.sum()) for lb, tr in traces.items() if lb != "128"
    ]
    ratios = [g / o for g, o in zip(moderate_gap, ours_gap) if o > 0]
    bw_differ = [k for k in differ if k.endswith("decentralized-moderate vs decentralized-high")]
    bw_pct = ", ".join(f"{(a - b) / a:.0%}" for a, b in (_values(TABLE2, k) for k in bw_differ))
    wire = N_PARAMS * BYTES_PER_PARAM * (1 / gbit_per_s(54) - 1 / gbit_per_s(800))
    w(
        "- Moderate vs high (the bandwidth effect): the paper's gap is "
        + ", ".join(f"{g:.1f}" for g in moderate_gap)
        + " min, ours "
        + ", ".join(f"{g:.1f}" for g in ours_gap)
        + f" min (rows in table order), {min(ratios):.0f}-{max(ratios):.0f}x smaller; {len(bw_differ)} of the paper's"
    )
    w(
        f"  moderate-vs-high differences ({bw_pct}) fall under our {TIE:.0%} tie band (the direction, 800 Gb/s"
        " faster, is the same). Per worker-update the paper's gap is"
        f" {min(per_worker_gap) * 1e3:.1f}-{max(per_worker_gap) * 1e3:.1f} ms,"
    )
    w(f"  close to one 11 MB transfer's difference between the two links ({wire * 1e3:.2f} ms): the paper's")
    w("  decentralized simulation seems to move about P x M bytes through one link per update, whereas a ring")
    w("  all-reduce moves 2 (P-1)/P x M per worker in parallel.")
    w("- 3.2k vs 16k: the paper has 3.2k marginally faster (or tied) in every column. Ours agrees for the")
    w("  centralized column (125 workers cost more per update than the 4x fewer updates save), but")
    w("  with a ring all-reduce extra workers are almost free, so 16k comes out slightly faster; the")
    w("  gap is under 1% either way and counts as a tie above.")
    w("")
    measured_column(traces, tpe, ours, w)
    w(f"Networks: centralized = {central}; moderate = {MODERATE}; high = {HIGH}.")
    text = "\n".join(lines) + "\n"
    (Path(__file__).resolve().parent / "simulate_table2.md").write_text(text)
    return text


CALIBRATION = ROOT / "benchmarks" / "allreduce" / "allreduce-calibration.json"


def measured_column(traces: dict[str, UpdateTrace], tpe: float, ours: dict, w) -> None:
    """The decentralized-moderate column with adadamp's all-reduce backend's overheads, measured.

    ``benchmarks/allreduce/allreduce-calibration.json`` (``python -m benchmarks.allreduce --part calibration``)
    holds the overheads fitted to real runs of the backend; they are added to the ideal ring.
    """
    import json

    if not CALIBRATION.exists():
        w("(No measured column: run `python -m benchmarks.allreduce --part calibration` first.)")
        w("")
        return
    cal = json.loads(CALIBRATION.read_text())
    net = replace(MODERATE, overhead_per_update=cal["overhead_per_update"],
                  overhead_per_worker=cal["overhead_per_worker"])
    w("## Measured column: adadamp's all-reduce backend")
    w("")
    w("The decentralized-moderate ring plus the per-update overheads of `backend=\"allreduce\"` measured on")
    w(f"this machine (`benchmarks/allreduce/allreduce.md`: {cal['overhead_per_update'] * 1e3:.2f} ms per update +"
      f" {cal['overhead_per_worker'] * 1e3:.2f} ms per worker, fitted with `adadamp.simulate.calibrate` to a")
    w("real run at 2 workers): what the implementation adds to the ideal ring (the client's request and reply")
    w("each update, the all-reduce the backward pass does not hide). Minutes:")
    w("")
    w("| Max batch | Ideal ring (ours) | adadamp all-reduce (measured overheads) | Paper decentralized-moderate |")
    w("|---|---|---|---|")
    for label, tr in traces.items():
        w(f"| {label} | {ours[label][1]:.1f} | {minutes(tr, tpe, net):.1f} | {TABLE2[label][1]:.1f} |")
    w("")


if __name__ == "__main__":
    print(main())
