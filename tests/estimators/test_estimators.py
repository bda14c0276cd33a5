"""The scikit-learn contract of DaskClassifier / DaskRegressor on a real LocalCluster."""

import pickle

import cloudpickle
import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import clone
from sklearn.datasets import load_digits, make_classification, make_regression
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, train_test_split
from torch import nn, optim

from adadamp import ConvergenceError, DaskClassifier, DaskRegressor
from adadamp.callbacks import Callback
from adadamp.dampers import Constant


@pytest.fixture(scope="module")
def clf_data():
    X, y = make_classification(n_samples=200, n_features=6, n_informative=4, n_classes=3, random_state=0)
    return X, y


@pytest.fixture(scope="module")
def reg_data():
    X, y = make_regression(n_samples=200, n_features=5, noise=0.1, random_state=0)
    return X, y / y.std()


def test_digits_beats_logistic_regression(client):
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16, y, random_state=0, stratify=y)
    est = DaskClassifier(optimizer__lr=3e-3, batch_size=32, max_epochs=20, random_state=0)
    est.fit(X_train, y_train)
    baseline = LogisticRegression(max_iter=3000).fit(X_train, y_train).score(X_test, y_test)
    assert est.score(X_test, y_test) >= baseline
    assert est.n_features_in_ == 64
    assert list(est.classes_) == list(range(10))
    proba = est.predict_proba(X_test)
    assert proba.shape == (len(X_test), 10)
    np.testing.assert_allclose(proba.sum(axis=1), 1, rtol=1e-5)


def test_regressor_r2(client):
    X, y = make_regression(n_samples=500, n_features=10, noise=1.0, random_state=0)
    y = y / y.std()
    est = DaskRegressor(optimizer__lr=3e-3, batch_size=32, max_epochs=30, random_state=0)
    est.fit(X, y)
    assert est.score(X, y) > 0.95
    assert est.predict(X).shape == (500,)


def test_two_dimensional_regression_targets(client, reg_data):
    X, y = reg_data
    Y = np.stack([y, -y], axis=1)
    est = DaskRegressor(max_epochs=2, random_state=0).fit(X, Y)
    assert est.predict(X).shape == (len(X), 2)


def test_paper_example_runs_as_written(client):
    """Holt & Sievert 2021, "Example usage", with torch tensors and y as a column."""
    from adadamp.dampers import GeoDamp

    class HiddenLayer(nn.Module):
        def __init__(self, features=4, hidden=2, out=1):
            super().__init__()
            self.hidden = nn.Linear(features, hidden)
            self.out = nn.Linear(hidden, out)

        def forward(self, x, *args, **kwargs):
            return self.out(torch.nn.functional.relu(self.hidden(x)))

    X, y = make_regression(n_features=10)
    X = torch.from_numpy(X.astype("float32"))
    y = torch.from_numpy(y.astype("float32")).reshape(-1, 1)

    est = DaskRegressor(
        module=HiddenLayer,
        module__features=10,
        optimizer=optim.Adadelta,
        optimizer__weight_decay=1e-7,
        max_epochs=10,
    )
    est.set_params(batch_size=GeoDamp, batch_size__delay=60, batch_size__factor=5)
    est.fit(X, y)
    assert isinstance(est.damper_, GeoDamp)
    assert est.damper_.delay == 60 and est.damper_.factor == 5
    assert len(est.history_) == 10
    assert est.predict(X).shape == (100, 1)


def test_same_random_state_same_weights_bitwise(client, clf_data):
    X, y = clf_data
    a = DaskClassifier(max_epochs=3, batch_size=16, random_state=7).fit(X, y)
    b = DaskClassifier(max_epochs=3, batch_size=16, random_state=7).fit(X, y)
    for p, q in zip(a.module_.parameters(), b.module_.parameters()):
        assert torch.equal(p, q)
    c = DaskClassifier(max_epochs=3, batch_size=16, random_state=8).fit(X, y)
    assert not torch.equal(next(a.module_.parameters()), next(c.module_.parameters()))


