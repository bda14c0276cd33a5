"""Goodput (issue 32): oracles for its noise-scale, efficiency, throughput and goodput arithmetic
(hand-computed, no cluster), its damped choice driven without a cluster, and one fit on a real
LocalCluster that grows the batch and the workers as the noise scale grows."""

import itertools
import logging
import math
import time

import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from sklearn.base import clone

from adadamp import Callback, DaskRegressor
from adadamp import checkpoint as ckpt
from adadamp.dampers import Goodput, GradStats, ThroughputModel, TrainState, goodput
from adadamp.dampers.goodput import (
    MIN_ESTIMATES,
    MIN_SAMPLES,
    anneal_factor,
    cooldown_factor,
    efficiency,
    noise_scale,
)
from adadamp.exceptions import StopTraining
from adadamp.records import UpdateRecord

# --------------------------------------------------------------------------- arithmetic oracles


def test_noise_scale_of_chunk_statistics():
    # Two chunks of 1 and 3 examples with gradient sums [2, 0] and [0, 6]: g_bar = [0.5, 1.5],
    # ||g_bar||^2 = 2.5, Q = 4/1 + 36/3 = 16, so sigma^2 = (16 - 4 * 2.5) / 1 = 6 and
    # mu^2 = 2.5 - 6 / 4 = 1: B_noise = 6.
    d = Goodput(initial=1, smoothing=0.9).reset(n_data=100)
    state = TrainState(0, 0, 0.0, 100, 1)
    for _ in range(MIN_ESTIMATES - 1):
        d.plan_update(state, 4, GradStats(4, 2.5, 16.0, 2))
    assert math.isnan(d.noise_scale_)  # not trusted before MIN_ESTIMATES estimates
    d.plan_update(state, 4, GradStats(4, 2.5, 16.0, 2))
    assert d.noise_scale_ == pytest.approx(6.0, rel=1e-12)  # the moving average of a constant
    assert noise_scale(6.0, 1.0) == 6.0
    assert noise_scale(4.0, -2.0) == math.inf  # no signal left: all noise
    assert noise_scale(0.0, 1.0) == 0.0


def test_efficiency_is_pollux_form():
    # E(B) = (B_noise + B0) / (B_noise + B)
    assert efficiency(64, noise=6.0, base=32) == pytest.approx(38 / 70, rel=1e-15)
    assert efficiency(32, noise=6.0, base=32) == 1.0
    assert efficiency(64, noise=200.0, base=32) == pytest.approx(232 / 264, rel=1e-15)
    assert efficiency(256, noise=0.0, base=32) == pytest.approx(32 / 256)  # gradient-dominated: 1 / S
    np.testing.assert_array_equal(efficiency(np.array([32, 512]), math.inf, 32), [1.0, 1.0])
    # It is AdaScale's gain over the scale: r = (v + m) / (v / S + m), v = sigma^2 / B0, m = mu^2.
    from adadamp.dampers import AdaScale

    r = float(AdaScale.gain_ratio(grad_var=6.0 / 32, grad_sqr=1.0, scale=2))
    assert r / 2 == pytest.approx(efficiency(64, noise=6.0, base=32), rel=1e-12)


def test_anneal_factor_is_mccandlish_best_step_at_a_fixed_eps_max():
    # eps_opt(B) = eps_max / (1 + B_noise / B) (McCandlish et al. 2018, eq. 2.6); lr_0 the best
    # step at B0 = 32 where B_noise was least (100): eps_max = lr_0 (1 + 100 / 32).  At B_noise
    # = 600 the best step at B0 is eps_max / (1 + 600 / 32) = lr_0 * 132 / 632.
    assert anneal_factor(600.0, least=100.0, base=32) == pytest.approx(132 / 632, rel=1e-15)
    assert anneal_factor(100.0, least=100.0, base=32) == 1.0
    assert anneal_factor(50.0, least=100.0, base=32) == 1.0  # never above AdaScale's rule
    assert anneal_factor(math.inf, least=100.0, base=32) == 1.0  # no signal seen: unknown
    assert anneal_factor(600.0, least=math.inf, base=32) == 1.0  # no estimate yet
    # Times AdaScale's gain at B = 256 it is the best step there, relative to lr_0:
    # eps_opt(256) / lr_0 = (1 + 100/32) / (1 + 600/256).
    from adadamp.dampers import AdaScale

    r = float(AdaScale.gain_ratio(grad_var=600.0 / 32, grad_sqr=1.0, scale=8))
    assert r * anneal_factor(600.0, 100.0, 32) == pytest.approx((1 + 100 / 32) / (1 + 600 / 256), rel=1e-12)


