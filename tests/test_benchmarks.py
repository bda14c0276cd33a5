"""The benchmark report (benchmarks/run.py) from synthetic records: ratios, pairing and bars; the test
bed benchmark (benchmarks/netbed.py) in its quick settings."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.netbed import SYSTEMS
from benchmarks.run import paired_ratio, tables


def _rec(workload, peer, repeat, sps, loss=1.0):
    return {"workload": workload, "peer": peer, "repeat": repeat, "samples_per_s": sps, "updates_per_s": sps / 512,
            "final_loss": loss, "train_s": 1.0, "peak_rss_mb": 100.0}


def test_paired_ratio_pairs_by_repeat():
    plain = [_rec("W1", "plain", 0, 100.0), _rec("W1", "plain", 1, 50.0), _rec("W1", "plain", 2, 80.0)]
    peer = [_rec("W1", "x", 0, 80.0), _rec("W1", "x", 1, 45.0), _rec("W1", "x", 2, 60.0)]
    assert paired_ratio(peer, plain) == 0.8  # median of 0.8, 0.9, 0.75
    assert paired_ratio(peer, []) is None


def test_report_shows_both_ratios_and_the_plain_bar():
    # A machine slowing down between repeats: the ratio of medians and the paired ratio differ.
    records = [
        _rec("W1", "plain", 0, 100.0), _rec("W1", "adadamp", 0, 68.0),
        _rec("W1", "plain", 1, 60.0), _rec("W1", "adadamp", 1, 45.0),
        _rec("W1", "plain", 2, 90.0), _rec("W1", "adadamp", 2, 70.0),
    ]
    for r in records:
        if r["peer"] == "adadamp":
            r.update(setup_s=1.0, breakdown={k: 0.001 for k in ("compute", "comm", "aggregate", "step", "update",
                                                                 "overhead", "other")})
    text = tables(records, quick=False)
    row = next(line for line in text.splitlines() if line.startswith("| W1 | adadamp |"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[5] == "0.76" and cells[6] == "0.75"  # medians 68/90; median of 0.68, 0.75, 0.78
    assert "| W1: adadamp samples/s >= 0.7x plain | 0.76x | PASS |" in text


@pytest.mark.netbed
def test_netbed_quick_measures_every_system_and_writes_the_report(netbed_ready, tmp_path):
    """``python -m benchmarks.netbed --quick``: both backends and DDP on a bed of 2 worker hosts,
    unshaped and at 1 Gb/s, and the simulator's predictions beside them."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-m", "benchmarks.netbed", "--quick", "--out", str(tmp_path)], cwd=root,
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "netbed.json").read_text())["rows"]
    assert {(r["system"], r["rate"]) for r in rows} == {(s, r) for s in SYSTEMS for r in ("unshaped", "1gbit")}
    assert all(r["P"] == 2 and 0 < r["compute_s"] < r["update_s"] for r in rows)
    assert all(r["sent_bytes"] < 1024 for r in rows if r["system"] == "allreduce")  # issue 29, item 3
    report = (tmp_path / "netbed.md").read_text()
    assert "| 0.1M | 2 | 1 Gb/s | allreduce |" in report and "Simulator error on the shaped rows" in report


def test_heterogeneous_ratios_and_recovery_from_a_synthetic_timeline():
    """benchmarks/heterogeneous.py's arithmetic: 100 updates of 512 at 10 ms, then (slowed at 1.0 s)
    10 at 40 ms, then back to 10 ms: the ratio to an ideal of 4 of 4 speeds, the recovery time."""
    from benchmarks.heterogeneous import WARM, summarize, table, throughput

    times = [0.01 * (k + 1) for k in range(100)]
    times += [times[-1] + 0.04 * (k + 1) for k in range(10)]
    times += [times[-1] + 0.01 * (k + 1) for k in range(100)]
    examples = [512] * len(times)
    reference = throughput(times[:100], examples[:100], times[WARM - 1], times[99])
    assert abs(reference - 51200) < 1
    row = summarize(times, examples, reference, 4, slowed_at=1.0, after=4)
    assert abs(row["ratio_before"] - 1.0) < 1e-6 and 0.6 < row["ratio"] < 0.8
    assert 0.3 <= row["recovery_s"] <= 0.4 and abs(row["ratio_after_recovery"] - 1.0) < 0.05  # a 0.5 s window at 0.9x
    text = table([{"system": "ps", "shares": "speed", "case": "slowdown", **row}], 100, 1)
    assert "| ps | speed | slowdown |" in text and "| 0.4 |" in text  # the recovery, rounded
