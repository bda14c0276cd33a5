"""``sample_weight`` in fit and partial_fit (issue 35): the weighted mean loss, its gradient and
AdaScale's statistics, checked against a hand-computed PyTorch update and against invariances."""

import dask.array as da
import numpy as np
import pytest
import torch
from sklearn.model_selection import GridSearchCV
from torch import nn

from adadamp import DaskClassifier, DaskRegressor
from adadamp.dampers import AdaScale


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5)).astype(np.float32)
    y = (X @ rng.normal(size=5) + 0.1 * rng.normal(size=n)).astype(np.float32)
    w = rng.uniform(0, 3, size=n)
    return X, y, w


SGD = {"optimizer": torch.optim.SGD, "optimizer__lr": 0.1, "module__hidden": (8,), "random_state": 0}


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_one_full_batch_update_is_the_weighted_mean_losss_gradient_step(client, task):
    """Oracle: one update over the whole data equals PyTorch's step on sum(w * loss) / sum(w)."""
    X, y, w = _data()
    if task == "classification":
        y = (y > 0).astype(np.int64)
        Est, criterion = DaskClassifier, nn.CrossEntropyLoss(reduction="none")
    else:
        Est, criterion = DaskRegressor, nn.MSELoss(reduction="none")
    params = {**SGD, "batch_size": len(X), "max_epochs": 1}
    start = Est(**{**params, "optimizer__lr": 0.0}).fit(X, y, sample_weight=w)  # the same initial weights
    trained = Est(**params).fit(X, y, sample_weight=w)

    module = start.module_
    out = module(torch.from_numpy(X))
    target = torch.from_numpy(y)
    if task == "regression":
        out = out.reshape(-1)
    wt = torch.from_numpy(w).float()
    loss = (wt * criterion(out, target)).sum() / wt.sum()
    loss.backward()
    with torch.no_grad():
        expected = torch.cat([(p - 0.1 * p.grad).reshape(-1) for p in module.parameters()]).numpy()
    np.testing.assert_allclose(_weights(trained), expected, rtol=1e-5, atol=1e-6)
    assert trained.history_[0]["train_loss"] == pytest.approx(loss.item(), rel=1e-5)
    unweighted = Est(**params).fit(X, y)
    assert not np.allclose(_weights(unweighted), _weights(trained), atol=1e-4)


def test_unit_weights_and_scaled_weights_train_as_no_weights_with_adascale(client):
    """w = 1 (or any constant) is the unweighted fit: the same loss, gradient and AdaScale gain."""
    X, y, _ = _data(n=256)
    params = {**SGD, "batch_size": AdaScale, "batch_size__batch_size": 64, "batch_size__base_batch_size": 16, "max_epochs": 3}
    plain = DaskRegressor(**params).fit(X, y)
    ones = DaskRegressor(**params).fit(X, y, sample_weight=np.ones(len(X)))
    scaled = DaskRegressor(**params).fit(X, y, sample_weight=np.full(len(X), 7.0))
    np.testing.assert_allclose(_weights(ones), _weights(plain), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_weights(ones), _weights(scaled))
    gains = [[u["lr"] for r in est.history_ for u in r["updates"]] for est in (plain, ones)]
    np.testing.assert_allclose(gains[0], gains[1], rtol=1e-5)


def test_examples_of_zero_weight_do_not_change_the_fit(client):
    """Whatever the targets of zero-weight examples, the weights trained are the same."""
    X, y, w = _data(n=128)
    w[::2] = 0.0
    noisy = y.copy()
    noisy[::2] = 1e3
    params = {**SGD, "batch_size": 32, "max_epochs": 2, "validation_fraction": 0.25}
    a = DaskRegressor(**params).fit(X, y, sample_weight=w)
    b = DaskRegressor(**params).fit(X, noisy, sample_weight=w)
    np.testing.assert_allclose(_weights(a), _weights(b), rtol=1e-5, atol=1e-6)
    assert a.history_[-1]["valid_loss"] == pytest.approx(b.history_[-1]["valid_loss"], rel=1e-5)