def test_learning_rate_decays_as_the_noise_scale_grows():
    # B0 = 2, batches of 4 (S = 2) in two chunks.  First sigma^2 = 6, mu^2 = 1 (B_noise = 6; from
    # g = 2.5, Q = 16), then sigma^2 = 6, mu^2 = 0.5 (B_noise = 12; g = 2.0, Q = Q - N g ... = 14).
    # A tiny smoothing keeps the last estimate.  Gains (v = sigma^2 / B0 = 3): (3 + 1) / (1.5 + 1)
    # = 1.6, then (3 + 0.5) / (1.5 + 0.5) = 1.75; the decay (2 + 6) / (2 + 12) = 4 / 7, so the
    # learning rate is 1.75 * 4 / 7 = 1.0 lr_0: McCandlish's eps_opt(4) = eps_max / (1 + 12 / 4)
    # with eps_max = lr_0 (1 + 6 / 2).
    state = TrainState(0, 0, 0.0, 100, 1)
    first, later = GradStats(4, 2.5, 16.0, 2), GradStats(4, 2.0, 14.0, 2)
    for anneal, expected in ((True, 1.0), (False, 1.75)):
        d = Goodput(initial=2, smoothing=1e-12, anneal=anneal).reset(n_data=100)
        for _ in range(MIN_ESTIMATES):
            plan = d.plan_update(state, 4, first)
        assert d.noise_scale_ == pytest.approx(6.0) and plan.lr_factor == pytest.approx(1.6)
        plan = d.plan_update(state, 4, later)
        assert d.noise_scale_ == pytest.approx(12.0) and d.scaler_.gain_ == pytest.approx(1.75)
        assert plan.lr_factor == pytest.approx(expected, rel=1e-9), anneal
        assert d.explain()["decay"] == pytest.approx(4 / 7 if anneal else 1.0)
    # The noise scale falling back does not raise the learning rate above AdaScale's.
    d.set_params(anneal=True).reset(100)
    for stats in [first] * MIN_ESTIMATES + [later, first]:
        plan = d.plan_update(state, 4, stats)
    assert plan.lr_factor == pytest.approx(1.6) and d.least_noise_ == pytest.approx(6.0)


def test_throughput_model_recovers_the_terms():
    a, b, c, d = 0.002, 0.0001, 0.003, 0.0005  # s: fixed compute, per example, fixed rest, per extra worker
    configs = [(32, 1), (64, 2), (64, 1), (128, 4)]
    compute = [a + b * math.ceil(B / W) for B, W in configs]  # 0.0052, 0.0052, 0.0084, 0.0052
    other = [c + d * (W - 1) for _, W in configs]  # 0.003, 0.0035, 0.003, 0.0045
    m = ThroughputModel.fit(*zip(*configs), compute, other)
    assert (m.compute_fixed, m.compute_per_example, m.other_fixed, m.other_per_worker) == pytest.approx(
        (a, b, c, d), rel=1e-9)
    assert float(m.update_time(64, 2)) == pytest.approx(0.0087)  # 2 + 3.2 + 3 + 0.5 ms
    assert float(m.throughput(64, 2)) == pytest.approx(64 / 0.0087)


def test_throughput_model_medians_ignore_a_straggler():
    compute = [0.0052, 0.0052, 0.5, 0.0084, 0.0084]  # one update 100x slower
    m = ThroughputModel.fit([32, 32, 32, 64, 64], [1] * 5, compute, [0.001] * 5)
    assert (m.compute_fixed, m.compute_per_example) == pytest.approx((0.002, 0.0001), rel=1e-9)


def test_throughput_model_is_optimistic_where_it_cannot_tell():
    # One setting seen: half the compute fixed, half per example; workers cost nothing extra.
    m = ThroughputModel.fit([32, 32], [1, 1], [0.004, 0.004], [0.001, 0.002])
    assert (m.compute_fixed, m.compute_per_example) == pytest.approx((0.002, 0.002 / 32))
    assert (m.other_fixed, m.other_per_worker) == (0.0015, 0.0)
    assert float(m.update_time(64, 2)) == pytest.approx(0.002 + 0.002 + 0.0015)


