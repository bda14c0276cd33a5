"""Training data that stays in Dask: a dask array's partitions are the engine's blocks, checked and
encoded on the cluster, placed by tasks on the workers (never through the client), and recomputed
from their lineage when a worker holding them dies."""

import dask  # noqa: F401
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import torch
from distributed import wait

from adadamp import DaskClassifier, DaskRegressor


def _weights(est):
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


@pytest.fixture(scope="module")
def clf_arrays():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6)).astype(np.float32)
    y = np.where(X[:, 0] + X[:, 1] > 0, "yes", "no")
    return X, y


def _no_client_materialisation(monkeypatch):
    """Any np.asarray(X) / X.compute() of a dask array in this (the client's) process fails."""

    def refuse(*args, **kwargs):
        raise AssertionError("a dask array was materialised on the client")

    monkeypatch.setattr(da.Array, "__array__", refuse)
    monkeypatch.setattr(da.Array, "compute", refuse)


def test_dask_array_trains_like_numpy_without_the_client_reading_it(client, clf_arrays, monkeypatch):
    X, y = clf_arrays
    params = {"module__hidden": (16,), "optimizer": torch.optim.SGD, "optimizer__lr": 0.05, "batch_size": 32,
              "max_epochs": 3, "random_state": 0}
    numpy_fit = DaskClassifier(**params).fit(X, y)
    dX, dy = da.from_array(X, chunks=64), da.from_array(y, chunks=64)
    _no_client_materialisation(monkeypatch)  # the old code computed X on the client: this refused it
    dask_fit = DaskClassifier(**params).fit(dX, dy)
    # the same seeded permutation and examples: the same weights up to float summation order
    np.testing.assert_allclose(_weights(dask_fit), _weights(numpy_fit), rtol=1e-4, atol=1e-6)
    assert list(dask_fit.classes_) == ["no", "yes"] and dask_fit.n_features_in_ == 6
    assert [u["batch_size"] for r in dask_fit.history_ for u in r["updates"]] == [
        u["batch_size"] for r in numpy_fit.history_ for u in r["updates"]
    ]


def test_unknown_chunk_sizes_and_dataframes(client):
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(rng.normal(size=(200, 4)), columns=list("abcd"))
    frame["target"] = frame["a"] * 2 - frame["b"]
    ddf = dd.from_pandas(frame, npartitions=3)
    X, y = ddf[list("abcd")], ddf["target"]
    unknown = X.to_dask_array()  # chunk sizes along axis 0 unknown (NaN)
    assert np.isnan(unknown.chunks[0][0])
    est = DaskRegressor(max_epochs=2, batch_size=25, random_state=0).fit(X, y)
    assert list(est.feature_names_in_) == list("abcd") and est._y_1d
    est2 = DaskRegressor(max_epochs=1, batch_size=25, random_state=0).fit(unknown, y.to_dask_array())
    assert est2.meta_["n_samples_seen"] == 200
    assert est.predict(frame[list("abcd")]).shape == (200,)


def _frame_with_a_category(rows=200):
    rng = np.random.default_rng(2)
    frame = pd.DataFrame(rng.normal(size=(rows, 3)), columns=list("abc"))
    frame["colour"] = pd.Categorical(rng.choice(["red", "green", "blue"], size=rows))
    target = pd.Series(np.where(frame["a"] + (frame["colour"] == "red") > 0.5, 1, 0), name="target")
    return dd.from_pandas(frame, npartitions=4), dd.from_pandas(target, npartitions=4)


def test_a_category_column_is_refused_before_any_cluster_work():
    """It failed on a worker with ``could not convert string to float``; now it is refused from the
    frame's metadata, with the fix named, and no cluster is started."""
    from adadamp.cluster.embedded import embedded_cluster

    X, y = _frame_with_a_category()
    assert embedded_cluster() is None
    with pytest.raises(TypeError, match=r"'colour' \(category\).*Categorizer and DummyEncoder"):
        DaskClassifier(max_epochs=1).fit(X, y)
    assert embedded_cluster() is None
    with pytest.raises(TypeError, match="not numbers"):
        DaskClassifier(max_epochs=1).fit(X.assign(colour=X["colour"].astype(str)), y)


