"""torch learning-rate schedulers as an LRScheduler callback: composed with the damper's lr factor,
stepped in the damper's clock, continued across partial_fit, validated before any cluster work."""

import math
import pickle

import numpy as np
import pytest
import torch

from adadamp import DaskRegressor, LRScheduler
from adadamp.dampers import AdaScale, GeoDampLR

BASE_LR = 0.01


def _lrs(est) -> list[float]:
    return [u["lr"] for row in est.history_ for u in row["updates"]]


def _sgd(callback=None, **params) -> DaskRegressor:
    return DaskRegressor(
        optimizer=torch.optim.SGD,
        optimizer__lr=BASE_LR,
        random_state=0,
        callbacks=None if callback is None else [("lr", callback)],
        **params,
    )


def test_step_lr_takes_effect_per_update(client, regression_data):
    X, y = regression_data  # 256 examples, batch 32: 8 updates per epoch
    est = _sgd(LRScheduler(policy="StepLR", step_size=3, gamma=0.5, step_every="batch"), batch_size=32, max_epochs=2)
    est.fit(X, y)
    # before the callback, the engine rewrote the lr from the base lr every update: StepLR had no effect
    assert _lrs(est) == [BASE_LR * 0.5 ** (k // 3) for k in range(16)]
    assert "adadamp_scheduled_lr" not in est.optimizer_.param_groups[0]  # the schedule lives for the fit
    pickle.loads(pickle.dumps(est))


def test_composes_multiplicatively_with_the_damper_factor(client, regression_data):
    X, y = regression_data
    cosine = LRScheduler(policy=torch.optim.lr_scheduler.CosineAnnealingLR, T_max=4)
    est = _sgd(cosine, batch_size=GeoDampLR(initial=64, delay=1, factor=2), max_epochs=4)
    est.fit(X, y)
    for epoch, row in enumerate(est.history_):
        scheduled = BASE_LR * (1 + math.cos(math.pi * epoch / 4)) / 2
        for u in row["updates"]:
            assert u["lr"] == pytest.approx(scheduled * 0.5**epoch, rel=1e-12)


def test_partial_fit_continues_the_schedule(client, regression_data):
    X, y = regression_data
    make = lambda: LRScheduler(policy="ExponentialLR", gamma=0.9, step_every="batch")
    whole = _sgd(make(), batch_size=64, max_epochs=3).fit(X, y)
    parts = _sgd(make(), batch_size=64, max_epochs=1)
    for _ in range(3):
        parts.partial_fit(X, y)
    assert _lrs(parts) == pytest.approx(_lrs(whole), rel=1e-12)
    assert _lrs(whole)[-1] == pytest.approx(BASE_LR * 0.9**11, rel=1e-12)


def half_every_8(t: int) -> float:
    return 0.5 ** (t // 8)


def test_adascale_steps_the_scheduler_in_scale_invariant_iterations(client, regression_data):
    """lr = r * lr(floor(tau)) (Johnson et al. 2020, Alg. 2), whether the schedule is AdaScale's
    own lr_schedule or a torch scheduler stepped per update."""
    X, y = regression_data
    own = _sgd(batch_size=AdaScale(batch_size=64, base_batch_size=16, lr_schedule=half_every_8), max_epochs=2)
    own.fit(X, y)
    torch_sched = _sgd(
        LRScheduler(policy="LambdaLR", lr_lambda=half_every_8, step_every="batch"),
        batch_size=AdaScale(batch_size=64, base_batch_size=16),
        max_epochs=2,
    ).fit(X, y)
    assert _lrs(torch_sched) == pytest.approx(_lrs(own), rel=1e-9)
    assert own.damper_.tau_ > 8  # the schedule stepped (in tau, not in the 8 model updates)
    assert min(_lrs(own)) < max(_lrs(own))


def test_reduce_on_plateau_steps_on_the_epoch_metric(client, regression_data):
    X, y = regression_data
    plateau = LRScheduler(policy="ReduceLROnPlateau", factor=0.1, patience=0, threshold=10.0)  # never "improves"
    est = _sgd(plateau, batch_size=64, max_epochs=3).fit(X, y)
    per_epoch = [row["lr"] for row in est.history_]
    assert per_epoch == pytest.approx([BASE_LR, BASE_LR * 0.1, BASE_LR * 0.01], rel=1e-12)


@pytest.mark.parametrize(
    ("callback", "error", "match"),
    [
        (LRScheduler(policy="NoSuchLR"), TypeError, "policy must be a class of torch.optim.lr_scheduler"),
        (LRScheduler(policy="CosineAnnealingLR"), TypeError, "CosineAnnealingLR"),  # T_max missing
        (LRScheduler(policy="StepLR", step_size=2, step_every="update"), ValueError, "step_every"),
        (LRScheduler(policy="ReduceLROnPlateau", step_every="batch"), ValueError, "epoch metric"),
    ],
)
def test_bad_schedulers_are_refused_before_cluster_work(callback, error, match, regression_data, new_processes):
    X, y = regression_data
    with pytest.raises(error, match=match):
        _sgd(callback, max_epochs=1).fit(X, y)
    assert new_processes() == []


def test_parameters_route_and_clone():
    from sklearn.base import clone

    est = _sgd(LRScheduler(policy="StepLR", step_size=2)).set_params(callbacks__lr__gamma=0.3)
    from adadamp.callbacks import resolve
    from adadamp.estimators.fitting import routed

    (_, cb), = resolve(est.callbacks, routed(est.get_params(deep=False), "callbacks"))
    assert (cb.step_size, cb.gamma) == (2, 0.3)
    assert clone(cb).get_params() == {"policy": "StepLR", "step_every": "epoch", "monitor": "train_loss",
                                      "step_size": 2, "gamma": 0.3}
    assert np.isclose(cb._build([1.0]).get_last_lr()[0], 1.0)