def test_shares_too_close_to_tell_keep_the_cost_per_example():
    # A batch grown with its workers (32/1 .. 216/8, shares 27-32, measured on emulated devices of
    # 2 ms + 0.2 ms per example): the compute times differ by noise, not by share.  A slope fitted
    # there was 0 and made 432 examples on 4 workers look as fast as 216 on 8 (measured: 30 ms
    # against 13); the optimistic split keeps a cost per example.
    rows = [(32, 1, 0.0103, 0.0015)] * 9 + [(64, 2, 0.0101, 0.0016)] * 3 + [(108, 4, 0.0104, 0.0018)] * 3 + [
        (216, 8, 0.0121, 0.0022)] * 3
    m = ThroughputModel.fit(*zip(*rows))
    median = 0.0103  # of the compute times; the median share is 32
    assert (m.compute_fixed, m.compute_per_example) == pytest.approx((median / 2, median / 2 / 32))
    assert float(m.update_time(432, 4)) > 1.5 * float(m.update_time(216, 8))
    d = Goodput().reset(n_data=16_000)
    assert d.best(m, noise=168.0, batch_size=216, n_workers=8, budget=8) == (216, 8)
    assert d.best(m, noise=340.0, batch_size=216, n_workers=8, budget=8) == (363, 8)  # the batch grows on 8
    # shares a factor SHARE_SPREAD apart are fitted: the terms come back
    m = ThroughputModel.fit([32, 48], [1, 1], [0.002 + 0.0001 * 32, 0.002 + 0.0001 * 48], [0.001, 0.001])
    assert (m.compute_fixed, m.compute_per_example) == pytest.approx((0.002, 0.0001), rel=1e-9)


def test_goodput_arithmetic_and_the_best_choice():
    # Hand-computed: T(B, W) = 2 ms + 0.1 ms ceil(B / W) + 1 ms + 0.5 ms (W - 1), B_noise = 200, B0 = 32.
    model = ThroughputModel(0.002, 0.0001, 0.001, 0.0005)
    table = {  # (B, W): examples/s x efficiency
        (32, 1): 32 / 0.0062 * 1.0,  # 5161.3
        (64, 1): 64 / 0.0094 * 232 / 264,  # 5983.2
        (45, 2): 45 / 0.0058 * 232 / 245,  # 7346.9
        (54, 2): 54 / 0.0062 * 232 / 254,  # 7955.3
        (64, 2): 64 / 0.0067 * 232 / 264,  # 8394.4
    }
    for (B, W), expected in table.items():
        got = float(model.throughput(B, W)) * efficiency(B, 200.0, 32)
        assert got == pytest.approx(expected, rel=1e-12), (B, W)
    d = Goodput(initial=32, max_factor=2).reset(n_data=10_000)
    assert d.best(model, noise=200.0, batch_size=32, n_workers=1, budget=8) == (64, 2)  # the table's best
    # Budget of one worker: the batch alone; 64 on 1 (5983) beats 32 on 1 (5161).
    assert d.best(model, noise=200.0, batch_size=32, n_workers=1, budget=1) == (64, 1)
    # Gradient-dominated (B_noise = 0): goodput = 32 / T, so the smallest update wins; a second
    # worker saves 1.6 ms of compute at 32 examples and costs 0.5 ms: (32, 2).
    assert d.best(model, noise=0.0, batch_size=32, n_workers=1, budget=8) == (32, 2)


def test_candidates_are_bounded_by_the_factor_the_cap_and_the_budget():
    d = Goodput(initial=32, max_factor=2, max_batch_size=100).reset(n_data=10_000)
    batches, workers = d._candidates(64, 4, budget=6)
    assert batches.min() == 32 and batches.max() == 100  # 64 / 2 .. min(64 * 2, cap)
    assert workers.tolist() == [2, 3, 4, 5, 6]  # 4 / 2 .. min(4 * 2, budget)
    free = ThroughputModel(0.0, 0.001, 0.0, 0.0)  # only the share counts: as many workers as allowed
    assert d.best(free, math.inf, 64, 4, budget=6)[1] == 6


# --------------------------------------------------------------------------- the damped choice, driven


def _record(batch, workers, compute, other):
    return UpdateRecord(batch, 0.1, workers, 1.0, compute, other, 0.0, 0.0, 0.0, compute + other)


