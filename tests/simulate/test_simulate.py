"""Tests of the training-time simulator (``adadamp.simulate``).

Oracles: hand-computed per-update times; Holt & Sievert (2021) Table 1 update
counts and max workers (Holt & Sievert 2021, Table 1); the
paper's Table 2 orderings; calibrate() recovering the parameters that
generated a synthetic history.
"""

from __future__ import annotations

import doctest
import importlib
import math
from dataclasses import replace

import numpy as np
import pytest

from adadamp import simulate
from adadamp.simulate import (
    Calibration,
    Centralized,
    RingAllReduce,
    UpdateTrace,
    calibrate,
    from_history,
    gbit_per_s,
    predict_time,
    schedule_updates,
    update_times,
)

# --------------------------------------------------------------------------- hand-computed cases


def test_gbit_per_s():
    assert gbit_per_s(54) == 54e9 / 8
    assert gbit_per_s(800) == 1e11


def test_centralized_comm_time_by_hand():
    net = Centralized(bandwidth=1e6, latency=0.01, overhead_per_update=0.02, overhead_per_worker=0.001)
    # 0.01 + 0.02 + P * (0.001 + 2 * 1000 / 1e6)
    np.testing.assert_allclose(net.comm_time([1, 4], n_bytes=1000), [0.033, 0.042])


def test_a_full_duplex_server_pays_one_model_more_than_a_direction_not_two_per_worker():
    serial = Centralized(bandwidth=1e6, latency=0.01, overhead_per_update=0.02, overhead_per_worker=0.001)
    duplex = replace(serial, full_duplex=True)
    # 0.01 + 0.02 + P * 0.001 + (P + 1) * 1000 / 1e6: P = 1 sends, then receives, either way
    np.testing.assert_allclose(duplex.comm_time([1, 4], n_bytes=1000), [0.033, 0.034 + 0.005])
    np.testing.assert_allclose(serial.comm_time([1, 4], n_bytes=1000), [0.033, 0.042])
    # a calibration keeps the link's shape: the overheads are fitted beside (P + 1) M / bandwidth
    p = np.array([2, 2, 4, 4, 8, 8])
    compute = np.full(p.size, 0.05)
    wall = compute + replace(duplex, overhead_per_update=0.003, overhead_per_worker=0.002).comm_time(p, 400)
    cal = calibrate(UpdateTrace(p * 4, p, [0] * p.size, compute, wall), network=duplex, n_params=100)
    assert cal.network.full_duplex
    assert (cal.network.overhead_per_update, cal.network.overhead_per_worker) == pytest.approx((0.003, 0.002))


def test_ring_comm_time_by_hand():
    net = RingAllReduce(bandwidth=1e6, latency=1e-3)
    # P=4: 2 * 3/4 * 1e-3 + 2 * 3 * 1e-3; one worker sends nothing
    np.testing.assert_allclose(net.comm_time([1, 2, 4], n_bytes=1000), [0.0, 1e-3 + 2e-3, 1.5e-3 + 6e-3])


def test_update_times_by_hand():
    net = Centralized(bandwidth=1e6, latency=0.01)
    t = update_times([10, 7, 9], [4, 1, 2], time_per_example=0.1, n_params=250, network=net)
    # compute 0.1 * ceil(B/P) = 0.3, 0.7, 0.5; comm 0.01 + P * 2 * 1000 / 1e6
    np.testing.assert_allclose(t, [0.3 + 0.01 + 0.008, 0.7 + 0.01 + 0.002, 0.5 + 0.01 + 0.004])


def test_update_times_scalar_workers_and_bytes_per_param():
    net = RingAllReduce(bandwidth=100.0)
    t = update_times([4, 4], 2, time_per_example=1.0, n_params=25, network=net, bytes_per_param=2)
    np.testing.assert_allclose(t, [2.0 + 0.5, 2.0 + 0.5])  # 2 * 1/2 * 50 / 100


