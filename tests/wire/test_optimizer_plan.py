"""A damper's momentum rule and momentum compensation mean something definite for each optimizer
family, and are refused (before any cluster work) where they mean nothing."""

import numpy as np
import pytest
import torch
from sklearn.datasets import make_regression

from adadamp import DaskRegressor
from adadamp.dampers import DynamicSGD, GeoDamp, UpdatePlan
from adadamp.wire.optimizer_plan import apply_plan


@pytest.fixture(scope="module")
def data():
    X, y = make_regression(n_samples=64, n_features=4, random_state=0)
    return X.astype(np.float32), (y / y.std()).astype(np.float32)


@pytest.mark.parametrize(
    ("batch_size", "match"),
    [
        (GeoDamp(initial=8, momentum=0.9), "sets a momentum, but Adadelta has none"),
        (DynamicSGD(batch_size=GeoDamp(initial=8), compensation="velocity"), "rescales a momentum buffer"),
        (DynamicSGD(batch_size=GeoDamp(initial=8, momentum="tang")), "sets a momentum"),
    ],
)
def test_momentum_changes_an_optimizer_cannot_make_are_refused(data, batch_size, match, new_processes):
    X, y = data
    with pytest.raises(ValueError, match=match):  # Adadelta silently ignored them
        DaskRegressor(optimizer=torch.optim.Adadelta, batch_size=batch_size, max_epochs=1).fit(X, y)
    assert new_processes() == []


def _stepped(optimizer_class, **kwargs):
    p = torch.nn.Parameter(torch.ones(3))
    opt = optimizer_class([p], lr=0.1, **kwargs)
    opt.param_groups[0]["adadamp_base_lr"] = 0.1
    p.grad = torch.full((3,), 2.0)
    opt.step()
    return opt


def test_each_family_gets_its_momentum_and_buffer():
    sgd = _stepped(torch.optim.SGD, momentum=0.9)
    before = sgd.state[sgd.param_groups[0]["params"][0]]["momentum_buffer"].clone()
    assert apply_plan(sgd, UpdatePlan(lr_factor=4.0, momentum=0.95, momentum_buffer_scale=0.25)) == 0.4
    assert sgd.param_groups[0]["momentum"] == 0.95
    assert torch.equal(sgd.state[sgd.param_groups[0]["params"][0]]["momentum_buffer"], before * 0.25)

    adam = _stepped(torch.optim.Adam)
    st = adam.state[adam.param_groups[0]["params"][0]]
    m, v = st["exp_avg"].clone(), st["exp_avg_sq"].clone()
    apply_plan(adam, UpdatePlan(lr_factor=2.0, momentum=0.8, momentum_buffer_scale=0.5))
    assert adam.param_groups[0]["betas"] == (0.8, 0.999)
    assert torch.equal(st["exp_avg"], m * 0.5)  # the first moment, as SGD's buffer (it was left alone)
    assert torch.equal(st["exp_avg_sq"], v)

    rms = _stepped(torch.optim.RMSprop, momentum=0.5)
    apply_plan(rms, UpdatePlan(momentum=0.9))
    assert rms.param_groups[0]["momentum"] == 0.9