def test_dask_weights_train_as_numpy_weights_and_partial_fit_takes_them(client):
    X, y, w = _data(n=128)
    params = {**SGD, "batch_size": 32, "max_epochs": 2}
    numpy_fit = DaskRegressor(**params).fit(X, y, sample_weight=w)
    chunks = 32
    dask_fit = DaskRegressor(**params).fit(da.from_array(X, chunks=chunks), da.from_array(y, chunks=chunks),
                                           sample_weight=da.from_array(w, chunks=chunks))
    np.testing.assert_allclose(_weights(dask_fit), _weights(numpy_fit), rtol=1e-4, atol=1e-6)
    partial = DaskRegressor(**params)
    for _ in range(2):
        partial.partial_fit(X, y, sample_weight=w)
    np.testing.assert_allclose(_weights(partial), _weights(numpy_fit), rtol=1e-5, atol=1e-6)


def test_grid_search_routes_sample_weight_to_each_fit(client):
    """GridSearchCV slices sample_weight per fold: examples of zero weight change nothing there too."""
    X, y, w = _data(n=128)
    w[::2] = 0.0
    noisy = y.copy()
    noisy[::2] = 1e3
    search = {"param_grid": {"optimizer__lr": [0.05, 0.1]}, "cv": 2, "scoring": "neg_mean_squared_error"}
    est = DaskRegressor(**{**SGD, "batch_size": 32, "max_epochs": 1})
    a = GridSearchCV(est, **search).fit(X, y, sample_weight=w)
    b = GridSearchCV(est, **search).fit(X, noisy, sample_weight=w)
    np.testing.assert_allclose(_weights(a.best_estimator_), _weights(b.best_estimator_), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        (-np.ones(8), "non-negative"),
        (np.r_[np.ones(7), np.nan], "NaN or infinity"),
        (np.ones(5), r"shape == \(5,\), expected \(8,\)"),
        (np.zeros(8), "every weight is zero"),
    ],
)
def test_bad_sample_weight_is_refused_before_any_cluster_work(weights, match):
    X, y, _ = _data(n=8)
    with pytest.raises(ValueError, match=match):
        DaskRegressor(client=_NoCluster()).fit(X, y, sample_weight=weights)


def test_unknown_fit_arguments_name_what_fit_takes():
    X, y, _ = _data(n=8)
    with pytest.raises(TypeError, match=r"DaskRegressor.fit got unexpected keyword argument\(s\) \['weights'\]"):
        DaskRegressor().fit(X, y, weights=np.ones(8))


class _NoCluster:
    """A client that fails any use: the errors must come before the cluster is touched."""

    status = "running"

    def __getattr__(self, name):
        raise AssertionError(f"the cluster was used ({name}) before the input was checked")


def test_the_allreduce_backend_trains_the_same_weighted_loss(client):
    X, y, w = _data(n=128)
    params = {**SGD, "batch_size": 32, "max_epochs": 2}
    server = DaskRegressor(**params).fit(X, y, sample_weight=w)
    allreduce = DaskRegressor(**params, backend="allreduce").fit(X, y, sample_weight=w)
    np.testing.assert_allclose(_weights(allreduce), _weights(server), rtol=1e-5, atol=1e-6)


def test_integer_weights_train_as_repeated_examples_up_to_float32_rounding(client):
    """scikit-learn's check_sample_weight_equivalence_on_dense_data, at float32's resolution: a
    weight of k and k copies of the example give the same fit up to the summation order."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(15, 4)).astype(np.float32)
    y = X @ rng.normal(size=4).astype(np.float32)
    w = rng.integers(0, 4, size=15)
    params = {"batch_size": 64, "max_epochs": 5, "random_state": 0}
    weighted = DaskRegressor(**params).fit(X, y, sample_weight=w)
    repeated = DaskRegressor(**params).fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    np.testing.assert_allclose(weighted.predict(X), repeated.predict(X), rtol=1e-5, atol=1e-6)