def _drive(d, n_updates, stats, timing, budget=8, arrive=True, n_data=100_000, warm=False, end=None):
    """Run ``d`` as the engine does for ``n_updates`` updates on a cluster whose workers arrive
    when asked for (``arrive``) or never, or are all running from the start (``warm``); returns
    (batch, workers) per update.  ``end``: a ``fit`` of that many epochs, the updates spread evenly
    over them (else ``partial_fit`` calls in epoch 0)."""
    d.reset(n_data)
    live, seen = 1, []
    for t in range(n_updates):
        epoch = 0.0 if end is None else end * t / n_updates
        state = TrainState(t, 0, epoch, n_data, live, max_workers=budget, available_workers=budget if warm else None,
                           end_epoch=end)
        batch = d.next_batch_size(state)
        workers = d.workers_for(batch) or 1
        if arrive:  # the cluster was asked for the coming batch's workers
            live = max(live, workers, d.workers_for(d.forecast_batch_size(1.0)) or 1)
        d.plan_update(state, batch, stats(batch, workers))
        d.observe(_record(batch, workers, *timing(batch, workers)))
        seen.append((batch, workers))
    return seen


def _pure_noise(batch, workers):
    return GradStats(batch, 0.0, 4.0 * workers, 2 * workers)  # ||g||^2 = 0: B_noise = inf


def _no_noise(batch, workers):
    return GradStats(batch, 1.0, float(batch), 2 * workers)  # every chunk the same gradient: B_noise = 0


def _device(batch, workers):
    return 0.001 + 0.0001 * math.ceil(batch / workers), 0.001 + 0.0003 * (workers - 1)


def _changes(seen):
    return [(t, bw) for t, bw in enumerate(seen) if t == 0 or bw != seen[t - 1]]


def test_all_noise_grows_batch_and_workers_by_bounded_steps():
    seen = _drive(Goodput(initial=32, interval=10), 120, _pure_noise, _device)
    changes = _changes(seen)
    grown = [bw for (_, bw), (_, before) in zip(changes[1:], changes) if bw[1] > before[1]]
    assert grown[:3] == [(64, 2), (128, 4), (256, 8)]  # more workers: each time a doubling of both
    for (_, (b0, w0)), (_, (b1, w1)) in itertools.pairwise(changes):
        assert b1 <= 2 * b0 and w1 <= 2 * w0  # max_factor
    # Evaluated every 10 updates; a change asked for more workers is made when they come (here,
    # the next update) after a smaller batch on the workers there meanwhile: <= 2 per interval.
    assert len([t for t, _ in changes if 0 < t <= 60]) <= 12
    assert max(w for _, w in seen) == 8  # the budget


def test_growth_at_the_factor_bound_is_rechecked_as_soon_as_measured():
    # All noise on a warm cluster, interval 50: each step doubles the workers (the most
    # max_factor allows), so the next look comes once the step is measured (MIN_SAMPLES updates
    # after the one that moved the data), not 50 updates on.  Before, (64, 2) came at update 50.
    seen = _drive(Goodput(initial=32, interval=50), 40, _pure_noise, _device, warm=True)
    changes = _changes(seen)
    workers = [(t, bw) for (t, bw), (_, before) in zip(changes[1:], changes) if bw[1] != before[1]]
    assert [bw for _, bw in workers] == [(64, 2), (128, 4), (256, 8)]
    assert workers[0][0] == MIN_ESTIMATES  # the first look: once the noise scale is trusted
    steps = [t1 - t0 for (t0, _), (t1, _) in itertools.pairwise(workers)]
    assert steps == [MIN_SAMPLES + 1] * 2
    # At the budget the batch alone grows while each step is at the bound, then the interval holds.
    d = Goodput(initial=32, interval=50, max_batch_size=512)
    seen = _drive(d, 120, _pure_noise, _device, warm=True)
    assert seen[-1] == (512, 8) and not d.exploring_
    assert max(t for t, _ in _changes(seen)) < 40


def test_no_noise_keeps_the_initial_batch():
    seen = _drive(Goodput(initial=32, interval=10), 80, _no_noise, _device)
    # A larger batch only wastes examples; a second worker halves the compute, and the workers
    # it asks for are named by a batch one example larger (the engine asks by batch size).
    assert {b for b, _ in seen} <= {32, 33} and seen[-1][1] > 1


