"""The benchmark report (benchmarks/run.py) from synthetic records: ratios, pairing and bars; Goodput's
comparison's targets and table (benchmarks/goodput.py); the test
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
            "final_loss": loss, "fit_s": 1.2, "train_s": 1.0, "steady_samples_per_s": 1.2 * sps, "first_fit_s": 2.0,
            "peak_rss_mb": 100.0}


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
    assert "| W1: adadamp whole fit >= 0.8x plain's | 0.76x | FAIL |" in text
    assert "| W1: adadamp steady samples/s >= 0.7x plain | 0.76x | PASS |" in text


def test_report_headlines_the_whole_fit_and_gives_ddps_whole_script():
    records = [_rec("W1", "plain", 0, 100.0), _rec("W1", "ddp", 0, 50.0), _rec("W1", "allreduce", 0, 60.0)]
    records[1].update(start_s=3.0, init_s=0.5, data_s=0.4, script_s=9.0)
    text = tables(records, quick=False)
    row = next(line for line in text.splitlines() if line.startswith("| W1 | allreduce |"))
    assert [c.strip() for c in row.split("|")][3:6] == ["1.20", "60", "0.60"]  # whole fit s, samples/s, ratio
    assert "| W1 | 3.00 | 0.50 | 0.40 | 2.00 | 1.20 | 9.00 |" in text  # DDP: start, init, data, first, fit, script
    assert "| W1: allreduce whole fit >= 1x ddp's | 1.20x | PASS |" in text


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


def test_goodput_targets_come_from_the_constant_runs_alone():
    from benchmarks import goodput

    def run(config, family, final, curve):
        return {"task": "blobs4", "config": config, "family": family, "final_accuracy": final,
                "curve": [{"time": t, "accuracy": a, "epoch": 1.0} for t, a in curve]}

    runs = [run("constant-32", "constant", 0.8965, [(1.0, 0.8), (5.0, 0.9185)]),
            run("constant-256", "constant", 0.877, [(1.0, 0.89)]),
            run("goodput", "goodput", 0.99, [(0.5, 0.99)])]  # never sets the target
    assert goodput.target(runs, "blobs4") == pytest.approx(0.885)  # 0.8965 - 0.01, down to 0.005
    assert goodput.high_target(runs, "blobs4") == pytest.approx(0.915)
    for r in runs:
        r["time_to_target"] = next((t["time"] for t in r["curve"] if t["accuracy"] >= 0.885), None)
        r["target"], r["wall"] = 0.885, 10.0
    row = goodput.summary(runs)[2]
    assert "| 1.0 s (constant-256) |" in row and "| 0.5 s (goodput) |" in row and "| 0.50 |" in row
