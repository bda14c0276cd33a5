"""Batch growth for Adam: AdamScale (adaptdl's square-root gain) and Seesaw (Meterez et al. 2025),
against hand-computed values, and the warnings where a rule meets the other optimizer family."""

import math
import warnings

import pytest
import torch

from adadamp import DaskRegressor
from adadamp.dampers import AdamScale, AdaScale, GeoDamp, GradStats, Seesaw, TrainState, count_updates


def _state(epoch: float = 0.0) -> TrainState:
    return TrainState(0, 0, epoch, n_data=10_000, n_workers=2)


def test_adamscale_applies_the_square_root_of_the_gain():
    # chunks of 4 examples with Q = 16, ||g||^2 = 2.5, k = 2: sigma2 = 6, mu2 = 1 (AdaScale's doctest);
    # b0 = 1, S = 4: r = (6 + 1) / (6/4 + 1) = 2.8
    stats = GradStats(n_samples=4, grad_sq_norm=2.5, chunk_sq_norm_sum=16.0, n_chunks=2)
    ada = AdaScale(batch_size=4, base_batch_size=1).reset(100)
    adam = AdamScale(batch_size=4, base_batch_size=1).reset(100)
    p_ada, p_adam = ada.plan_update(_state(), 4, stats), adam.plan_update(_state(), 4, stats)
    assert ada.gain_ == pytest.approx(2.8) and adam.gain_ == pytest.approx(2.8)
    assert p_ada.lr_factor == pytest.approx(2.8)
    assert p_adam.lr_factor == pytest.approx(math.sqrt(2.8))
    assert p_adam.progress == pytest.approx(2.8)  # the clock advances by the gain, as AdaScale's
    assert adam.tau_ == pytest.approx(2.8)


def test_adamscale_follows_its_lr_schedule_on_the_scale_invariant_clock():
    d = AdamScale(batch_size=8, base_batch_size=2, lr_schedule=lambda t: 0.1 if t >= 3 else 1.0).reset(100)
    noise = GradStats(n_samples=8, grad_sq_norm=0.0, chunk_sq_norm_sum=8.0, n_chunks=2)  # pure noise: r = S = 4
    first = d.plan_update(_state(), 8, noise)
    second = d.plan_update(_state(), 8, noise)
    assert first.lr_factor == pytest.approx(2.0)  # sqrt(4) * lr(0)
    assert second.lr_factor == pytest.approx(0.2)  # sqrt(4) * lr(floor(tau = 4))
    assert d.scheduler_steps(2) == 8


@pytest.mark.parametrize(
    ("epoch", "batch", "lr_factor"),
    [
        (0, 32, 1.0),
        (9.9, 32, 1.0),
        (10, 128, 0.5),  # the batch absorbs factor 4 of the /4 decay; the lr is cut by sqrt(4)
        (20, 512, 0.25),
        (30, 2048, 0.125),
    ],
)
def test_seesaw_grows_the_batch_and_cuts_the_lr_by_the_square_root(epoch, batch, lr_factor):
    d = Seesaw(initial=32, delay=10, factor=4).reset(n_data=10_000)
    s = _state(epoch)
    assert d.next_batch_size(s) == batch
    assert d.plan_update(s, batch, None).lr_factor == pytest.approx(lr_factor)


@pytest.mark.parametrize(
    ("epoch", "lr_factor"),
    [
        (10, math.sqrt(32 / 100) * 100 / 128),  # the batch absorbed 100/32 of the step, the lr the rest
        (20, math.sqrt(32 / 100) * 100 / 512),  # capped: the whole later step is a learning-rate decay
    ],
)
def test_seesaw_capped_batch_turns_the_rest_of_the_step_into_lr_decay(epoch, lr_factor):
    d = Seesaw(initial=32, delay=10, factor=4, max_batch_size=100).reset(n_data=10_000)
    s = _state(epoch)
    assert d.next_batch_size(s) == 100
    assert d.plan_update(s, 100, None).lr_factor == pytest.approx(lr_factor)


def test_seesaw_has_geodamps_batches():
    kw = {"initial": 16, "delay": 3, "factor": 3}
    assert count_updates(Seesaw(**kw), n_data=1000, max_epochs=10) == count_updates(GeoDamp(**kw), 1000, 10)


@pytest.mark.parametrize(
    ("optimizer", "batch_size", "match"),
    [
        (torch.optim.Adam, AdaScale(batch_size=32), "with optimizer=Adam use AdamScale"),
        (torch.optim.SGD, AdamScale(batch_size=32), "with optimizer=SGD use AdaScale"),
        (torch.optim.SGD, Seesaw(initial=32), "with optimizer=SGD use GeoDamp"),
    ],
)
def test_a_rule_of_the_other_family_warns(client, regression_data, optimizer, batch_size, match):
    X, y = regression_data
    with pytest.warns(UserWarning, match=match):
        DaskRegressor(optimizer=optimizer, batch_size=batch_size, max_epochs=1, random_state=0).fit(X, y)


def test_adamscale_fit_with_adam(client, regression_data):
    X, y = regression_data
    est = DaskRegressor(
        optimizer=torch.optim.Adam,
        optimizer__lr=0.01,
        batch_size=AdamScale(batch_size=64, base_batch_size=16),
        max_epochs=2,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the matching family: no warning
        est.fit(X, y)
    last = est.history_[-1]["updates"][-1]
    assert 1.0 < est.damper_.gain_ <= 4.0
    assert last["lr"] == pytest.approx(0.01 * math.sqrt(est.damper_.gain_), rel=1e-9)