def test_hysteresis_keeps_a_choice_within_the_threshold():
    # 1 ms of compute and 5 ms of the rest per update.  Seen on one worker only, half the compute
    # is taken as per example (optimistic): a second worker would save 0.25 ms of 6 ms, 4.3%,
    # under the 5% threshold, so nothing changes.
    def timing(batch, workers):
        return 0.001, 0.005 + 0.0005 * (workers - 1)

    d = Goodput(initial=32, interval=10, threshold=0.05)
    assert set(_drive(d, 60, _no_noise, timing)) == {(32, 1)}
    seen = _drive(clone(d).set_params(threshold=0.0), 60, _no_noise, timing)
    assert (33, 2) in seen  # without hysteresis it takes the small predicted gain ...
    assert seen[-1] == (32, 1)  # ... and, having measured that it was none, goes back


def test_more_workers_are_asked_for_before_the_batch_changes(monkeypatch):
    d = Goodput(initial=32, interval=10)
    seen = _drive(d, 10, _pure_noise, _device, arrive=False)
    assert d.forecast_batch_size(1.0) == 32 and set(seen) == {(32, 1)}
    # At update 10 it plans (64, 2): the engine asks for 2 workers for the coming batch ...
    seen = _drive(d, 11, _pure_noise, _device, arrive=False)
    assert d.planned_ == (64, 2) and d.forecast_batch_size(1.0) == 64 and d.workers_for(64) == 2
    # ... while it trains on the one worker there with the best smaller batch (54 of 32..63),
    assert seen[10] == (54, 1) and d.workers_for(54) == 1
    # and changes once they are there ...
    seen = _drive(d, 25, _pure_noise, _device, arrive=True)
    assert seen[10] == (54, 1) and seen[11] == (64, 2)
    # ... or after WORKER_WAIT seconds of training without them: 7 updates of 7.4 ms for 50 ms.
    monkeypatch.setattr(goodput, "WORKER_WAIT", 0.05)
    seen = _drive(d, 25, _pure_noise, _device, arrive=False)
    assert seen[16] == (54, 1) and seen[17] == (64, 2)


def test_on_a_warm_cluster_more_workers_are_taken_at_once():
    seen = _drive(Goodput(initial=32, interval=10), 12, _pure_noise, _device, arrive=False, warm=True)
    assert seen[9] == (32, 1) and seen[10] == (64, 2)  # idle workers are there: no plan, no wait


def test_learning_rate_follows_the_adascale_gain_or_its_square_root():
    state = TrainState(0, 0, 0.0, 100, 1)
    stats = GradStats(4, 0.0, 8.0, 2)  # pure noise at S = 4: gain 4
    sgd = Goodput(initial=1, lr_rule="sgd").reset(100)
    assert sgd.plan_update(state, 4, stats).lr_factor == pytest.approx(4.0)
    adam = Goodput(initial=1, lr_rule="adam").reset(100)
    assert adam.plan_update(state, 4, stats).lr_factor == pytest.approx(2.0)
    auto = Goodput(initial=1).reset(100)
    auto.bind_optimizer("adaptive")  # the estimator tells it: Adam
    assert auto.plan_update(state, 4, stats).lr_factor == pytest.approx(2.0)
    auto.bind_optimizer("sgd")
    assert auto.plan_update(state, 4, stats).lr_factor == pytest.approx(4.0)
    assert Goodput(initial=4).reset(100).plan_update(state, 4, stats).lr_factor == 1.0  # S = 1


def test_cooldown_is_one_minus_sqrt_over_the_last_fraction_of_the_call():
    # A call from epoch 2 to 7 with fraction 0.2: 1 until epoch 6, then 1 - sqrt(e - 6) (a window of 1).
    assert [cooldown_factor(e, 2.0, 7.0, 0.2) for e in (2.0, 5.9, 6.0, 6.25, 6.91, 7.0)] == pytest.approx(
        [1.0, 1.0, 1.0, 0.5, 1 - 0.91**0.5, 0.0], abs=1e-12)
    assert cooldown_factor(6.5, 2.0, 7.0, 0.0) == 1.0 and cooldown_factor(3.0, 3.0, 3.0, 0.2) == 1.0


