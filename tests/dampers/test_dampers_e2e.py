"""Dampers driven by the real engine on the shared LocalCluster."""

import numpy as np
import pytest
import torch
from sklearn.datasets import make_regression
from sklearn.model_selection import GridSearchCV

from adadamp import AdaScale, DaskRegressor, DynamicSGD, GeoDamp, PadaDamp


@pytest.fixture(scope="module")
def data():
    X, y = make_regression(n_samples=256, n_features=6, noise=0.1, random_state=0)
    return X, y / y.std()


def test_geodamp_grows_the_batch(client, data):
    X, y = data
    est = DaskRegressor(batch_size=GeoDamp, batch_size__initial=16, batch_size__delay=1, batch_size__factor=2,
                        max_epochs=4, random_state=0)
    est.fit(X, y)
    assert est.damper_.delay == 1 and est.damper_.factor == 2  # O23: routed params reach the damper
    assert [row["batch_size"] for row in est.history_] == [16, 32, 64, 128]
    assert [row["n_updates"] for row in est.history_] == [16, 24, 28, 30]


def test_geodamp_cap_decays_the_learning_rate(client, data):
    X, y = data
    est = DaskRegressor(
        batch_size=GeoDamp(initial=16, delay=1, factor=2, max_batch_size=32),
        optimizer=torch.optim.SGD,
        optimizer__lr=0.01,
        max_epochs=3,
        random_state=0,
    ).fit(X, y)
    assert [row["batch_size"] for row in est.history_] == [16, 32, 32]
    np.testing.assert_allclose([row["lr"] for row in est.history_], [0.01, 0.01, 0.005])


def test_grid_search_over_damper_params_and_instances(client, data):
    X, y = data
    grid = GridSearchCV(
        DaskRegressor(batch_size=GeoDamp, max_epochs=2, random_state=0, optimizer__lr=0.01),
        [
            {"batch_size__delay": [1, 2], "batch_size__factor": [2, 4]},
            {"batch_size": [GeoDamp(initial=8, delay=1), PadaDamp(initial=8, rate=1)]},
        ],
        cv=2,
    ).fit(X, y)
    assert len(grid.cv_results_["params"]) == 6
    assert np.isfinite(grid.cv_results_["mean_test_score"]).all()
    assert grid.best_score_ == max(grid.cv_results_["mean_test_score"])


def test_adascale_gets_chunk_statistics_and_drives_the_clock(client, data):
    X, y = data
    est = DaskRegressor(
        batch_size=AdaScale(batch_size=GeoDamp(initial=8, delay=1, factor=4)),
        optimizer=torch.optim.SGD,
        optimizer__lr=0.01,
        max_epochs=3,
        random_state=0,
    ).fit(X, y)
    damper = est.damper_
    lrs = [u["lr"] for row in est.history_ for u in row["updates"]]
    assert max(lrs) > 0.01 * 1.5  # the gain ratio raised the learning rate once the batch grew
    assert len(est.history_) == 3
    # scale-invariant epochs: the clock advanced by r * b0 per update, so fewer data epochs were used
    assert est.loop_.epoch == pytest.approx(3, abs=0.5)
    assert est.loop_.n_samples_seen >= 3 * len(X)
    assert damper is est.damper_


def test_dynamic_sgd_in_elastic_mode_follows_the_workers(client, data):
    X, y = data
    est = DaskRegressor(
        batch_size=DynamicSGD(per_worker_batch=16),
        optimizer=torch.optim.SGD,
        optimizer__lr=0.01,
        optimizer__momentum=0.9,
        max_epochs=1,
        random_state=0,
    ).fit(X, y)
    assert {u["batch_size"] for u in est.history_[0]["updates"]} == {32}  # 2 live workers x 16


@pytest.mark.parametrize(
    "damper,match",
    [
        (GeoDamp(factor=0.5), "factor"),
        (GeoDamp(delay=0), "delay"),
        (GeoDamp(initial=64, max_batch_size=8), "max_batch_size"),
        (AdaScale(smoothing=1.5), "smoothing"),
    ],
)
def test_bad_damper_parameters_fail_at_fit(damper, match, data):
    X, y = data
    with pytest.raises(ValueError, match=match):
        DaskRegressor(batch_size=damper).fit(X, y)


def test_unknown_damper_parameter(data):
    X, y = data
    with pytest.raises(ValueError, match="batch_size__dealy"):
        DaskRegressor(batch_size=GeoDamp, batch_size__dealy=3).fit(X, y)
