"""Pure unit tests of adadamp.dampers against numeric oracles worked out by hand from the papers.

Every damper is driven through the engine protocol (``reset``,
``next_batch_size``, ``plan_update``); gradient statistics are computed here
in numpy from per-shard gradient sums, as the engine would.  No Dask.
"""

import doctest
import importlib
import inspect
import math
import pickle

import numpy as np
import pytest
from sklearn.base import clone

from adadamp import dampers
from adadamp.dampers import (
    AdaDamp,
    AdaScale,
    BaseDamper,
    CntsDampLR,
    Constant,
    DynamicSGD,
    GeoDamp,
    GeoDampLR,
    GradientDescent,
    GradStats,
    PadaDamp,
    RadaDamp,
    TrainState,
    UpdatePlan,
    count_updates,
    simulate_schedule,
    tang_momentum,
)

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def state(t=0, epoch=0.0, n_data=1000, n_workers=1, loss=None, seen=0):
    return TrainState(t, seen, epoch, n_data, n_workers, loss=loss)


def shard_stats(G, n=None):
    """GradStats from per-shard gradient SUMS ``G`` (k, d) of ``n`` examples."""
    G = np.asarray(G, dtype=np.float64)
    n = np.ones(len(G)) if n is None else np.asarray(n, dtype=np.float64)
    N = n.sum()
    gbar = G.sum(0) / N
    Q = ((G**2).sum(1) / n).sum()
    return GradStats(int(N), float(gbar @ gbar), float(Q), len(G))


def linear_grad(x, bias=True):
    """Gradient of ``Linear(2, 2)(x).sum()`` w.r.t. (W, b): both rows of W are x."""
    x = np.asarray(x, dtype=np.float64)
    return np.concatenate([x, x, [1.0, 1.0]] if bias else [x, x])


class Scripted(BaseDamper):
    """Test schedule: batch ``sizes[n_updates]`` (the last one repeats)."""

    def __init__(self, sizes=(1,)):
        self.sizes = sizes

    def next_batch_size(self, state):
        return int(self.sizes[min(state.n_updates, len(self.sizes) - 1)])


def run_plans(damper, sizes, n_data=10**6, n_workers=1):
    """Drive a reset damper over updates; return (requested, plan) per update."""
    out = []
    for t in range(len(sizes)):
        s = state(t, n_data=n_data, n_workers=n_workers)
        b = damper.next_batch_size(s)
        out.append((b, damper.plan_update(s, b, None)))
    return out


# --------------------------------------------------------------------------
# protocol, sklearn contract, pickling
# --------------------------------------------------------------------------


def half_momentum(n_workers, batch_size):
    return 0.5


def _all_dampers():
    return [
        Constant(batch_size=16, momentum=0.9),
        GeoDamp(initial=8, delay=0.01, factor=2, max_batch_size=64),
        GeoDampLR(initial=8, delay=0.01, factor=3, momentum="tang"),
        PadaDamp(initial=4, rate=0.5, max_batch_size=20),
        CntsDampLR(initial=4, rate=0.3),
        AdaDamp(initial=4, rho=0.5),
        RadaDamp(initial=4, wait=3, rho=0.5),
        GradientDescent(momentum=half_momentum),
        AdaScale(
            batch_size=GeoDamp(initial=4, delay=0.02, factor=2),
            lr_schedule=GeoDampLR(initial=4, delay=0.05, factor=10),
            smoothing=0.99,
        ),
        DynamicSGD(batch_size=PadaDamp(initial=4, rate=1.0), momentum=0.8),
        DynamicSGD(per_worker_batch=4, compensation="velocity"),
    ]