def test_string_and_sparse_labels(client, clf_data):
    X, y = clf_data
    names = np.array(["cat", "dog", "emu"])[y]
    est = DaskClassifier(max_epochs=2, random_state=0).fit(X, names)
    assert list(est.classes_) == ["cat", "dog", "emu"]
    assert set(est.predict(X)) <= {"cat", "dog", "emu"}
    y2 = np.where(y > 0, 7, 3)
    est = DaskClassifier(max_epochs=2, random_state=0).fit(X, y2)
    assert list(est.classes_) == [3, 7]
    assert set(est.predict(X)) <= {3, 7}


def test_pandas_feature_names_and_lists(client, clf_data):
    X, y = clf_data
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    est = DaskClassifier(max_epochs=1, random_state=0).fit(df, y)
    assert list(est.feature_names_in_) == list(df.columns)
    DaskClassifier(max_epochs=1, random_state=0).fit(X.tolist(), y.tolist())


def test_images_are_not_flattened_by_validation(client):
    class TinyCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.fc = nn.Linear(4 * 6 * 6, 2)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 1, 8, 8))
    y = (X.mean(axis=(1, 2, 3)) > 0).astype(int)
    est = DaskClassifier(module=TinyCNN, max_epochs=2, random_state=0).fit(X, y)
    assert est.predict(X).shape == (64,)


class LookAtOptimizer(Callback):
    """Records the momentum buffers the optimizer holds when training begins."""

    def on_train_begin(self, estimator, **info):
        optimizer = estimator._training_state.optimizer
        self.buffers_ = [s["momentum_buffer"].clone() for s in optimizer.state.values()]


def test_partial_fit_is_one_epoch_and_keeps_optimizer_state(client, clf_data):
    X, y = clf_data
    est = DaskClassifier(optimizer=optim.SGD, optimizer__lr=0.05, optimizer__momentum=0.9, batch_size=50)
    est.partial_fit(X[:100], y[:100], classes=[0, 1, 2])
    assert len(est.history_) == 1 and est.history_[0]["n_updates"] == 2
    optimizer = est.optimizer_
    buffers = [s["momentum_buffer"].clone() for s in optimizer.state.values()]
    assert buffers and all(b.abs().sum() > 0 for b in buffers)
    est.set_params(callbacks=[("look", LookAtOptimizer())])
    est.partial_fit(X, y)
    carried = dict(est.callbacks_)["look"].buffers_  # what the second call started from
    assert len(carried) == len(buffers) and all(torch.equal(a, b) for a, b in zip(carried, buffers))
    assert est.optimizer_.param_groups[0]["params"][0] is next(est.module_.parameters())  # steps the model kept
    assert len(est.history_) == 2 and est.history_[1]["n_updates"] == 2 + 4
    assert list(est.classes_) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"does not know: \[5\].*classes="):
        est.partial_fit(X, np.full(len(y), 5))


def test_fit_restarts_unless_warm_start(client, clf_data):
    X, y = clf_data
    est = DaskClassifier(max_epochs=2, random_state=0).fit(X, y)
    first = est.module_
    est.fit(X, y)
    assert est.module_ is not first and len(est.history_) == 2
    est.set_params(warm_start=True).fit(X, y)
    assert len(est.history_) == 4 and est.meta_["n_updates"] == est.history_[-1]["n_updates"]