def test_learning_rate_cools_down_before_the_end_of_a_fit_call_only():
    """The lr factor is AdaScale's (1 with no statistics) times the cool-down of the fit call the
    damper sees (``TrainState.end_epoch``); a call without an end (``partial_fit``) never cools,
    and a new call's cool-down counts from where it starts."""
    def factors(d, epochs, end):
        return [d.plan_update(TrainState(0, 0, e, 100, 1, end_epoch=end), 32, None).lr_factor for e in epochs]

    d = Goodput(cooldown=0.25).reset(n_data=100)
    assert factors(d, [0.0, 2.9, 3.0, 3.25, 3.81], end=4.0) == pytest.approx([1, 1, 1, 0.5, 0.1])
    assert d.explain()["decay"] == pytest.approx(0.1) and d.cooldown_ == pytest.approx(0.1)
    assert factors(d, [4.0, 4.9], end=None) == [1.0, 1.0]  # partial_fit: no end known
    assert factors(d, [4.0, 6.0, 7.25], end=8.0) == pytest.approx([1, 1, 0.5])  # warm start: 4 -> 8
    assert factors(Goodput(cooldown=0.0).reset(100), [3.9], end=4.0) == [1.0]


def test_the_choice_stands_during_the_cool_down():
    """All noise keeps growing the batch and the workers, but not once the learning rate cools down:
    it no longer follows the gain the efficiency assumes (and a change would not pay before the end)."""
    def grown(cooldown):
        d = Goodput(initial=32, interval=10, max_factor=1.5, cooldown=cooldown)
        seen = _drive(d, 60, _pure_noise, lambda b, w: (0.01 + 1e-5 * math.ceil(b / w), 0.001), warm=True, end=4.0)
        return seen, {t for t, _ in _changes(seen)[1:]}

    seen, changed = grown(0.5)  # the cool-down starts at epoch 2, update 30
    assert changed and max(changed) <= 30 and set(seen[30:]) == {seen[30]}
    _, changed = grown(0.0)  # without one, the growth goes on
    assert max(changed) > 30


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"initial": 0}, "initial must be >= 1"),
        ({"max_batch_size": 16}, "max_batch_size=16 is smaller than initial=32"),
        ({"interval": 0}, "interval must be >= 1"),
        ({"max_factor": 1}, "max_factor must be a number > 1"),
        ({"threshold": -0.1}, "threshold must be a number >= 0"),
        ({"smoothing": 1.0}, "smoothing must be in \\(0, 1\\)"),
        ({"lr_rule": "lars"}, "lr_rule must be one of"),
        ({"anneal": "yes"}, "anneal must be True or False"),
        ({"cooldown": 1.0}, "cooldown must be a number in \\[0, 1\\)"),
        ({"momentum": "fast"}, "momentum"),
    ],
)
def test_bad_parameters_are_named_at_reset(params, match):
    with pytest.raises(ValueError, match=match):
        Goodput(**params).reset(n_data=1000)


def test_clone_params_and_checkpoint_state():
    d = Goodput(interval=7, max_factor=1.5)
    assert clone(d).get_params() == d.get_params()
    assert Goodput().set_params(threshold=0.1).threshold == 0.1
    _drive(d, 40, _pure_noise, _device)
    saved = ckpt.plain(ckpt.damper_state(d))
    fresh = clone(d).reset(100_000)
    ckpt.restore_damper(fresh, saved)
    for attr in ("batch_size_", "workers_", "evaluated_at_", "n_changes_", "timings_", "model_", "noise_scale_"):
        assert getattr(fresh, attr) == getattr(d, attr), attr
    assert fresh.scaler_.sigma2_sum_ == d.scaler_.sigma2_sum_


# --------------------------------------------------------------------------- end to end


class Device(torch.nn.Module):
    """A linear model on an emulated device: each training forward sleeps 2 ms + 0.2 ms per example."""

    def __init__(self, n_features=8):
        super().__init__()
        self.linear = torch.nn.Linear(n_features, 1)

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            time.sleep(0.002 + 0.0002 * len(x))
        return self.linear(x)


class StopWhenGrown(Callback):
    """Ends the fit once the batch reached ``batch`` and the workers ``workers`` (a worker's start
    takes seconds on a loaded machine: the fit runs as long as that, and no longer)."""

    def __init__(self, batch=32, workers=2):
        self.batch, self.workers = batch, workers

    def on_update_end(self, estimator, record=None, **info):
        self.records_ = [*getattr(self, "records_", []), record]  # history_ keeps whole epochs only
        if record["batch_size"] >= self.batch and record["n_workers"] >= self.workers:
            raise StopTraining("grown")