def test_predict_time_adds_epochs_and_rescales():
    net = Centralized(bandwidth=math.inf, overhead_per_update=0.5)
    kw = {"time_per_example": 1.0, "n_params": 0, "network": net}
    assert predict_time([4, 4, 8, 8, 2], [1, 1, 2, 2, 1], **kw) == pytest.approx(4 + 4 + 4 + 4 + 2 + 2.5)
    t = predict_time([4, 4, 8, 8, 2], [1, 1, 2, 2, 1], n_epochs=3, time_per_epoch=10, time_per_rescale=3, **kw)
    assert t == pytest.approx(20.5 + 30 + 2 * 3)
    with pytest.raises(ValueError, match="n_epochs"):
        predict_time([4], [1], time_per_epoch=1.0, **kw)


@pytest.mark.parametrize(
    "kwargs",
    [{"bandwidth": 0.0}, {"bandwidth": -1.0}, {"bandwidth": 1.0, "latency": -1e-3}],
)
def test_network_validation(kwargs):
    with pytest.raises(ValueError):
        RingAllReduce(**kwargs)
    with pytest.raises(ValueError):
        Centralized(**kwargs)
    with pytest.raises(ValueError):
        Centralized(bandwidth=1.0, overhead_per_worker=-1.0)


def test_input_validation():
    net = RingAllReduce(bandwidth=1.0)
    with pytest.raises(ValueError, match="batch_sizes"):
        update_times([0, 3], [1, 1], time_per_example=1.0, n_params=0, network=net)
    with pytest.raises(ValueError, match="n_workers"):
        update_times([3, 3], [1, 0], time_per_example=1.0, n_params=0, network=net)
    with pytest.raises(ValueError, match="entries"):
        update_times([3, 3, 3], [1, 2], time_per_example=1.0, n_params=0, network=net)
    with pytest.raises(ValueError, match="integers"):
        update_times([2.5], [1], time_per_example=1.0, n_params=0, network=net)
    with pytest.raises(ValueError, match="non-decreasing"):
        UpdateTrace([1, 1], [1, 1], [1, 0])