def test_the_named_fix_trains_on_a_category_column(client):
    """dask-ml's Categorizer and DummyEncoder before the estimator, as the error says."""
    dask_ml = pytest.importorskip("dask_ml.preprocessing", reason="dask-ml is in the test extra: pip install -e .[test]")
    from sklearn.pipeline import make_pipeline

    X, y = _frame_with_a_category()
    pipe = make_pipeline(dask_ml.Categorizer(), dask_ml.DummyEncoder(),
                         DaskClassifier(max_epochs=2, batch_size=25, random_state=0)).fit(X, y)
    assert list(pipe[-1].feature_names_in_) == ["a", "b", "c", "colour_blue", "colour_green", "colour_red"]
    assert pipe.predict(X).compute().shape == (200,)


@pytest.mark.parametrize(
    ("X", "y", "match"),
    [
        (da.from_array(np.array([[0.0, np.nan]] * 10), chunks=5), da.zeros(10, chunks=5), "NaN or infinity"),
        (da.zeros((10, 2), chunks=5), None, "needs its targets y"),
        (da.zeros((10, 2), chunks=5), da.zeros(9, chunks=5), "different numbers of examples"),
    ],
)
def test_bad_dask_input_is_refused_on_the_cluster_before_training(client, X, y, match):
    with pytest.raises(ValueError, match=match):
        DaskRegressor(max_epochs=1).fit(X, y)


def test_classes_come_from_the_cluster_and_unknown_labels_are_refused(client, clf_arrays):
    X, y = clf_arrays
    dX, dy = da.from_array(X, chunks=100), da.from_array(y, chunks=100)
    with pytest.raises(ValueError, match="labels not in classes"):
        DaskClassifier(max_epochs=1).partial_fit(dX, dy, classes=["yes"])
    est = DaskClassifier(max_epochs=1, random_state=0).partial_fit(dX, dy, classes=["no", "yes", "maybe"])
    assert list(est.classes_) == ["maybe", "no", "yes"]


def test_blocks_go_where_dask_holds_them(client, clf_arrays):
    """With the partitions persisted on the workers, placing the fit's blocks moves nothing."""
    X, y = clf_arrays
    dX, dy = client.persist([da.from_array(X, chunks=50), da.from_array(y, chunks=50)])
    wait([dX, dy])
    before = client.who_has(client.futures_of(dX))
    est = DaskClassifier(max_epochs=1, random_state=0, batch_size=64, min_workers=2).fit(dX, dy)  # both workers
    assert est.meta_["n_samples_seen"] == 300
    assert client.who_has(client.futures_of(dX)) == before  # no partition was copied elsewhere


def test_a_killed_workers_partitions_are_recomputed_from_their_lineage():
    """X made on the workers (no client copy exists): a worker SIGKILLed mid-fit takes its partitions
    with it, Dask recomputes them for the survivor, and the fit completes every epoch."""
    import os
    import signal

    from distributed import Client, LocalCluster

    from adadamp.callbacks import Callback

    class KillAWorker(Callback):
        def __init__(self, at=5):
            self.at = at

        def on_update_end(self, estimator, record=None, loop=None, **info):
            if loop.n_updates == self.at:
                pids = estimator.client.run(os.getpid)
                os.kill(pids[max(pids)], signal.SIGKILL)

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, processes=True) as cluster,
        Client(cluster) as c,
    ):
        X = da.random.RandomState(0).normal(size=(400, 5), chunks=50).astype(np.float32)
        y = X.sum(axis=1)
        est = DaskRegressor(client=c, max_epochs=3, batch_size=40, random_state=0, min_workers=2,
                            callbacks=[KillAWorker()])
        est.fit(X, y)
        updates = [u for row in est.history_ for u in row["updates"]]
        assert est.meta_["n_samples_seen"] == 3 * 400 and len(updates) == 30
        assert min(u["n_workers"] for u in updates[5:]) == 1  # trained on the survivor meanwhile
        assert np.isfinite(est.history_[-1]["train_loss"])


