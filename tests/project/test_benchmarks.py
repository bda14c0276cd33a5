"""The benchmark report (benchmarks/run/) from synthetic records: ratios, pairing and bars; Goodput's
comparison's targets and table (benchmarks/goodput/); the test
bed benchmark (benchmarks/netbed/) in its quick settings."""

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
    unshaped and at 1 Gb/s, and the simulator's predictions beside them; here with an emulated
    device's optimizer step (``--step-ms``), which every system's optimizer takes on the hosts."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.netbed", "--quick", "--step-ms", "1", "--out", str(tmp_path)],
                          cwd=root, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "netbed.json").read_text())["rows"]
    assert {(r["system"], r["rate"]) for r in rows} == {(s, r) for s in SYSTEMS for r in ("unshaped", "1gbit")}
    assert all(r["P"] == 2 and 0 < r["compute_s"] < r["update_s"] for r in rows)
    assert all(r["sent_bytes"] < 1024 for r in rows if r["system"] == "allreduce")  # issue 29, item 3
    report = (tmp_path / "netbed.md").read_text()
    assert "| 0.1M | 2 | 1 Gb/s | allreduce |" in report and "Simulator error on the shaped rows" in report
    assert "also sleeps 1 ms" in report


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
    # runs without a constant one (a piece of the benchmark run on its own): no target yet, no crash
    alone = [{**runs[2], "target": goodput.target(runs[2:], "blobs4"), "time_to_target": None}]
    assert alone[0]["target"] is None and goodput.high_target(alone, "blobs4") is None
    assert "| blobs4 | - | - |" in goodput.summary(alone)[2]


def test_time_to_target_is_measured_and_the_fit_stops_there(client):
    """benchmarks.common.accuracy_tasks (issue 32): a fit evaluated at every epoch's end stops at the
    target; an unreachable target runs every epoch and has no time to it."""
    import dataclasses

    from benchmarks.common.accuracy_tasks import TASKS, estimator, measure

    task = dataclasses.replace(TASKS["blobs4"], fixed=0.0, per_example=0.0, target=0.5, max_epochs=3)
    run = measure(task, estimator(task, batch_size=512, max_workers=1))
    assert run.epoch_at_target == 1.0 and len(run.history) == 1 and run.updates_at_target == 59
    assert 0 < run.time_to_target <= run.wall and run.final_accuracy >= 0.5
    assert run.summary()["workers"] == [1] and "estimator" not in run.summary()
    never = measure(dataclasses.replace(task, target=1.01, max_epochs=2), estimator(task, batch_size=1024, max_epochs=2))
    assert never.time_to_target is None and len(never.history) == 2 and len(never.curve) == 2


def test_time_to_accuracy_report_puts_the_ratio_beside_the_paper_and_the_simulator():
    from benchmarks.time_to_accuracy import ratios, report

    def run(key, backend, t, predicted):
        return {"key": key, "backend": backend, "repeat": 0, "time_to_target": t, "epoch_at_target": 7.0,
                "updates_at_target": 100, "workers": [1], "predicted": predicted, "from_record": predicted,
                "membership": {"waits": 0, "cold_joins": 0}, "growth": [], "curve": []}

    result = {"task": "blobs4", "about": "x", "target": 0.98, "device": {"fixed_ms": 2.0, "per_example_ms": 0.5},
              "runs": [run("constant", "parameter-server", 150.0, 165.0), run("geodamp", "parameter-server", 50.0, 60.0)],
              "labels": {"constant": "constant 32", "geodamp": "GeoDamp 64"}, "calibration": {}, "seconds": 60.0,
              "commit": "abc"}
    assert ratios(result) == [{"backend": "parameter-server", "repeat": 0, "measured": 3.0, "predicted": 2.75}]
    text = report(result)
    assert "| parameter-server | 3.00x | 2.75x | 2.87x (200 / 70 min) |" in text
    assert "| GeoDamp 64 | parameter-server | 50.0 | 7 | 100 | [1] | 60.0 (+20%) |" in text


def test_heterogeneous_ratios_and_recovery_from_a_synthetic_timeline():
    """benchmarks.heterogeneous's arithmetic: 100 updates of 512 at 10 ms, then (slowed at 1.0 s)
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


def test_kit_quick_measures_every_variant_for_both(tmp_path):
    """``python -m benchmarks.kit --quick``: each precision and the compiled module, adadamp's fit
    and plain PyTorch's loop, as ratios to fp32 in one run."""
    from benchmarks.kit import bench

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.kit", "--quick", "--out", str(tmp_path)],
                          cwd=root, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "kit.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == list(bench.VARIANTS)
    assert all(r["ours_s"] > 0 and r["plain_s"] > 0 and r["relative"] > 0 for r in rows)
    assert "| 16-mixed |" in (tmp_path / "kit.md").read_text()


def test_the_real_size_workload_runs_on_both_backends_beside_plain_pytorch(tmp_path):
    """``python -m benchmarks.run --workload W4 --quick``: the ResNet-18-size CNN (11.2M parameters)
    through plain PyTorch and both backends; the report has each one's whole fit, the training
    process's and a worker's peak memory, and both backends' per-update breakdown."""
    from benchmarks.common.workloads import WORKLOADS

    assert 11.0e6 < sum(p.numel() for p in WORKLOADS["W4"].module().parameters()) < 11.5e6
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "results.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--workload", "W4", "--peers", "plain", "adadamp",
                           "allreduce", "--quick", "--out", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert not [r for r in records if "error" in r], records
    assert all(r["worker_peak_mb"] > 100 for r in records if r["peer"] != "plain")  # a worker holds the model
    report = out.read_text()
    for peer in ("plain", "adadamp", "allreduce"):
        assert f"| W4 | {peer} |" in report
    assert "| W4 | parameter-server |" in report and "| W4 | allreduce | " in report
