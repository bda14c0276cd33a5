"""Smoke versions of the experiments (the full runs are by hand, see experiments/README.md)."""

import importlib.util
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


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