def test_history_rows(client, reg_data):
    X, y = reg_data
    est = DaskRegressor(max_epochs=2, batch_size=64, random_state=0, min_workers=2).fit(X, y)
    row = est.history_[-1]
    for key in ("epoch", "train_loss", "batch_size", "lr", "n_workers", "n_updates", "n_samples_seen", "dur"):
        assert key in row
    assert row["epoch"] == 2 and row["n_samples_seen"] == 400 and row["n_updates"] == 8
    update = row["updates"][0]
    times = ("compute_time", "comm_time", "send_time", "aggregate_time", "step_time")
    for key in ("batch_size", "lr", "n_workers", "loss", *times, "update_time"):
        assert key in update
    assert update["n_workers"] == 2
    for u in row["updates"]:  # every part is a part of the whole update
        assert all(0 <= u[k] <= u["update_time"] for k in times)
        assert u["compute_time"] + u["comm_time"] + u["aggregate_time"] + u["step_time"] <= u["update_time"]
        assert 0 < u["send_time"]
    with pytest.raises(TypeError):
        est.meta_["n_updates"] = 0


def test_pickle_and_cloudpickle_with_local_module(client, clf_data):
    X, y = clf_data

    class LocalNet(nn.Module):  # not importable: cloudpickle ships it by value
        def __init__(self, width=8):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, 3))

        def forward(self, x):
            return self.net(x)

    est = DaskClassifier(module=LocalNet, module__width=8, max_epochs=1, random_state=0, client=client).fit(X, y)
    expected = est.predict_proba(X)
    again = cloudpickle.loads(cloudpickle.dumps(est))
    np.testing.assert_array_equal(again.predict_proba(X), expected)
    assert again.client is client  # unpickled in its own process: the same client (tests/cluster/test_search_processes.py)
    remote = client.submit(lambda e, data: e.predict_proba(data), est, X).result()
    np.testing.assert_array_equal(remote, expected)
    plain = DaskClassifier(max_epochs=1, random_state=0).fit(X, y)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(plain)).predict(X), plain.predict(X))


@pytest.mark.parametrize("pass_client", [False, True], ids=["current-client", "client-param"])
def test_grid_search_on_users_cluster_picks_by_accuracy(client, clf_data, pass_client):
    X, y = clf_data
    est = DaskClassifier(max_epochs=3, random_state=0, client=client if pass_client else None)
    assert clone(est).client is est.client  # shared, not copied
    grid = GridSearchCV(
        est,
        {"optimizer__lr": [1e-5, 1e-2]},
        cv=3,
    ).fit(X, y)
    assert grid.best_params_ == {"optimizer__lr": 1e-2}
    assert grid.cv_results_["mean_test_score"][1] > grid.cv_results_["mean_test_score"][0]


def test_grid_search_on_embedded_cluster(clf_data):
    from distributed import default_client

    with pytest.raises(ValueError):
        default_client()  # no client active: the fits share the embedded cluster
    X, y = clf_data
    grid = GridSearchCV(DaskClassifier(max_epochs=2, random_state=0), {"batch_size": [32, 64]}, cv=2)
    grid.fit(X, y)
    assert set(grid.cv_results_["param_batch_size"]) == {32, 64}
    assert grid.best_estimator_.meta_["n_workers"] >= 1


def test_damper_class_resolved_with_routed_params(client, reg_data):
    X, y = reg_data
    est = DaskRegressor(batch_size=Constant, batch_size__batch_size=40, max_epochs=1, random_state=0).fit(X, y)
    assert isinstance(est.damper_, Constant) and est.damper_.batch_size == 40
    assert est.history_[0]["n_updates"] == 5
    user_damper = Constant(batch_size=10)
    est = DaskRegressor(batch_size=user_damper, batch_size__batch_size=50, max_epochs=1).fit(X, y)
    assert est.damper_.batch_size == 50 and user_damper.batch_size == 10
    assert clone(est).get_params()["batch_size__batch_size"] == 50