def test_predict_on_dask_runs_on_the_workers_and_returns_dask(client, clf_arrays, monkeypatch):
    from sklearn.metrics import r2_score

    X, y = clf_arrays
    clf = DaskClassifier(max_epochs=2, random_state=0).fit(X, y)
    dX = da.from_array(X, chunks=70)
    _no_client_materialisation(monkeypatch)  # predicting must not pull X to the client
    proba, labels = clf.predict_proba(dX), clf.predict(dX)
    assert isinstance(proba, da.Array) and isinstance(labels, da.Array)
    assert proba.chunks[0] == dX.chunks[0]
    graph = dict(proba.__dask_graph__())
    modules = [k for k, v in graph.items() if isinstance(getattr(v, "value", v), torch.nn.Module)]
    assert len(modules) == 1  # the weights are one key, sent once per worker
    monkeypatch.undo()
    np.testing.assert_allclose(proba.compute(), clf.predict_proba(X), rtol=1e-6)
    assert (labels.compute() == clf.predict(X)).all()
    assert clf.score(dX, da.from_array(y, chunks=70)) == pytest.approx(clf.score(X, y))
    weights = np.linspace(0.5, 2.0, len(y))
    assert clf.score(dX, y, sample_weight=weights) == pytest.approx(clf.score(X, y, sample_weight=weights))

    target = np.stack([X[:, 0] - X[:, 1], X[:, 2]], axis=1).astype(np.float32)
    reg = DaskRegressor(max_epochs=2, random_state=0).fit(X, target)
    pred = reg.predict(dX)
    assert isinstance(pred, da.Array) and pred.shape == target.shape
    np.testing.assert_allclose(pred.compute(), reg.predict(X), rtol=1e-6)
    assert reg.score(dX, da.from_array(target, chunks=70)) == pytest.approx(r2_score(target, reg.predict(X)))
    one = DaskRegressor(max_epochs=1, random_state=0).fit(X, target[:, 0])
    assert one.predict(dX).compute().shape == (len(X),)


def _fit_segments_shared_with_dask(dask_worker, fits: set[str]) -> list[bool]:
    """On a worker: for each block segment of the running ``fits``, whether it is Dask's partition
    itself (an earlier test's fit may still be held here, its partitions released by Dask)."""
    from adadamp.worker import plugin as _worker

    held = [v for v in dask_worker.data.values() if isinstance(v, np.ndarray)]
    return [
        any(np.shares_memory(X, a) for a in held) and X_dev.data_ptr() == X.ctypes.data
        for fit, state in _worker.TRAINER.fits.items() if fit in fits
        for X, _, X_dev, _ in state.data._segments.values()
    ]


def test_workers_hold_each_example_once(client, new_fits):
    """A dask partition placed on a worker is trained on where Dask holds it: no second copy."""
    from adadamp.callbacks import Callback

    seen = []

    class Look(Callback):
        def on_epoch_end(self, estimator, row=None, **info):
            mine = new_fits()
            assert len(mine) == 1, mine
            seen.extend(v for values in client.run(_fit_segments_shared_with_dask, fits=mine).values() for v in values)

    rng = np.random.default_rng(2)
    # Each half on its own worker, as the fit's two shards (runs of consecutive partitions) are
    # placed: where Dask holds partitions across shards, the fit moves (copies) the minority.
    halves = []
    for k, worker in enumerate(sorted(client.scheduler_info()["workers"])[:2]):
        X_half = da.from_array(rng.normal(size=(200, 5)).astype(np.float32), chunks=50, name=f"half-{k}")
        halves.append(client.persist([X_half, X_half.sum(axis=1)], workers=[worker]))
    wait(halves)
    X = da.concatenate([h[0] for h in halves])
    y = da.concatenate([h[1] for h in halves])
    DaskRegressor(max_epochs=1, batch_size=40, random_state=0, min_workers=2, callbacks=[Look()]).fit(X, y)
    assert len(seen) == 8 and all(seen), seen  # 8 partitions, each one a view of Dask's own array