def test_grows_batch_and_workers_as_the_noise_scale_grows():
    """Noisy linear regression: the gradient shrinks as the fit converges while the label noise
    keeps the per-example variance, so the noise scale grows; Goodput follows with the batch, and
    with the workers (each forward sleeps per example, so a second worker pays)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2048, 8)).astype(np.float32)
    y = (X @ rng.normal(size=8) + rng.normal(size=2048)).astype(np.float32)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        est = DaskRegressor(
            module=Device, optimizer=torch.optim.SGD, optimizer__lr=0.01,
            batch_size=Goodput, batch_size__initial=8, batch_size__interval=8,
            scale_cluster=True, max_workers=2, max_epochs=200, random_state=0, client=client,
            callbacks=[("grown", StopWhenGrown(batch=32, workers=2))],
        ).fit(X, y)
    updates = dict(est.callbacks_)["grown"].records_
    assert {"noise_scale", "efficiency", "gain", "predicted_throughput"} <= set(updates[0])
    batches = [u["batch_size"] for u in updates]
    workers = [u["n_workers"] for u in updates]
    assert batches[0] == 8 and workers[0] == 1
    assert batches[-1] >= 32 and workers[-1] == 2, "stopped by max_epochs before growing"
    noise = [u["noise_scale"] for u in updates if np.isfinite(u["noise_scale"])]
    assert noise[-1] > 3 * noise[0]  # the noise scale grew, and with it the batch ...
    grew = next(i for i, w in enumerate(workers) if w == 2)
    # ... then the workers (the update they joined at may be an epoch's ragged last batch: the
    # schedule had grown before it)
    assert max(batches[: grew + 1]) > 8 and all(w == 1 for w in workers[:grew])
    assert all(np.isfinite(u["predicted_throughput"]) for u in updates[grew:])
    assert est.score(X, y) > 0.75  # R^2; the label noise bounds it at about 0.89


def _updates(est) -> list[dict]:
    return [u for row in est.history_ for u in row["updates"]]


def test_a_fit_cools_down_over_its_last_epochs_and_partial_fit_never(client, regression_data):
    X, y = regression_data
    params = {"batch_size": Goodput, "batch_size__initial": 16, "batch_size__cooldown": 0.5, "max_epochs": 2,
              "random_state": 0, "client": client}
    records = _updates(DaskRegressor(**params).fit(X, y))
    decay = [r["decay"] for r in records]
    seen = np.cumsum([0] + [r["batch_size"] for r in records])[:-1]  # examples before each update
    first = int(np.sum(seen < len(X)))  # the first epoch's updates: before the cool-down
    assert first < len(records) and decay[:first] == [1.0] * first
    expected = [1 - (s / len(X) - 1) ** 0.5 for s in seen[first:]]  # 1 - sqrt(epoch - 1), a window of 1
    assert decay[first:] == pytest.approx(expected, rel=1e-9, abs=1e-12) and 0 < decay[-1] < 0.5
    est = DaskRegressor(**params).partial_fit(X, y).partial_fit(X, y)
    assert {r["decay"] for r in _updates(est)} == {1.0}


def test_speedups_are_the_best_goodput_per_worker_count_against_one_workers():
    """What a shared cluster divides by (adadamp.cluster.division.by_speedup): none before the model is
    measured; then, per worker count, the best goodput over batch sizes against one worker's; a
    device whose cost per worker is high predicts less speedup from more workers."""
    d = Goodput(initial=32, interval=10)
    d.reset(100_000)
    assert d.speedups(8) is None
    _drive(d, 60, _pure_noise, _device)
    curve = d.speedups(8)
    model = ThroughputModel(*d.model_)
    batches = np.unique(np.rint(np.geomspace(32, d.cap_, 50)).astype(int))
    brute = [max(float(d._goodput(model, d.noise_scale_, b, w)) for b in batches if b >= w) for w in range(1, 9)]
    np.testing.assert_allclose(curve, np.array(brute) / brute[0], rtol=1e-12)
    assert curve[0] == 1.0 and curve[3] > 1.5  # all noise: more workers pay
    costly = Goodput(initial=32, interval=10)
    _drive(costly, 60, _pure_noise, lambda b, w: (0.001 + 0.0001 * math.ceil(b / w), 0.001 + 0.01 * (w - 1)))
    assert costly.speedups(8)[3] < curve[3]