# --------------------------------------------------------------- bad input
BAD_INPUTS = [
    ("nan in X", lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.nan, X), y), "NaN"),
    ("inf in X", lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.inf, X), y), "infinity"),
    ("nan in y", lambda X, y: (X, np.where(np.arange(len(y)) == 2, np.nan, y)), "NaN"),
    ("lengths", lambda X, y: (X, y[:-1]), "inconsistent numbers of samples"),
    ("empty", lambda X, y: (X[:0], y[:0]), "0 sample"),
    ("one sample", lambda X, y: (X[:1], y[:1]), "1 sample"),
    ("non-numeric", lambda X, y: (np.full(X.shape, "a", dtype=object), y), "could not convert"),
]


@pytest.mark.parametrize("name,corrupt,match", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_rejected_before_cluster_work(name, corrupt, match, reg_data, monkeypatch):
    from adadamp.cluster import policy as cluster
    from adadamp.engine import Backend

    def no_cluster(*args, **kwargs):
        raise AssertionError("cluster work started before validation")

    monkeypatch.setattr(cluster, "training_client", no_cluster)
    monkeypatch.setattr(Backend, "__init__", no_cluster)
    X, y = corrupt(*reg_data)
    with pytest.raises(ValueError, match=match):
        DaskRegressor().fit(X, y)


def test_sparse_input_is_rejected(reg_data):
    import scipy.sparse as sp

    X, y = reg_data
    with pytest.raises(TypeError, match="(?i)sparse"):
        DaskRegressor().fit(sp.csr_matrix(X), y)


@pytest.mark.parametrize(
    "params,error,match",
    [
        ({"max_epoch": 3}, ValueError, "Did you mean 'max_epochs'"),
        ({"module_hidden": (3,)}, ValueError, "Did you mean 'module__hidden'"),
        ({"module__hiden": (3,)}, ValueError, "module__hiden is not a parameter of MLP. Did you mean 'hidden'"),
        ({"optimizer__lrr": 0.1}, ValueError, "optimizer__lrr"),
        ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1 or a damper class"),
        ({"batch_size": "big"}, TypeError, "batch_size must be an integer >= 1 or a damper"),
        ({"batch_size__delay": 3}, ValueError, "batch_size=32 is not a damper"),
        ({"max_epochs": 0}, ValueError, "max_epochs must be an integer >= 1"),
        ({"optimizer": "sgd"}, TypeError, "optimizer must be"),
    ],
)
def test_bad_parameters(params, error, match, reg_data):
    X, y = reg_data
    with pytest.raises(error, match=match):
        DaskRegressor(**params).fit(X, y)


def test_output_shape_mismatch_names_both_shapes(reg_data, clf_data):
    X, y = clf_data
    with pytest.raises(ValueError, match=r"output shape \(2, 5\).*expected \(2, 3\)"):
        DaskClassifier(module=nn.Linear, module__in_features=6, module__out_features=5).fit(X, y)
    X, y = reg_data
    with pytest.raises(ValueError, match=r"output shape \(2, 3\).*expected \(2, 1\)"):
        DaskRegressor(module=nn.Linear, module__in_features=5, module__out_features=3).fit(X, y)


def test_failed_fit_keeps_previous_fitted_state(client, clf_data):
    X, y = clf_data
    est = DaskClassifier(max_epochs=1, random_state=0).fit(X, y)
    before = est.predict_proba(X)
    module = est.module_
    with pytest.raises(ValueError):
        est.fit(X[:, :3], y[:-1])
    est.set_params(optimizer__lrr=1)
    with pytest.raises(ValueError):
        est.fit(X, y)
    assert est.module_ is module
    np.testing.assert_array_equal(est.predict_proba(X), before)


def test_divergence_raises_and_keeps_last_finite_weights(client, reg_data):
    X, y = reg_data
    est = DaskRegressor(optimizer=optim.SGD, optimizer__lr=1e6, max_epochs=5, random_state=0)
    with pytest.raises(ConvergenceError, match=r"update \d+ with batch size \d+"):
        est.fit(X, y * 1e3)
    assert all(torch.isfinite(p).all() for p in est.module_.parameters())
    assert np.isfinite(est.predict(X)).all()
    # The kept weights are the last ones whose training loss was finite, not the ones that diverged.
    with torch.no_grad():
        out = est.module_(torch.as_tensor(X, dtype=torch.float32))
        loss = nn.functional.mse_loss(out, torch.as_tensor(y * 1e3, dtype=torch.float32).reshape(out.shape))
    assert torch.isfinite(loss)


def test_batchnorm_running_statistics_come_back_from_the_workers(client):
    class BNNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.bn(x))

    rng = np.random.default_rng(0)
    X = rng.normal(loc=5.0, scale=3.0, size=(256, 4))
    y = (X[:, 0] > 5).astype(int)
    est = DaskClassifier(module=BNNet, optimizer__lr=0.05, max_epochs=5, random_state=0).fit(X, y)
    mean = est.module_.bn.running_mean.numpy()
    np.testing.assert_allclose(mean, X.mean(axis=0), rtol=0.1)  # not the initial zeros
    assert est.score(X, y) > 0.8