def _drive(d, n, n_data=1000, seed=0):
    """n protocol updates with losses and chunk statistics; list of plans."""
    rng = np.random.default_rng(seed)
    plans = []
    loss = None
    for t in range(n):
        s = state(t, epoch=t * 8 / n_data, n_data=n_data, n_workers=1 + t % 3, loss=loss)
        b = d.next_batch_size(s)
        G = rng.normal(1.0, 1.0, size=(2, 5)) * np.array([[b // 2], [b - b // 2]])
        plan = d.plan_update(s, b, shard_stats(G, [b // 2, b - b // 2]))
        plans.append((b, plan))
        loss = 2.0 / (1 + t) + 0.1
    return plans


@pytest.mark.parametrize("damper", _all_dampers(), ids=lambda d: type(d).__name__)
def test_sklearn_contract_clone_pickle(damper):
    # __init__ only stores its (keyword, defaulted) arguments
    sig = inspect.signature(type(damper).__init__)
    params = damper.get_params(deep=False)
    assert set(params) == set(sig.parameters) - {"self"}
    assert all(p.default is not p.empty for n, p in sig.parameters.items() if n != "self")
    type(damper)()  # every parameter has a default
    assert not [k for k in vars(damper) if k.endswith("_")]

    d = clone(damper).reset(1000)
    first = _drive(d, 12)
    # clone of a used damper is fresh: same plans again
    again = _drive(clone(d).reset(1000), 12)
    assert first == again
    # reset forgets the state
    assert _drive(d.reset(1000), 12) == first
    # pickle keeps the state mid-run (checkpoints)
    d = clone(damper).reset(1000)
    _drive(d, 5)
    d2 = pickle.loads(pickle.dumps(d))
    assert _drive(d, 7, seed=1) == _drive(d2, 7, seed=1)
    for b, plan in first:
        assert isinstance(b, int) and b >= 1
        assert isinstance(plan, UpdatePlan) and plan.lr_factor > 0


def test_set_params_reaches_nested_schedule():
    d = AdaScale(batch_size=GeoDamp(delay=3))
    d.set_params(batch_size__delay=60, batch_size__factor=5)
    c = clone(d)
    assert c.batch_size.delay == 60 and c.batch_size.factor == 5
    assert c.reset(50_000).schedule_.delay == 60
    assert c.batch_size is not d.batch_size


def test_trainstate_loss_field_is_optional():
    s = TrainState(0, 0, 0.0, 10, 1)
    assert s.loss is None
    assert TrainState(1, 2, 0.2, 10, 1, 0.5).loss == 0.5


def test_docstring_examples():
    attempted = 0
    for name in ("adascale", "adaptive", "base", "damping", "dynamic_sgd", "goodput", "growth", "momentum", "simulation"):
        module = importlib.import_module(f"adadamp.dampers.{name}")
        result = doctest.testmod(module, extraglobs=vars(dampers), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, name
        attempted += result.attempted
    assert attempted > 20


# --------------------------------------------------------------------------
# bad parameters: ValueError naming the parameter, raised by reset
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damper, match",
    [
        (GeoDamp(factor=0.5), "factor"),
        (GeoDamp(factor="5"), "factor"),
        (GeoDamp(delay=0), "delay"),
        (GeoDamp(delay=-3), "delay"),
        (GeoDamp(initial=128, max_batch_size=64), "max_batch_size"),
        (GeoDamp(initial=0), "initial"),
        (GeoDamp(initial=12.5), "initial"),
        (GeoDamp(momentum=1.0), "momentum"),
        (GeoDamp(momentum="fast"), "momentum"),
        (GeoDampLR(factor=0.9), "factor"),
        (PadaDamp(rate=-1), "rate"),
        (PadaDamp(initial=10, max_batch_size=5), "max_batch_size"),
        (CntsDampLR(rate=-0.1), "rate"),
        (AdaDamp(rho=1.0), "rho"),
        (AdaDamp(best_train_loss=float("nan")), "best_train_loss"),
        (RadaDamp(wait=0), "wait"),
        (RadaDamp(fudge=-1), "fudge"),
        (AdaScale(smoothing=0.0), "smoothing"),
        (AdaScale(smoothing=1.0), "smoothing"),
        (AdaScale(smoothing=1.5), "smoothing"),
        (AdaScale(smoothing=-0.1), "smoothing"),
        (AdaScale(batch_size=0), "batch_size"),
        (AdaScale(base_batch_size=0), "base_batch_size"),
        (AdaScale(batch_size=GradientDescent()), "base_batch_size"),
        (AdaScale(lr_schedule=0.1), "lr_schedule"),
        (AdaScale(batch_size=GeoDamp(factor=0.5)), "factor"),
        (DynamicSGD(compensation="gamma"), "compensation"),
        (DynamicSGD(compensation_iters=0), "compensation_iters"),
        (DynamicSGD(per_worker_batch=0), "per_worker_batch"),
        (Constant(batch_size=0), "batch_size"),
        (Constant(momentum=-0.1), "momentum"),
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_bad_parameters_raise_in_reset(damper, match):
    with pytest.raises(ValueError, match=match):
        damper.reset(1000)


def test_damper_class_instead_of_instance_is_a_type_error():
    with pytest.raises(TypeError, match="GeoDamp"):
        AdaScale(batch_size=GeoDamp).reset(100)
    with pytest.raises(TypeError, match="lr_schedule"):
        AdaScale(lr_schedule=GeoDampLR).reset(100)


# --------------------------------------------------------------------------
# momentum rules (Tang et al., §4)
# --------------------------------------------------------------------------


def test_tang_preset_steps():
    expected = {1: 0.9, 4: 0.9, 5: 0.95, 16: 0.95, 17: 0.975, 31: 0.975, 32: 0.99, 500: 0.99}
    for p, m in expected.items():
        assert tang_momentum(p) == m
        d = GeoDamp(momentum="tang").reset(1000)
        s = state(n_workers=p)
        assert d.plan_update(s, d.next_batch_size(s), None).momentum == m


@pytest.mark.parametrize(
    "damper",
    [
        Constant(),
        GeoDamp(),
        GeoDampLR(),
        PadaDamp(),
        CntsDampLR(),
        AdaDamp(),
        RadaDamp(),
        GradientDescent(),
        AdaScale(),
        DynamicSGD(),
    ],
    ids=lambda d: type(d).__name__,
)
def test_every_damper_accepts_every_momentum_rule(damper):
    rules = [(None, None), (0.95, 0.95), ("tang", 0.975), (lambda p, b: 0.5 + p / 100 + b / 1e4, 0.7032)]
    for rule, expected in rules:
        d = clone(damper).set_params(momentum=rule).reset(1000)
        s = state(n_workers=20)
        b = d.next_batch_size(s)
        m = d.plan_update(s, 32, None).momentum
        assert b >= 1
        assert m == pytest.approx(expected) if expected is not None else m is None


def test_momentum_callable_gets_workers_and_batch_and_is_checked():
    seen = []
    d = Constant(batch_size=48, momentum=lambda p, b: seen.append((p, b)) or 0.9).reset(100)
    d.plan_update(state(n_workers=3), 48, None)
    assert seen == [(3, 48)]
    bad = Constant(momentum=lambda p, b: 1.2).reset(100)
    with pytest.raises(ValueError, match="momentum"):
        bad.plan_update(state(), 32, None)


def test_O19_momentum_raise_buffer_dynamics():
    """0.9 -> 0.99 (4 -> 32 workers, "tang") at lr 0.01, gradient 1: step 1 - 0.9*0.99^s."""
    d = Constant(batch_size=32, momentum="tang").reset(1000)
    buf, lr = 10.0, 0.01  # steady state of momentum 0.9
    assert d.plan_update(state(n_workers=4), 32, None).momentum == 0.9
    steps = {}
    for s in range(1, 101):
        mu = d.plan_update(state(s, n_workers=32), 32, None).momentum
        buf = mu * buf + 1.0
        steps[s] = lr * buf
    assert steps[1] == pytest.approx(0.109)
    assert steps[10] == pytest.approx(0.1861, abs=1e-4)
    assert steps[100] == pytest.approx(0.6706, abs=1e-4)
    assert all(steps[s] == pytest.approx(1 - 0.9 * 0.99**s) for s in steps)


# --------------------------------------------------------------------------
# GeoDamp / GeoDampLR (Holt & Sievert 2021, "Increasing the batch size")
# --------------------------------------------------------------------------


def _per_epoch(trace, key):
    """Value of ``key`` at each data epoch (asserting it is constant inside)."""
    out = {}
    for r in trace:
        e = math.floor(r["epoch"] + 1e-9)
        out.setdefault(e, set()).add(r[key])
    assert all(len(v) == 1 for v in out.values()), out
    return {e: v.pop() for e, v in out.items()}


def test_O20_geodamp_doubles_every_four_epochs():
    trace = simulate_schedule(GeoDamp(initial=1, delay=4, factor=2), n_data=128, max_epochs=16)
    damping = _per_epoch(trace, "damping")
    assert sorted(damping) == list(range(16))
    values = list(damping.values())
    assert set(values) == {1, 2, 4, 8}
    assert all(values.count(v) == 4 for v in (1, 2, 4, 8))
    assert values == sorted(values)
    assert all(r["batch_size"] == r["damping"] for r in trace)  # 128 divisible by B


def test_O21_geodamp_lr_decays_past_max_batch_size():
    d = GeoDamp(initial=4, delay=3, factor=2, max_batch_size=8)
    trace = simulate_schedule(d, n_data=128, max_epochs=16)
    damping = _per_epoch(trace, "damping")
    assert {v / 4 for v in damping.values()} == {1, 2, 4, 8, 16, 32}
    assert {r["batch_size"] for r in trace} == {4, 8}
    lrs = [r["lr_factor"] for r in trace]
    assert set(lrs) == {1, 1 / 2, 1 / 4, 1 / 8, 1 / 16}
    bs = [r["batch_size"] for r in trace]
    assert bs == sorted(bs) and lrs == sorted(lrs, reverse=True)
    assert all(r["batch_size"] / r["lr_factor"] == r["damping"] for r in trace)


TABLE_1 = [
    # (damper, lr0, updates, max workers, B at e=0/60/120/180, lr at e=0/60/120/180)
    (GeoDampLR(initial=128, delay=60, factor=5), 0.05, 78_200, 1, (128,) * 4, (0.05, 0.01, 0.002, 0.0004)),
    (GeoDamp(initial=128, delay=60, factor=5, max_batch_size=640), 0.05, 34_520, 5,
     (128, 640, 640, 640), (0.05, 0.05, 0.01, 0.002)),
    (GeoDamp(initial=128, delay=60, factor=5, max_batch_size=3200), 0.05, 29_480, 25,
     (128, 640, 3200, 3200), (0.05, 0.05, 0.05, 0.01)),
    (GeoDamp(initial=128, delay=60, factor=5, max_batch_size=16_000), 0.05, 29_240, 125,
     (128, 640, 3200, 16_000), (0.05,) * 4),
    (GeoDamp(initial=256, delay=60, factor=5, max_batch_size=5120), 0.1, 14_960, 40,
     (256, 1280, 5120, 5120), (0.1, 0.1, 0.08, 0.016)),
]


@pytest.mark.parametrize("row", TABLE_1, ids=["128", "640", "3.2k", "16k", "5.1k(*2)"])
def test_O22_holt_sievert_table_1(row):
    damper, lr0, updates, max_workers, batches, lrs = row
    trace = simulate_schedule(damper, n_data=50_000, max_epochs=200)
    assert len(trace) == updates
    assert count_updates(damper, n_data=50_000, max_epochs=200) == updates
    assert max(math.ceil(r["batch_size"] / 128) for r in trace) == max_workers
    at = {}
    for r in trace:
        at.setdefault(math.floor(r["epoch"] + 1e-9), r)
    assert len(at) == 200
    for e, b, lr in zip((0, 60, 120, 180), batches, lrs):
        assert at[e]["requested"] == b
        assert lr0 * at[e]["lr_factor"] == pytest.approx(lr)
        assert damper.forecast_batch_size(e) == b
    for r in trace:  # B / lr == D / lr0 at every update
        assert math.isclose(r["requested"] / (lr0 * r["lr_factor"]), r["damping"] / lr0)
    # each data epoch runs ceil(N / B) updates, the last one smaller
    per_epoch = {}
    for r in trace:
        per_epoch.setdefault(math.floor(r["epoch"] + 1e-9), []).append(r["batch_size"])
    for sizes in per_epoch.values():
        assert sum(sizes) == 50_000 and len(sizes) == math.ceil(50_000 / sizes[0])


def test_geodamp_pure_schedule_and_forecast():
    d = GeoDamp(initial=32, delay=2.5, factor=1.5)
    assert [d.damping(e) for e in (0, 2.4, 2.5, 5, 7.6)] == [32, 32, 48, 72, 108]
    assert d.forecast_batch_size(5) == 72
    d.reset(n_data=100)
    assert d.forecast_batch_size(7.6) == 100  # capped at the data set size
    s = state(epoch=7.6, n_data=100)
    assert d.next_batch_size(s) == 100
    assert d.plan_update(s, 100, None).lr_factor == pytest.approx(100 / 108)
    # rounding of the epoch clock at a boundary does not delay the growth
    assert d.damping(5 - 1e-12) == d.damping(5.0) == 72
    assert GeoDamp(initial=3, delay=1, factor=1.5).reset(100).next_batch_size(state(epoch=1)) == 5


def test_geodamplr_keeps_batch_and_decays_lr():
    d = GeoDampLR(initial=64, delay=2, factor=10).reset(10_000)
    for e, lr in [(0, 1.0), (1.9, 1.0), (2, 0.1), (4.5, 0.01)]:
        s = state(epoch=e, n_data=10_000)
        assert d.next_batch_size(s) == 64
        assert d.plan_update(s, 64, None).lr_factor == pytest.approx(lr)
        assert d.forecast_batch_size(e) == 64
    assert "max_batch_size" not in d.get_params()


# --------------------------------------------------------------------------
# the original adadamp family
# --------------------------------------------------------------------------


def test_padadamp_and_cntsdamplr():
    d = PadaDamp(initial=1, rate=1).reset(1000)
    assert [b for b, _ in run_plans(d, range(6))] == [1, 2, 3, 4, 5, 6]  # DD test_padadamp
    d = PadaDamp(initial=10, rate=2.5, max_batch_size=15).reset(1000)
    out = run_plans(d, range(4))
    assert [b for b, _ in out] == [10, 13, 15, 15]
    assert [p.lr_factor for _, p in out] == pytest.approx([1, 1, 1, 15 / 17.5])
    assert d.forecast_batch_size(3) is None
    d = CntsDampLR(initial=8, rate=0.5).reset(1000)
    out = run_plans(d, range(5))
    assert [b for b, _ in out] == [8] * 5
    assert [p.lr_factor for _, p in out] == pytest.approx([8 / (8 + 0.5 * k) for k in range(5)])
    assert d.forecast_batch_size(10.0) == 8


def test_adadamp_follows_loss_ratio():
    d = AdaDamp(initial=8, rho=0.5, best_train_loss=0.5).reset(10_000)
    assert d.next_batch_size(state(0)) == 8
    losses = [2.5, 2.0, 1.0, 0.8, 0.6]
    num = wsum = 0.0
    l0 = None
    for t, loss in enumerate(losses, start=1):
        num, wsum = 0.5 * num + 0.5 * loss, 0.5 * wsum + 0.5
        avg = num / wsum
        l0 = avg if l0 is None else l0
        expected = math.ceil(round(8 * (l0 - 0.5) / (avg - 0.5), 9))
        assert d.next_batch_size(state(t, loss=loss)) == expected
    # non-finite loss or a loss at F* keeps the previous batch size
    b = d.next_batch_size(state(9, loss=float("nan")))
    assert d.next_batch_size(state(10, loss=-10.0)) >= b
    with pytest.raises(RuntimeError, match="TrainState.loss"):
        AdaDamp().reset(100).next_batch_size(state(3, loss=None))


def test_adadamp_cap_turns_growth_into_lr_decay():
    d = AdaDamp(initial=10, rho=0.0, max_batch_size=20).reset(1000)
    d.next_batch_size(state(0))
    d.next_batch_size(state(1, loss=4.0))
    s = state(2, loss=1.0)
    assert d.next_batch_size(s) == 20  # damping 40
    assert d.plan_update(s, 20, None).lr_factor == 0.5


def _feed(d, seq) -> list[int]:
    """Batch sizes of ``d`` fed ``(loss of the previous update, ||g||^2 of this update)`` per update."""
    got = []
    for t, (loss, g2) in enumerate(seq):
        s = state(t, loss=loss)
        b = d.next_batch_size(s)
        d.plan_update(s, b, GradStats(b, g2, 0.0, 0))
        got.append(b)
    return got


def test_radadamp_waits_then_tracks_noise():
    d = RadaDamp(initial=4, form="fudge", wait=2, fudge=0.5, rho=0.0).reset(1000)
    assert d.needs_grad_stats
    seq = [(None, 8.0), (2.0, 6.0), (2.0, 2.0), (1.0, 1.0)]  # (loss of previous, ||g||^2)
    got = _feed(d, seq)
    # init factor = mean(0.5 * 2 + 8, 0.5 * 2 + 6) = 8; then 0.5 * 1 + 2 = 2.5
    assert got == [4, 4, 4, math.ceil(4 * 8 / 2.5)]
    assert d.next_batch_size(state(4, loss=1.0)) == math.ceil(4 * 8 / 1.5)
    with pytest.raises(RuntimeError, match="loss"):
        RadaDamp().reset(10).next_batch_size(state(2))


def test_radadamp_final_form_matches_the_originals_formula():
    """B = max(B0, B0 / (0.5 (L/L0 + G/G0))), L and G moving averages (rho 0.2) of per-window minima
    (the original adadamp's final RadaDamp, its PR #24), by hand."""
    d = RadaDamp(initial=10, wait=3).reset(1000)
    assert d.form == "ratio" and d.rho_ == 0.2
    # (loss of the previous update, ||g||^2 of this update); the first update has no previous loss
    seq = [(None, 9.0), (4.0, 12.0), (5.0, 6.0), (3.0, 8.0), (2.0, 2.0), (6.0, 5.0), (1.0, 4.0), (0.5, 1.0)]
    got = _feed(d, seq)
    # observed (loss, G) pairs: (4, 9), (5, 12), (3, 6) -> window 1 minima L0 = 3, G0 = 6
    # then (2, 8), (6, 2), (1, 5) -> minima (1, 2): L = 0.2*3 + 0.8*1 = 1.4, G = 0.2*6 + 0.8*2 = 2.8
    ratio = 0.5 * (1.4 / 3 + 2.8 / 6)
    assert got == [10, 10, 10, 10, 10, 10, math.ceil(10 / ratio), math.ceil(10 / ratio)]
    # a window whose minima are above the first's never shrinks the batch below B0
    up = RadaDamp(initial=10, wait=1, rho=0.0).reset(1000)
    assert _feed(up, [(None, 1.0), (1.0, 5.0), (9.0, 9.0), (9.0, 1.0)]) == [10, 10, 10, 10]
    with pytest.raises(ValueError, match="form"):
        RadaDamp(form="smooth").reset(10)


def test_gradient_descent_uses_whole_data_set():
    d = GradientDescent()
    assert d.forecast_batch_size(1.0) is None
    d.reset(777)
    trace = simulate_schedule(d, n_data=777, max_epochs=3)
    assert [r["batch_size"] for r in trace] == [777] * 3
    assert d.forecast_batch_size(2.0) == 777


# --------------------------------------------------------------------------
# AdaScale estimator (Johnson et al. 2020, Alg. 2; unequal chunks)
# --------------------------------------------------------------------------


def adascale_r(inputs, b0=1, smoothing=0.999, bias=True, steps=None):
    """Gain after feeding one-example shards ``inputs`` (list per step)."""
    steps = steps or [inputs]
    d = AdaScale(batch_size=len(steps[0]), base_batch_size=b0, smoothing=smoothing).reset(1000)
    for t, xs in enumerate(steps):
        G = np.stack([linear_grad(x, bias) for x in xs])
        s = state(t)
        assert d.next_batch_size(s) == len(xs)
        plan = d.plan_update(s, len(xs), shard_stats(G))
    return d.gain_, plan


@pytest.mark.parametrize(
    "inputs, r",
    [
        ([[1, 0], [0, 1]], 4 / 3),
        ([[1, 1], [1, 1]], (1e-6 + 6) / (0.5e-6 + 6)),
        ([[-1, 1], [1, -1]], 2.0),
        ([[1, 4], [5, 0.5]], 1.4688796680),
        ([[-0.2, 3], [5, 0.5]], 1.84728939),
    ],
)
def test_O1_fairscale_golden_first_step(inputs, r):
    gain, plan = adascale_r(inputs)
    assert gain == pytest.approx(r, rel=1e-6)
    assert plan.lr_factor == pytest.approx(r, rel=1e-6)
    assert plan.progress == pytest.approx(r, rel=1e-6)  # r * b0 examples
    # float32 inputs (as fairscale) agree to 1e-6
    gain32, _ = adascale_r(np.asarray(inputs, dtype=np.float32))
    assert gain32 == pytest.approx(r, rel=1e-6)


def test_O2_fairscale_golden_two_steps():
    steps = [[[-0.2, 3.3], [5.2, 0.7]], [[1, 4], [3.1, 0.1]]]
    gain, _ = adascale_r(None, smoothing=math.sqrt(0.998), steps=steps)  # theta = 0.998
    assert gain == pytest.approx(1.6720968, rel=1e-6)
    gain, _ = adascale_r(None, smoothing=0.999, steps=steps)  # theta = 0.999**2 (adaptdl)
    assert gain == pytest.approx(1.6720970, rel=1e-7)


def test_O3_orthogonal_shards_give_linear_scaling():
    for _ in range(3):
        gain, _ = adascale_r(None, bias=False, steps=[[[0, 1], [1, 0]]] * 5)
        assert gain == pytest.approx(2.0, rel=1e-9)
    G = np.eye(4)
    for b0, S in [(1, 4.0), (2, 2.0), (3, 4 / 3)]:
        d = AdaScale(batch_size=4, base_batch_size=b0).reset(100)
        for t in range(3):
            plan = d.plan_update(state(t), 4, shard_stats(G))
            assert d.gain_ == pytest.approx(S, rel=1e-9)
            assert plan.lr_factor == pytest.approx(S, rel=1e-9)


def test_O4_identical_shards_give_identity_scaling():
    gain, _ = adascale_r([[1, 1], [1, 1]])
    assert abs(gain - 1) < 1e-6 and gain - 1 == pytest.approx(5e-7, rel=0.01)
    # the variance floor is relative (1e-6 of var + mu^2): the same tiny |r - 1| at any gradient scale
    d = AdaScale(batch_size=2, base_batch_size=1).reset(100)
    g = np.sqrt([0.05, 0.05])
    d.plan_update(state(), 2, shard_stats([g, g]))
    assert d.gain_ - 1 == pytest.approx(5e-7, rel=0.01)


def test_O5_unequal_shard_sizes():
    stats = shard_stats([[2, 0], [0, 6]], n=[1, 3])
    assert (stats.n_samples, stats.grad_sq_norm, stats.chunk_sq_norm_sum) == (4, 2.5, 16.0)
    assert AdaScale.estimate(stats) == pytest.approx((6.0, 1.0))
    for b0, r in [(1, 2.8), (2, 1.6), (4, 1.0)]:
        d = AdaScale(batch_size=4, base_batch_size=b0).reset(100)
        assert d.plan_update(state(), 4, stats).lr_factor == pytest.approx(r)
    assert d.grad_variance() == pytest.approx(6.0)  # EMA updated at S == 1 too


def test_O6_antiparallel_shards_clamp_mu2():
    stats = shard_stats([[1, -1], [-1, 1]])
    assert AdaScale.estimate(stats) == pytest.approx((4.0, -2.0))
    d = AdaScale(batch_size=2, base_batch_size=1).reset(100)
    assert d.plan_update(state(), 2, stats).lr_factor == pytest.approx(2.0)
    assert d.grad_sqr() == pytest.approx(-2.0)  # clamped only at use


def test_O7_gain_function():
    var, sqr = np.array([1, 0, 0, 2.0]), np.array([-1, 0, -1, 1.0])
    expected = {0.5: [0.5, 0.5, 0.5, 0.6], 1: [1, 1, 1, 1], 2: [2, 2, 2, 1.5], 4: [4, 4, 4, 2], 10: [10, 10, 10, 2.5]}
    for scale, r in expected.items():
        np.testing.assert_allclose(AdaScale.gain_ratio(var, sqr, scale), r, rtol=1e-6)
    assert AdaScale.gain_ratio(3.0, 1.0, 3) == pytest.approx(2.0)  # adaptdl test_object


def test_O8_debiased_ema():
    d = AdaScale(batch_size=2, base_batch_size=2, smoothing=0.9).reset(100)  # S = 1: theta = 0.9
    # sigma2 samples 2 then 4: antiparallel shards [a, -a] have sigma2 = 2 a^2
    d.plan_update(state(0), 2, shard_stats([[1.0], [-1.0]]))
    assert d.grad_variance() == pytest.approx(2.0)
    d.plan_update(state(1), 2, shard_stats([[math.sqrt(2)], [-math.sqrt(2)]]))
    assert d.grad_variance() == pytest.approx(3.0526316, rel=1e-7)


@pytest.mark.parametrize("S", [8, 64])
def test_O9_pure_noise_gain_is_near_S(S):
    """Zero-mean N(0, I_100) per-example gradients, one example per shard.

    Per step, the two statistics the estimator uses are drawn from their exact
    joint law (Cochran): ``N ||g_bar||^2 ~ chi2(d)`` and, independent of it,
    ``Q - N ||g_bar||^2 ~ chi2(d (S - 1))``.  FS-style clamping of each sample
    before the average gives a mean r/S of about 0.95 and fails this test.
    """
    d_, n_seeds, n_steps = 100, 10, 2000
    rng = np.random.default_rng(S)
    between = rng.chisquare(d_, size=(n_seeds, n_steps))
    within = rng.chisquare(d_ * (S - 1), size=(n_seeds, n_steps))
    ratios = []  # per seed: mean of r / S over the steps
    for i in range(n_seeds):
        d = AdaScale(batch_size=S, base_batch_size=1).reset(10**6)
        gains = []
        for t in range(n_steps):
            stats = GradStats(S, between[i, t] / S, between[i, t] + within[i, t], S)
            gains.append(d.plan_update(state(t), S, stats).lr_factor)
        assert 1 <= min(gains) and max(gains) <= S
        ratios.append(np.mean(gains) / S)
    assert np.mean(ratios) >= 0.98
    assert min(ratios) >= 0.95


def test_O10_estimator_unbiased_for_unequal_shards():
    n = np.array([1, 3, 7, 2, 10])
    m = np.array([1.0, -0.5, 0.3, 0.2, 0.1])  # mu^2 = 1.39
    c = np.array([5.0, 4.0, 3.0, 2.0, 1.25])  # sigma^2 = 15.25
    reps = 20_000
    rng = np.random.default_rng(0)
    G = n[None, :, None] * m + np.sqrt(n[None, :, None] * c) * rng.standard_normal((reps, 5, 5))
    est = np.array([AdaScale.estimate(shard_stats(G[i], n)) for i in range(reps)])
    for j, truth in enumerate([c.sum(), m @ m]):
        se = est[:, j].std() / math.sqrt(reps)
        assert abs(est[:, j].mean() - truth) < 3 * se
    # treating shards as equal-size samples is biased (the reason for eq. 2.2)
    g = G / n[None, :, None]
    naive = ((g - g.mean(1, keepdims=True)) ** 2).sum((1, 2)) / 4 * n.mean()
    assert naive.mean() > 1.5 * c.sum()


def test_adascale_no_estimate_cases_keep_r_one():
    d = AdaScale(batch_size=8, base_batch_size=1).reset(100)
    assert d.plan_update(state(), 8, None).lr_factor == 1.0  # no stats yet
    assert d.plan_update(state(1), 8, GradStats(8, 1.0, 0.0, 0)).lr_factor == 1.0  # k = 0
    assert d.plan_update(state(2), 8, GradStats(8, 1.0, 8.0, 1)).lr_factor == 1.0  # k = 1
    bad = GradStats(8, float("nan"), 5.0, 4)
    assert d.plan_update(state(3), 8, bad).lr_factor == 1.0  # non-finite: skipped
    assert d.grad_variance() is None and d.n_estimates_ == 0
    assert d.tau_ == 4.0


def test_O11_scale_one_is_bitwise_plain_sgd():
    rng = np.random.default_rng(3)
    w_as, w_sgd = np.ones(6), np.ones(6)
    h = np.arange(1, 7) / 6

    def lr(t):
        return 1.0 if t < 20 else 0.1

    d = AdaScale(batch_size=4, lr_schedule=lr).reset(1000)
    assert d.base_batch_size_ == 4
    for t in range(40):
        s = state(t)
        assert d.next_batch_size(s) == 4
        G = np.stack([2 * h * w_as + rng.standard_normal(6) for _ in range(2)])  # 2 chunks of 2
        gbar = G.sum(0) / 4
        plan = d.plan_update(s, 4, shard_stats(G, [2, 2]))
        assert plan.lr_factor == lr(t) and plan.progress == 4
        w_as = w_as - 0.1 * plan.lr_factor * gbar
        w_sgd = w_sgd - 0.1 * lr(t) * gbar
        assert d.tau_ == t + 1
    assert np.array_equal(w_as, w_sgd)
    assert d.n_estimates_ == 40  # the EMA is warm before any scale-up


def test_O13_forced_linear_gain_is_linear_scaling_without_warmup():
    T_SI, S = 100, 8

    def lr(t):
        return 1.0 if t < 50 else 0.1

    d = AdaScale(batch_size=S, base_batch_size=1, lr_schedule=lr).reset(T_SI)
    factors = []
    t = 0
    while d.tau_ < T_SI - 1e-9:
        G = np.eye(S) * 3.0  # orthogonal equal-norm shards: mu2 = 0, r = S
        plan = d.plan_update(state(t), S, shard_stats(G))
        factors.append(plan.lr_factor)
        t += 1
    assert len(factors) == math.ceil(T_SI / S)
    np.testing.assert_allclose(factors, [S * lr(S * i) for i in range(len(factors))], rtol=1e-9)


def test_O14_estimates_are_per_example_and_survive_batch_changes():
    rng = np.random.default_rng(1)
    stats = [shard_stats(rng.normal(0.5, 1.0, size=(4, 3))) for _ in range(5)]
    a = AdaScale(batch_size=4, base_batch_size=1, smoothing=0.99).reset(100)
    b = AdaScale(batch_size=4, base_batch_size=2, smoothing=0.99**2).reset(100)
    for t, st in enumerate(stats):
        a.plan_update(state(t), 4, st)
        b.plan_update(state(t), 4, st)
    assert a.grad_variance() == pytest.approx(b.grad_variance(), rel=1e-12)
    assert a.grad_sqr() == pytest.approx(b.grad_sqr(), rel=1e-12)
    before = (a.grad_variance(), a.grad_sqr())
    a.plan_update(state(9), 64, GradStats(64, 1.0, 0.0, 0))  # batch change, no chunk stats
    assert (a.grad_variance(), a.grad_sqr()) == before


def test_adascale_wraps_schedule_without_stacking_its_lr_rule():
    inner = GeoDamp(initial=4, delay=1, factor=2, max_batch_size=8)
    d = AdaScale(batch_size=inner).reset(1000)
    assert d.base_batch_size_ == 4 and d.needs_grad_stats
    for epoch, B in [(0, 4), (1, 8), (3, 8)]:  # epoch 3: damping 32 > cap 8
        s = state(epoch=epoch)
        assert d.next_batch_size(s) == B
        assert d.forecast_batch_size(epoch) == B
        G = np.eye(B)  # pure noise shards: r = S = B / 4
        plan = d.plan_update(s, B, shard_stats(G))
        assert plan.lr_factor == pytest.approx(B / 4)  # no 8 / 32 cap factor
        assert plan.progress == pytest.approx(B)  # r * b0
    assert AdaScale(batch_size=Constant(batch_size=16)).reset(10).base_batch_size_ == 16
    assert AdaScale(batch_size=16).forecast_batch_size(3.0) == 16


def test_adascale_lr_schedule_damper_is_run_at_scale_one():
    # scale-1 schedule: lr / 10 after 2 epochs of base batches (b0 = 10, n_data = 100: 20 iterations)
    d = AdaScale(
        batch_size=GeoDamp(initial=10, delay=1, factor=2),
        lr_schedule=GeoDampLR(initial=10, delay=2, factor=10),
    ).reset(100)
    trace = simulate_schedule(d, n_data=100, max_epochs=3)  # no stats: r = 1
    assert len(trace) == 30 and all(r["requested"] in (10, 20, 40) for r in trace)
    assert [r["lr_factor"] for r in trace] == pytest.approx([1.0] * 20 + [0.1] * 10)
    # the clock is in scale-invariant epochs: r * b0 = 10 examples per update
    assert [r["epoch"] for r in trace[:3]] == pytest.approx([0.0, 0.1, 0.2])
    d2 = AdaScale(batch_size=10, lr_schedule=lambda t: 0.5 ** (t // 5)).reset(100)
    assert [p.lr_factor for _, p in run_plans(d2, range(12))] == [1] * 5 + [0.5] * 5 + [0.25] * 2


# --------------------------------------------------------------------------
# Dynamic SGD (Lin et al. 2019, §3.2 eq. 6 and App. B.4)
# --------------------------------------------------------------------------


def gammas(k, b0=1, n_before=3, n_after=None, **kw):
    """lr factors after a batch change b0 -> k*b0 at update n_before (s = 1, 2, ...)."""
    n_after = n_after or int(8 * k) + 5
    sizes = (b0,) * n_before + (round(k * b0),) * n_after
    d = DynamicSGD(batch_size=Scripted(sizes=sizes), base_batch_size=b0, **kw).reset(10**6)
    plans = run_plans(d, sizes)
    assert all(p.lr_factor == 1.0 for _, p in plans[:n_before])
    return {s: p.lr_factor for s, (_, p) in enumerate(plans[n_before:], start=1)}


def test_O15_ramp_values():
    g = gammas(2)
    assert [g[1], g[8], g[15], g[16], g[20]] == pytest.approx([1.0625, 1.5, 1.9375, 2, 2])
    g = gammas(4)
    assert [g[1], g[16], g[31], g[32], g[37]] == pytest.approx([1.09375, 2.5, 3.90625, 4, 4])
    g = gammas(12)
    assert [g[1], g[48], g[95], g[96]] == pytest.approx([1.1145833, 6.5, 11.8854167, 12], rel=1e-7)
    g = gammas(1.5, b0=2)
    assert [g[1], g[6], g[12], g[13]] == pytest.approx([1.0416667, 1.25, 1.5, 1.5], rel=1e-7)
    # decrease (k < 1): immediate, no ramp
    sizes = (4,) * 3 + (2,) * 3
    plans = run_plans(DynamicSGD(batch_size=Scripted(sizes=sizes), base_batch_size=1).reset(100), sizes)
    assert [p.lr_factor for _, p in plans] == [4, 4, 4, 2, 2, 2]
    # configurable ramp length: a number or a callable of k
    assert gammas(4, compensation_iters=6)[3] == pytest.approx(2.5)
    assert gammas(4, compensation_iters=lambda k: 2 * k)[4] == pytest.approx(2.5)


def _heavy_ball(damper, sizes, lr0, n_switch):
    """Steady state (buffer 10, gradient 1) then batch switch; step sizes after it."""
    buf, steps = 10.0, []
    for t, (b, plan) in enumerate(run_plans(damper, sizes)):
        buf = 0.9 * buf * plan.momentum_buffer_scale + 1.0
        if t >= n_switch:
            steps.append(lr0 * plan.lr_factor * buf)
        else:
            assert lr0 * plan.lr_factor * buf == pytest.approx(0.1)
    return steps


def test_O16_first_steps_after_batch_increase():
    sizes = (10,) * 5 + (40,) * 60

    def make(**kw):
        return DynamicSGD(batch_size=Scripted(sizes=sizes), base_batch_size=10, **kw).reset(10**6)

    eq5 = _heavy_ball(make(compensation_iters=1), sizes, 0.01, 5)  # plain linear scaling
    assert eq5[0] == pytest.approx(0.4) and eq5[-1] == pytest.approx(0.4)
    dyn = _heavy_ball(make(), sizes, 0.01, 5)
    assert [dyn[0], dyn[1], dyn[15], dyn[31], dyn[50]] == pytest.approx([0.109375, 0.11875, 0.25, 0.4, 0.4])
    b4 = _heavy_ball(make(compensation="velocity"), sizes, 0.001 * 10, 5)  # eta_hat = 0.001, b0 = 10
    assert [b4[0], b4[1], b4[2]] == pytest.approx([0.13, 0.157, 0.1813])
    assert b4[-1] == pytest.approx(0.4, rel=1e-2)


def test_O17_repeated_changes_keep_lr_continuous():
    sizes = (1,) * 3 + (8,) * 32 + (16,) * 40 + (2,) * 3
    d = DynamicSGD(batch_size=Scripted(sizes=sizes), base_batch_size=1).reset(10**6)
    f = [p.lr_factor for _, p in run_plans(d, sizes)]
    assert f[3 + 31] == pytest.approx(4.5)  # s = 32 of the 1 -> 8 ramp (T = 64)
    k_eff = 16 / 4.5
    T = 8 * k_eff
    assert k_eff == pytest.approx(3.556, abs=1e-3) and T == pytest.approx(28.44, abs=1e-2)
    ramp = f[35:75]
    assert ramp[0] == pytest.approx(4.5 + 11.5 / T)
    assert ramp[27] == pytest.approx(4.5 + 11.5 * 28 / T)
    assert ramp[28:] == [16] * 12
    assert f[75:] == [2, 2, 2]


def test_dynamic_sgd_follows_requested_batch_not_short_last_batch():
    d = DynamicSGD(batch_size=GeoDamp(initial=3, delay=1, factor=2))
    trace = simulate_schedule(d, n_data=10, max_epochs=2)
    assert [r["batch_size"] for r in trace] == [3, 3, 3, 1, 6, 4]
    assert [r["lr_factor"] for r in trace] == pytest.approx([1, 1, 1, 1, 1 + 1 / 16, 1 + 2 / 16])
    v = DynamicSGD(batch_size=GeoDamp(initial=3, delay=1, factor=2), compensation="velocity")
    trace = simulate_schedule(v, n_data=10, max_epochs=2)
    assert [r["lr_factor"] for r in trace] == pytest.approx([1, 1, 1, 1 / 3, 2, 4 / 3])
    assert [r["momentum_buffer_scale"] for r in trace] == pytest.approx([1, 1, 1, 3, 1 / 6, 1.5])


def test_dynamic_sgd_elastic_mode_and_base_schedule():
    d = DynamicSGD(per_worker_batch=8).reset(10**6)
    assert d.base_batch_size_ == 8
    out = []
    for t, p in enumerate([2, 2, 4, 4, 1]):
        s = state(t, n_workers=p)
        b = d.next_batch_size(s)
        out.append((b, d.plan_update(s, b, None).lr_factor))
    # starts at linear scaling (no momentum history), ramps 2 -> 4 over T = 16, drops at once
    assert out == [(16, 2), (16, 2), (32, 2 + 2 / 16), (32, 2 + 4 / 16), (8, 1)]
    assert d.forecast_batch_size(1.0) is None
    # the wrapped schedule's lr factor is the base schedule f(t) (here GeoDamp's cap rule)
    d = DynamicSGD(batch_size=GeoDamp(initial=2, delay=1, factor=2, max_batch_size=4), compensation_iters=1)
    trace = simulate_schedule(d, n_data=8, max_epochs=4)
    assert [(r["batch_size"], r["lr_factor"]) for r in trace] == [(2, 1)] * 4 + [(4, 2)] * 2 + [(4, 1)] * 2 + [
        (4, 0.5)
    ] * 2
    assert d.forecast_batch_size(2) == 4


def test_cap_is_within_initial_and_data_set_size():
    assert GeoDamp(initial=64).reset(20).cap_ == 64  # no lr decay at the start
    assert GeoDamp(initial=4, max_batch_size=500).reset(100).cap_ == 100
    d = GeoDamp(initial=4, delay=1, factor=4, max_batch_size=500).reset(100)
    s = state(epoch=3, n_data=100)  # damping 256 > 100 examples
    assert d.next_batch_size(s) == 100
    assert d.plan_update(s, 100, None).lr_factor == pytest.approx(100 / 256)


class CountingPadaDamp(PadaDamp):
    """Records the update of every next_batch_size call."""

    def next_batch_size(self, state):
        self.asked_.append(state.n_updates)
        return super().next_batch_size(state)

    def reset(self, n_data):
        self.asked_ = []
        return super().reset(n_data)


def test_the_engine_asks_for_each_batch_once(client):
    """The cluster is sized from forecast_batch_size; next_batch_size (which adaptive dampers
    observe the state in) runs exactly once per update, also when the engine scales the cluster."""
    from adadamp import DaskRegressor

    X = np.random.default_rng(0).normal(size=(96, 3)).astype(np.float32)
    y = X.sum(1)
    est = DaskRegressor(
        batch_size=CountingPadaDamp(initial=8, rate=1.0), max_epochs=2, random_state=0,
        scale_cluster=True, grads_per_worker=1, max_workers=2,  # wants the 2 workers the cluster has
    ).fit(X, y)
    assert est.damper_.asked_ == list(range(est.meta_["n_updates"]))
    assert AdaDamp().stats_level() is None and RadaDamp().stats_level() == "norm"


def test_adascale_gain_does_not_depend_on_the_losss_scale():
    """The variance floor was absolute: mu^2 = 1e-8 gave r = 7.5 at S = 8, the same problem with
    the loss scaled so that mu^2 = 1e-4 gave 1.01."""
    from adadamp.dampers import AdaScale

    var, sqr = 2e-9, 1e-8  # a base-batch variance and a squared norm
    small = float(AdaScale.gain_ratio(var, sqr, 8))
    for c in (1e4, 1.0, 1e8):
        assert float(AdaScale.gain_ratio(c * var, c * sqr, 8)) == pytest.approx(small, rel=1e-9)
    assert small == pytest.approx((var + sqr) / (var / 8 + sqr), rel=1e-5)
    assert float(AdaScale.gain_ratio(0.0, 0.0, 8)) == 8.0  # neither signal nor noise: adaptdl's limit
    assert float(AdaScale.gain_ratio(0.0, 1.0, 8)) == pytest.approx(1.0, abs=1e-5)
