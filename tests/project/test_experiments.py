"""Smoke versions of the experiments (the full runs are by hand, see experiments/README.md)."""

import importlib.util
import math
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batch_size_schedules_smoke(client, tmp_path):
    exp = _load("batch_size_schedules")
    result = exp.run(epochs=3, delay=1, seeds=[0], client=client)
    schedules = result["schedules"]
    assert set(schedules) == {"constant", "geodamp", "geodamp-2x", "geodamp-cap80"}
    # the geometric schedule needs fewer model updates for the same epochs
    assert schedules["geodamp"]["updates"] < schedules["constant"]["updates"]
    assert all(0 < s["final_accuracy"] <= 1 for s in schedules.values())
    report = exp.write_report(result)
    assert "| geodamp |" in report
    exp.plot(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_adascale_scaling_smoke(client):
    exp = _load("adascale_scaling")
    result = exp.run(scales=[1, 4], epochs=2, seeds=[0], client=client)
    rows = {(r["S"], r["method"]): r for r in result["rows"]}
    # S = 1: plain SGD both ways (AdaScale counts b0 examples per update, also for an epoch's short last batch)
    assert abs(rows[(1, "adascale")]["updates"] - rows[(1, "linear")]["updates"]) <= 2
    adascale = rows[(4, "adascale")]
    assert rows[(4, "linear")]["updates"] <= adascale["updates"] <= rows[(1, "adascale")]["updates"]
    assert 1.0 <= adascale["last_gain"] <= 4.0
    assert "| 4 | 64 | adascale |" in exp.write_report(result)


def test_dynamic_sgd_smoke(client):
    exp = _load("dynamic_sgd")
    result = exp.run(epochs=2, points={"early": 1}, seeds=[0], client=client)
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"fixed", "linear", "dynamic", "velocity", "decrease"}
    assert all(r["spike"] > 0 for r in rows.values())
    assert "| early (epoch 1) | dynamic |" in exp.write_report(result)



def test_seesaw_adam_smoke(client):
    exp = _load("seesaw_adam")
    result = exp.run(epochs=2, delay=1, factor=4, seeds=[0], client=client, tasks=("digits",))
    rows = {r["schedule"]: r for r in result["rows"]}
    assert set(rows) == {"adam-decay", "seesaw", "geodamp"}
    assert rows["seesaw"]["updates"] == rows["geodamp"]["updates"] < rows["adam-decay"]["updates"]
    assert rows["seesaw"]["final_batch"] == 64 and rows["adam-decay"]["final_batch"] == 16
    # lr after one step of factor 4: decay / 4, Seesaw / 2, GeoDamp unchanged
    assert [rows[k]["final_lr"] / 3e-3 for k in ("adam-decay", "seesaw", "geodamp")] == [0.25, 0.5, 1.0]
    assert all(0 < r["accuracy_mean"] <= 1 for r in rows.values())
    assert "| digits | seesaw |" in exp.write_report(result)

def test_momentum_workers_smoke(tmp_path):
    exp = _load("momentum_workers")
    momenta = [0.9, 0.99, "tang"]
    # on its own LocalCluster, which the run scales to every P
    result = exp.timed_run(lambda client: exp.run([1, 2], momenta, epochs=1, seeds=[0], client=client), 1)
    cells = {(r["setting"], r["momentum"], r["P"]): r for r in result["rows"]}
    expected = {(s, m, p) for s in ("fixed", "weak") for m in momenta for p in (1, 2)}
    assert set(cells) == expected | {("control", 0.9, p) for p in (1, 2)}
    for (_, _, p), r in cells.items():
        assert 0 < r["accuracy"] <= 1 and r["test_loss"] > 0 and not r["diverged"]
        assert r["n_workers"] == [p]  # real worker processes, one per simulated worker
    for setting in ("fixed", "weak"):
        for p in (1, 2):  # the preset is 0.9 up to 4 workers: the same run, bitwise
            tang, plain = cells[(setting, "tang", p)], cells[(setting, 0.9, p)]
            assert (tang["accuracy"], tang["test_loss"]) == (plain["accuracy"], plain["test_loss"])
    # without BatchNorm the worker count does not change the arithmetic (up to summation order)
    c1, c2 = cells[("control", 0.9, 1)], cells[("control", 0.9, 2)]
    assert abs(c1["test_loss"] - c2["test_loss"]) < 1e-3 * c1["test_loss"]
    # with BatchNorm each worker normalizes its own share, so it does
    assert cells[("fixed", 0.9, 1)]["test_loss"] != cells[("fixed", 0.9, 2)]["test_loss"]
    report = exp.save(result, tmp_path)
    assert "| 0.99 |" in report and "best (test loss)" in report
    assert all((tmp_path / f"momentum_workers.{ext}").stat().st_size > 0 for ext in ("md", "json", "png"))


def test_simulator_calibration_smoke(tmp_path):
    exp = _load("simulator_calibration")
    result = exp.timed_run(lambda client: exp.run(client, n=3000, scale=0.25), 1)
    rows = result["rows"]
    assert [r["run"] for r in rows] == [*exp.runs(), "calib (again)"]
    for r in rows:
        # the schedule expansion predicts the engine's updates and worker-updates exactly
        assert (r["updates_planned"], r["worker_updates_planned"]) == (r["updates"], r["worker_updates"])
        for key in ("predicted", "predicted_from_record", "predicted_wall", "measured", "measured_wall"):
            assert math.isfinite(r[key]) and r[key] > 0
    assert rows[1]["breakdown"]["workers"] == [1] and rows[2]["breakdown"]["workers"] == [2]
    assert result["calibration"]["us_per_example"] > 0
    report = exp.save(result, tmp_path)
    assert "| constant-1024, 2 workers |" in report
    assert all((tmp_path / f"simulator_calibration.{ext}").stat().st_size > 0 for ext in ("md", "json"))
