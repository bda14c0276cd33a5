"""The allocator's division as the fits sharing a cluster grow: seconds per division, and how they
grow when the fits double (1.0x per doubling: constant; 2x: linear in fits; 4x: quadratic).

Each division is :func:`adadamp.cluster.division.divide` as the scheduler's allocator runs it at every
declaration, renewal and worker event: ``F`` fits wanting 1-3 workers each (a third with
``min_workers=2``), on ``W`` live workers, each fit keeping the grant of the division before.
Writes ``benchmarks/allocator/allocator.json`` and ``benchmarks/allocator/allocator.md``.

    python -m benchmarks.allocator
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from adadamp.cluster.division import divide

HERE = Path(__file__).resolve().parent
FITS = (250, 500, 1000, 2000)
WORKERS = (4, 64)


def seconds_per_division(n_fits: int, n_workers: int, repeats: int = 3) -> float:
    rng = random.Random(0)
    workers = [f"w{i}" for i in range(n_workers)]
    wants = {f"f{i}": rng.randint(1, 3) for i in range(n_fits)}
    least = {f: (2 if i % 3 == 0 else 1) for i, f in enumerate(wants)}
    held = divide(workers, wants, {}, 4 * n_workers, least)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        held = divide(workers, wants, held, 4 * n_workers, least)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    rows = []
    for n_workers in WORKERS:
        last = None
        for n_fits in FITS:
            t = seconds_per_division(n_fits, n_workers)
            rows.append({"fits": n_fits, "workers": n_workers, "seconds": t,
                         "per_doubling": None if last is None else t / last})
            last = t
    (HERE / "allocator.json").write_text(json.dumps(rows, indent=1))
    lines = ["| fits | workers | one division (ms) | against half the fits |", "|---|---|---|---|"]
    for r in rows:
        grow = "" if r["per_doubling"] is None else f"{r['per_doubling']:.2f}x"
        lines.append(f"| {r['fits']} | {r['workers']} | {1000 * r['seconds']:.2f} | {grow} |")
    (HERE / "allocator.md").write_text(
        "# The allocator's division as fits grow\n\n`python -m benchmarks.allocator` (best of 3 divisions; "
        "2x per doubling of the fits is linear).\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