def test_client_steps_single_threaded_beside_local_workers_and_restores_threads(client, clf_data):
    """Workers on the client's machine own the cores; the caller's torch threads come back afterwards."""

    class RecordThreads(Callback):
        def on_epoch_end(self, estimator, row=None, **info):
            seen.append(torch.get_num_threads())

    X, y = clf_data
    seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        DaskClassifier(max_epochs=2, random_state=0, callbacks=[RecordThreads()]).fit(X, y)
        assert seen == [1, 1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_batchnorm_share_of_one_example_explains_itself(client):
    class BNNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.bn = nn.BatchNorm1d(2)

        def forward(self, x):
            return self.bn(self.fc(x))

    X = np.random.default_rng(0).normal(size=(20, 4))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match="too few for the module's batch normalization"):
        DaskClassifier(module=BNNet, batch_size=1, max_epochs=1, random_state=0).fit(X, y)


def test_adascale_without_sgd_warns(client, clf_data):
    from adadamp.dampers import AdaScale

    X, y = clf_data
    with pytest.warns(UserWarning, match="AdaScale scales the learning rate of SGD"):
        DaskClassifier(batch_size=AdaScale(batch_size=32), max_epochs=1, random_state=0).fit(X, y)


@pytest.mark.parametrize(
    "params,match",
    [
        ({"max_workers": 1, "min_workers": 2}, r"max_workers must be None or an integer >= min_workers=2; got 1\."),
        ({"update_timeout": float("inf")}, r"update_timeout must be a finite number of seconds > 0"),
        ({"scale_wait": -1}, r"scale_wait must be a finite number of seconds >= 0"),
        ({"validation_fraction": 1.0}, r"validation_fraction must be None or a number in \(0, 1\)"),
        ({"dataset_cache": "yes"}, r"dataset_cache must be True or False; got 'yes'\."),
        ({"device": "gpu0"}, r"device must be a torch device such as 'cpu'"),
        ({"backend": "ring"}, r"backend must be one of \['allreduce', 'parameter-server'\]; got 'ring'\. Use"),
        ({"checkpoint_every": 0}, r"checkpoint_every must be None or an integer >= 1; got 0\. It counts"),
        ({"warm_start": 1}, r"warm_start must be True or False"),
    ],
)
def test_parameter_table_names_the_parameter_and_what_it_takes(params, match, reg_data):
    from adadamp import InvalidParameterError

    X, y = reg_data
    with pytest.raises(InvalidParameterError, match=match) as err:
        DaskRegressor(**params).fit(X, y)
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError)


def test_every_constructor_parameter_is_in_the_table_or_checked_where_used():
    from adadamp.estimators import BaseDaskEstimator

    checked_where_used = {"module", "criterion", "callbacks", "client", "random_state", "checkpoint"}
    table = set(BaseDaskEstimator._parameter_constraints)
    assert table | checked_where_used == set(BaseDaskEstimator._init_param_names())
    assert not table & checked_where_used