def test_docstring_examples():
    attempted = 0
    for name in ("network", "timing", "trace", "calibration"):
        module = importlib.import_module(f"adadamp.simulate.{name}")
        result = doctest.testmod(module, extraglobs=vars(simulate), optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, name
        attempted += result.attempted
    assert attempted > 20


# --------------------------------------------------------------------------- schedule expander

N_DATA, EPOCHS = 50_000, 200
# label: (initial, max batch, updates, max workers) -- Holt & Sievert 2021, Table 1
TABLE1 = {
    "5.1k (*2)": (256, 5120, 14_960, 40),
    "3.2k": (128, 3200, 29_480, 25),
    "16k": (128, 16_000, 29_240, 125),
    "640": (128, 640, 34_520, 5),
    "128": (128, 128, 78_200, 1),
}


def _table1(label: str) -> UpdateTrace:
    init, cap, _, _ = TABLE1[label]
    return schedule_updates(n_data=N_DATA, epochs=EPOCHS, initial=init, factor=5, delay=60, max_batch_size=cap)


@pytest.mark.parametrize("label", list(TABLE1))
def test_schedule_reproduces_table1(label):
    _, _, updates, max_workers = TABLE1[label]
    tr = _table1(label)
    assert tr.n_updates == updates
    assert int(tr.n_workers.max()) == max_workers
    assert tr.n_epochs == EPOCHS
    # every epoch is one pass over the data, the last update takes the remainder
    np.testing.assert_array_equal(np.bincount(tr.epochs, weights=tr.batch_sizes), np.full(EPOCHS, N_DATA))
    assert tr.n_examples == EPOCHS * N_DATA


def test_schedule_batch_sizes_per_epoch():
    tr = _table1("5.1k (*2)")  # 256 / 1280 / 5120 / 5120 at epochs 0 / 60 / 120 / 180
    first = {int(e): int(tr.batch_sizes[np.argmax(tr.epochs == e)]) for e in (0, 59, 60, 119, 120, 180, 199)}
    assert first == {0: 256, 59: 256, 60: 1280, 119: 1280, 120: 5120, 180: 5120, 199: 5120}
    workers = {int(e): int(tr.n_workers[np.argmax(tr.epochs == e)]) for e in (0, 60, 120)}
    assert workers == {0: 2, 60: 10, 120: 40}
    ep0 = tr.batch_sizes[tr.epochs == 0]
    assert len(ep0) == 196 and ep0[-1] == 50_000 - 195 * 256
    # the smaller last update keeps the epoch's workers
    assert set(tr.n_workers[tr.epochs == 0].tolist()) == {2}
    assert tr.n_rescales == 2


def test_schedule_options():
    tr = schedule_updates(n_data=1000, epochs=4, initial=300, factor=2, delay=1, grads_per_worker=100, max_workers=5)
    # D = 300, 600, 1200 -> capped at n_data, 2400 -> capped
    assert [int(tr.batch_sizes[tr.epochs == e][0]) for e in range(4)] == [300, 600, 1000, 1000]
    assert [int(tr.n_workers[tr.epochs == e][0]) for e in range(4)] == [3, 5, 5, 5]
    tr = schedule_updates(n_data=10, epochs=3, initial=4, factor=1, min_workers=2)
    assert tr.batch_sizes.tolist() == [4, 4, 2] * 3 and set(tr.n_workers.tolist()) == {2}
    assert schedule_updates(n_data=10, epochs=0, initial=4).n_updates == 0
    with pytest.raises(ValueError, match="factor"):
        schedule_updates(n_data=10, epochs=1, initial=4, factor=0.5)
    with pytest.raises(ValueError, match="initial"):
        schedule_updates(n_data=10, epochs=1, initial=0)


# --------------------------------------------------------------------------- Table 2 orderings

# Parameters derived in experiments/simulate_table2.py (rounded): compute from the paper's
# single-worker decentralized run (121.7 min over 200 x 50,000 examples), centralized
# overheads fitted to Table 1, paper networks for the rest.
TPE = 121.7 * 60 / (EPOCHS * N_DATA)
N_PARAMS = 2_750_000
CENTRAL = Centralized(gbit_per_s(54), latency=0.05e-6, overhead_per_update=0.0353, overhead_per_worker=0.0275)
MODERATE = RingAllReduce(gbit_per_s(54), latency=0.05e-6)
HIGH = RingAllReduce(gbit_per_s(800), latency=0.025e-6)
TABLE1_MINUTES = {"5.1k (*2)": 69.87, "3.2k": 107.17, "16k": 107.49, "640": 116.86, "128": 200.19}


@pytest.fixture(scope="module")
def table2():
    out = {}
    for label in TABLE1:
        tr = _table1(label)
        out[label] = [
            predict_time(tr.batch_sizes, tr.n_workers, time_per_example=TPE, n_params=N_PARAMS, network=net) / 60
            for net in (CENTRAL, MODERATE, HIGH)
        ]
    return out


def test_table2_row_order_in_every_column(table2):
    # paper Table 2: 5.1k (*2) < 3.2k ~ 16k < 640 < 128 in every column
    for j in range(3):
        col = {k: v[j] for k, v in table2.items()}
        assert col["5.1k (*2)"] < min(col["3.2k"], col["16k"])
        assert max(col["3.2k"], col["16k"]) < col["640"] < col["128"]
        assert abs(col["3.2k"] - col["16k"]) < 0.01 * col["3.2k"]
    # centralized: 125 workers cost more than the 4x fewer updates save (107.2 < 107.5 in the paper)
    assert table2["3.2k"][0] < table2["16k"][0]


def test_table2_column_order_in_every_row(table2):
    for label, (central, moderate, high) in table2.items():
        assert central > moderate >= high, label
    assert table2["128"][1] == pytest.approx(table2["128"][2])  # one worker: nothing to all-reduce
    assert table2["128"][1] == pytest.approx(121.7)  # the anchor the compute rate came from


def test_growing_batch_beats_constant_batch(table2):
    for j in range(3):
        assert all(table2[k][j] < table2["128"][j] for k in TABLE1 if k != "128")
    # the paper's headline: about 120 min -> 45 min decentralized; ours is at least as good
    assert table2["5.1k (*2)"][1] < 0.5 * table2["128"][1]


def test_centralized_column_matches_table1(table2):
    for label, minutes in TABLE1_MINUTES.items():
        assert table2[label][0] == pytest.approx(minutes, rel=0.05), label


def test_more_bandwidth_or_less_latency_is_never_slower():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        b = rng.integers(1, 5000, size=n)
        p = rng.integers(1, 64, size=n)
        bw1 = float(10 ** rng.uniform(6, 12))
        bw2 = bw1 * float(10 ** rng.uniform(0, 3))
        lat = float(10 ** rng.uniform(-8, -2))
        kw = {"time_per_example": float(rng.uniform(0, 1e-2)), "n_params": int(rng.integers(0, 10**8))}
        for make in (
            lambda bw, la: RingAllReduce(bw, la),
            lambda bw, la: Centralized(bw, la, overhead_per_update=0.01, overhead_per_worker=1e-3),
        ):
            slow = update_times(b, p, network=make(bw1, lat), **kw)
            fast = update_times(b, p, network=make(bw2, lat), **kw)
            assert np.all(fast <= slow * (1 + 1e-12))
            assert np.all(update_times(b, p, network=make(bw1, lat / 10), **kw) <= slow * (1 + 1e-12))


# --------------------------------------------------------------------------- history and calibration

TRUE = {"tpe": 2e-3, "c0": 0.015, "c1": 0.004, "epoch": 0.05, "rescale": 0.5}
NET = Centralized(bandwidth=1e8, latency=1e-3)  # 10,000 params: 2 * 40 KB / 1e8 = 0.8 ms per worker
N_SMALL = 10_000


def _history(trace, *, rescale_in="update", noise=0.0, seed=0):
    """A history_ as the engine records it, generated from TRUE parameters."""
    rng = np.random.default_rng(seed)
    net = Centralized(NET.bandwidth, NET.latency, overhead_per_update=TRUE["c0"], overhead_per_worker=TRUE["c1"])
    k = -(-trace.batch_sizes // trace.n_workers)
    comp = TRUE["tpe"] * k * rng.lognormal(0.0, noise, size=k.size)
    wall = comp + net.comm_time(trace.n_workers, N_SMALL * 4) * rng.lognormal(0.0, noise, size=k.size)
    changed = np.r_[False, trace.n_workers[1:] != trace.n_workers[:-1]]
    if rescale_in == "update":
        wall = wall + TRUE["rescale"] * changed
    hist = []
    for e in range(trace.n_epochs):
        idx = np.flatnonzero(trace.epochs == e)
        dur = float(wall[idx].sum()) + TRUE["epoch"]
        if rescale_in == "epoch":
            dur += TRUE["rescale"] * float(changed[idx].sum())
        updates = [
            {
                "batch_size": int(trace.batch_sizes[i]),
                "n_workers": int(trace.n_workers[i]),
                "compute_time": float(comp[i]),
                "update_time": float(wall[i]),
                "loss": 1.0,
            }
            for i in idx
        ]
        hist.append({"epoch": e + 1, "dur": dur, "updates": updates})
    return hist


def _small(initial=100, epochs=6, factor=2, delay=2):
    return schedule_updates(
        n_data=1000, epochs=epochs, initial=initial, factor=factor, delay=delay, grads_per_worker=100
    )


def test_from_history_reads_engine_records():
    tr = _small()
    hist = _history(tr)
    got = from_history(hist)
    np.testing.assert_array_equal(got.batch_sizes, tr.batch_sizes)
    np.testing.assert_array_equal(got.n_workers, tr.n_workers)
    np.testing.assert_array_equal(got.epochs, tr.epochs)
    assert got.measured_time == pytest.approx(sum(ep["dur"] for ep in hist))
    assert got.update_times.sum() == pytest.approx(sum(u["update_time"] for ep in hist for u in ep["updates"]))

    class Est:
        history_ = hist

    assert from_history(Est()).n_updates == tr.n_updates


def test_from_history_errors_and_optional_keys():
    hist = [{"updates": [{"batch_size": 8, "n_workers": 1}]}]
    tr = from_history(hist)
    assert tr.compute_times is None and tr.update_times is None and tr.epoch_times is None
    with pytest.raises(ValueError, match="no measured"):
        _ = tr.measured_time
    with pytest.raises(ValueError, match="compute and update"):
        calibrate(hist)
    with pytest.raises(ValueError, match="n_workers"):
        from_history([{"updates": [{"batch_size": 8}]}])
    with pytest.raises(ValueError, match="updates"):
        from_history([{"dur": 1.0}])
    partial = [{"updates": [{"batch_size": 8, "n_workers": 1, "update_time": 0.1}, {"batch_size": 8, "n_workers": 1}]}]
    with pytest.raises(ValueError, match="only some"):
        from_history(partial)


@pytest.mark.parametrize("rescale_in", ["update", "epoch"])
def test_calibrate_round_trip_recovers_parameters(rescale_in):
    tr = _small()  # P = 1, 2, 4 for two epochs each
    cal = calibrate(_history(tr, rescale_in=rescale_in), network=NET, n_params=N_SMALL)
    assert cal.time_per_example == pytest.approx(TRUE["tpe"], rel=1e-9)
    assert cal.network.overhead_per_update == pytest.approx(TRUE["c0"], rel=1e-9)
    assert cal.network.overhead_per_worker == pytest.approx(TRUE["c1"], rel=1e-9)
    assert cal.network.bandwidth == NET.bandwidth and cal.network.latency == NET.latency
    assert cal.time_per_epoch == pytest.approx(TRUE["epoch"], rel=1e-9)
    assert cal.time_per_rescale == pytest.approx(TRUE["rescale"], rel=1e-9)
    assert cal.n_updates == tr.n_updates
    # it reproduces the run it came from, and predicts another schedule exactly
    assert cal.predict(from_history(_history(tr, rescale_in=rescale_in))) == pytest.approx(
        from_history(_history(tr, rescale_in=rescale_in)).measured_time, rel=1e-9
    )
    other = _small(initial=50, epochs=9, factor=3, delay=3)
    assert cal.predict(other) == pytest.approx(from_history(_history(other)).measured_time, rel=1e-9)


def test_calibrate_median_method_is_exact_without_noise():
    cal = calibrate(_history(_small()), network=NET, n_params=N_SMALL, method="median")
    assert cal.time_per_example == pytest.approx(TRUE["tpe"], rel=1e-9)
    assert cal.network.overhead_per_update == pytest.approx(TRUE["c0"], rel=1e-9)
    assert cal.network.overhead_per_worker == pytest.approx(TRUE["c1"], rel=1e-9)


def test_calibrate_with_noise_predicts_another_run():
    tr = _small(epochs=12)
    hist = _history(tr, noise=0.1, seed=1)
    other = _small(initial=50, epochs=9, factor=3, delay=3)
    truth = from_history(_history(other, noise=0.1, seed=2)).measured_time
    for method in ("mean", "median"):
        cal = calibrate(hist, network=NET, n_params=N_SMALL, method=method)
        assert cal.time_per_example == pytest.approx(TRUE["tpe"], rel=0.05)
        assert cal.predict(other) == pytest.approx(truth, rel=0.1)
    # "mean" reproduces the calibration run's own total
    cal = calibrate(hist, network=NET, n_params=N_SMALL)
    assert cal.predict(from_history(hist)) == pytest.approx(from_history(hist).measured_time, rel=1e-9)


def test_calibrate_median_ignores_stragglers():
    tr = _small()
    hist = _history(tr)
    hist[0]["updates"][0]["update_time"] += 5.0  # warm-up outlier
    hist[3]["updates"][4]["compute_time"] *= 50  # straggler
    hist[3]["updates"][4]["update_time"] *= 50
    cal = calibrate(hist, network=NET, n_params=N_SMALL, method="median")
    assert cal.time_per_example == pytest.approx(TRUE["tpe"], rel=1e-9)
    assert cal.network.overhead_per_update == pytest.approx(TRUE["c0"], rel=1e-9)


def test_calibrate_defaults_fold_communication_into_overhead():
    tr = _small(factor=1)  # one worker count: no per-worker term, no rescale
    cal = calibrate(_history(tr))
    assert cal.network.bandwidth == math.inf
    assert cal.network.overhead_per_worker == 0.0 and cal.time_per_rescale == 0.0
    # everything but compute: latency + c0 + P * (c1 + 2 M / bandwidth) with P = 1
    expected = NET.latency + TRUE["c0"] + TRUE["c1"] + 2 * N_SMALL * 4 / NET.bandwidth
    assert cal.network.overhead_per_update == pytest.approx(expected, rel=1e-9)
    assert isinstance(cal, Calibration)
    with pytest.raises(ValueError, match="two or more"):
        calibrate(_history(tr), per_worker=True)
    with pytest.raises(TypeError):
        calibrate(_history(tr), network="54 Gb/s")
    with pytest.raises(ValueError, match="method"):
        calibrate(_history(tr), method="max")


def test_calibrate_fits_the_all_reduce_backends_overheads():
    """An all-reduce run: the ring's bandwidth and latency terms are subtracted, the request round
    trip and the exposed all-reduce are the fitted overheads, and another schedule is predicted."""
    ring = RingAllReduce(bandwidth=1e8, latency=1e-4)
    true = replace(ring, overhead_per_update=0.003, overhead_per_worker=0.0005)
    tr = _small()
    k = -(-tr.batch_sizes // tr.n_workers)
    comp = TRUE["tpe"] * k
    wall = comp + true.comm_time(tr.n_workers, N_SMALL * 4)
    cal = calibrate(UpdateTrace(tr.batch_sizes, tr.n_workers, tr.epochs, comp, wall), network=ring, n_params=N_SMALL)
    assert isinstance(cal.network, RingAllReduce)
    assert cal.network.overhead_per_update == pytest.approx(0.003, rel=1e-6)
    assert cal.network.overhead_per_worker == pytest.approx(0.0005, rel=1e-6)
    other = _small(initial=200, factor=1)
    k2 = -(-other.batch_sizes // other.n_workers)
    truth = float((TRUE["tpe"] * k2 + true.comm_time(other.n_workers, N_SMALL * 4)).sum())
    assert cal.predict(other) == pytest.approx(truth, rel=1e-6)


def test_calibration_predicts_other_networks():
    tr = _small()
    cal = calibrate(_history(tr), network=NET, n_params=N_SMALL)
    ring = cal.predict(tr, network=RingAllReduce(NET.bandwidth, NET.latency))
    assert ring < cal.predict(tr)


def test_simulators_count_the_updates_a_real_fit_makes(client, regression_data):
    """One loop: simulate_schedule and schedule_updates run the engine's own clock and sampler."""
    from adadamp import DaskRegressor
    from adadamp.dampers import GeoDamp, PadaDamp, simulate_schedule

    X, y = regression_data  # 256 examples
    for damper in (GeoDamp(initial=24, delay=1, factor=3), PadaDamp(initial=10, rate=2.5)):
        est = DaskRegressor(batch_size=damper, max_epochs=3, random_state=0).fit(X, y)
        real = [u["batch_size"] for row in est.history_ for u in row["updates"]]
        assert [r["batch_size"] for r in simulate_schedule(damper, n_data=len(X), max_epochs=3)] == real
    tr = schedule_updates(n_data=len(X), epochs=3, initial=24, factor=3, delay=1, grads_per_worker=64)
    geodamp = DaskRegressor(batch_size=GeoDamp(initial=24, delay=1, factor=3), max_epochs=3, random_state=0).fit(X, y)
    assert tr.batch_sizes.tolist() == [u["batch_size"] for row in geodamp.history_ for u in row["updates"]]
    assert tr.n_workers.tolist()[-1] == 4  # ceil(216 / 64): the real ClusterPolicy
