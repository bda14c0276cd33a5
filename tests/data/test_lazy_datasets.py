"""Lazy map-style torch Datasets: read on the workers example by example, augmentation seeded per
(seed, epoch, example), loading ahead of the compute (issue 15, item 2)."""

import os

import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits

from adadamp import DaskClassifier, DaskRegressor
from adadamp.engine import LoopState, Sampler
from adadamp.worker.loading import ExampleLoader, example_seed, float_targets


class ClientForbidden(torch.utils.data.Dataset):
    """Raises when indexed in the process that made it (the client); optionally noisy (augmented)."""

    def __init__(self, X, y, noise=0.0, fail_at=None, log_dir=None, targets=False):
        self.X, self.y, self.noise, self.fail_at, self.log_dir = X, y, noise, fail_at, log_dir
        self.pid = os.getpid()
        if targets:
            self.targets = list(y)

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        if os.getpid() == self.pid:
            raise AssertionError(f"example {i} was read in the client process")
        if i == self.fail_at:
            raise OSError(f"cannot decode example {i}")
        if self.log_dir is not None:
            with open(os.path.join(self.log_dir, f"reads-{os.getpid()}"), "a") as f:
                f.write(f"{i}\n")
        x = torch.from_numpy(self.X[i])
        if self.noise:
            x = x + self.noise * torch.randn(x.shape)  # a random transform on torch's global generator
        return x, self.y[i]


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return (X[:600] / 16).astype(np.float32), y[:600]


def _weights(est):
    return torch.cat([p.detach().flatten() for p in est.module_.parameters()]).numpy()


def test_the_client_never_reads_an_example(client, digits):
    X, y = digits
    ds = ClientForbidden(X, y, noise=0.05)
    est = DaskClassifier(max_epochs=2, batch_size=64, random_state=0).fit(ds)
    assert list(est.classes_) == list(range(10)) and est.n_features_in_ == 64
    assert est.predict(ds).shape == (len(X),)
    assert est.predict_proba(ds).shape == (len(X), 10)
    assert 0.5 < est.score(ds) <= 1.0
    est.partial_fit(ds)  # a warm call too
    assert est.n_iter_ == 3


def test_a_dataset_trains_as_its_arrays(client, digits):
    """No random transforms: the same seed gives the same weights as fitting on the arrays."""
    X, y = digits
    from_arrays = DaskClassifier(max_epochs=2, batch_size=64, random_state=3).fit(X, y)
    from_dataset = DaskClassifier(max_epochs=2, batch_size=64, random_state=3).fit(ClientForbidden(X, y))
    np.testing.assert_allclose(_weights(from_dataset), _weights(from_arrays), rtol=0, atol=1e-6)
    assert from_dataset.history_[-1]["n_samples_seen"] == from_arrays.history_[-1]["n_samples_seen"]


def test_augmentation_is_reproducible_whatever_the_workers(client, digits):
    """Random transforms seeded per (seed, epoch, example): the same fit bitwise, and the same
    weights (up to float summation order) on one worker as on two."""
    X, y = digits
    ds = ClientForbidden(X, y, noise=0.1)
    kwargs = {"max_epochs": 2, "batch_size": 64, "random_state": 1, "min_workers": 2}  # on every worker, up to 2
    a = DaskClassifier(**kwargs).fit(ds)
    b = DaskClassifier(**kwargs).fit(ds)
    np.testing.assert_array_equal(_weights(a), _weights(b))
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as one_worker:
        one = DaskClassifier(**kwargs, client=one_worker).fit(ds)
    assert {u["n_workers"] for row in one.history_ for u in row["updates"]} == {1}
    assert {u["n_workers"] for row in a.history_ for u in row["updates"]} == {2}
    np.testing.assert_allclose(_weights(one), _weights(a), rtol=0, atol=1e-5)
    plain = DaskClassifier(**kwargs).fit(X, y)  # augmentation changed what was trained
    assert np.abs(_weights(plain) - _weights(a)).max() > 1e-3


def test_each_example_is_augmented_anew_every_epoch():
    X = np.zeros((8, 3), dtype=np.float32)
    ds = ClientForbidden(X, np.arange(8), noise=1.0)
    ds.pid = -1  # this test reads in-process
    one = ExampleLoader(ds, seed=5, encode=np.asarray, threads=1)
    other = ExampleLoader(ds, seed=5, encode=np.asarray, threads=4)  # another worker, more threads
    try:
        other.prefetch(range(8))  # epoch 0: keys are the indices
        x0, y0 = one.load(0, [6, 2])
        np.testing.assert_array_equal(other.load(0, [6, 2])[0], x0)  # same example, epoch, seed: same draw
        assert y0.tolist() == [6, 2]
        x1, _ = one.load(1, [6, 2])
        assert not np.allclose(x1, x0)  # the next epoch draws anew
        reseeded = ExampleLoader(ds, seed=6, encode=np.asarray, threads=1)
        assert not np.allclose(reseeded.load(0, [6, 2])[0], x0)
        reseeded.close()
    finally:
        one.close()
        other.close()
    assert example_seed(5, 0, 6) != example_seed(5, 0, 7)


def test_loading_leaves_the_process_generators_as_they_were():
    ds = ClientForbidden(np.zeros((4, 2), dtype=np.float32), np.arange(4), noise=1.0)
    ds.pid = -1
    torch.manual_seed(123)
    np.random.seed(123)
    expected = torch.rand(1).item(), np.random.rand()
    torch.manual_seed(123)
    np.random.seed(123)
    loader = ExampleLoader(ds, seed=0, encode=np.asarray, threads=2)
    loader.load(0, [0, 1, 2, 3])
    loader.close()
    assert (torch.rand(1).item(), np.random.rand()) == expected


def test_a_failing_example_names_itself_and_its_worker(client, digits):
    X, y = digits
    est = DaskClassifier(max_epochs=1, batch_size=64, random_state=0).fit(X, y)
    before = _weights(est).copy()
    with pytest.raises(Exception, match=r"dataset\[17\] raised on worker tcp://.*OSError: cannot decode example 17"):
        est.partial_fit(ClientForbidden(X, y, fail_at=17, targets=True))
    np.testing.assert_array_equal(_weights(est), before)  # the fitted state is kept
    assert est.n_iter_ == 1


def test_the_cache_reads_each_example_once(client, digits, tmp_path):
    X, y = digits
    ds = ClientForbidden(X[:200], y[:200], log_dir=str(tmp_path), targets=True)
    DaskClassifier(max_epochs=3, batch_size=32, random_state=0, dataset_cache=True).fit(ds)
    reads = [int(v) for f in tmp_path.iterdir() for v in f.read_text().split()]
    assert len(reads) == 200 + 2  # every example once, and the two of the shape check
    for f in tmp_path.iterdir():
        f.unlink()
    DaskClassifier(max_epochs=3, batch_size=32, random_state=0).fit(ds)
    reads = [int(v) for f in tmp_path.iterdir() for v in f.read_text().split()]
    # without the cache: once per epoch, plus at most the two batches named ahead after the last update
    assert 3 * 200 + 2 <= len(reads) <= 3 * 200 + 2 + 2 * 32


def test_the_next_batches_are_named_ahead():
    loop = LoopState(seed=0, n_data=10)
    sampler = Sampler(loop)
    for _ in range(7):
        ahead = sampler.peek(4, batches=2)
        epoch = loop.data_epoch
        first, second = sampler.take(4), None
        assert (ahead[: len(first)] % 10).tolist() == first.tolist()
        assert set((ahead[: len(first)] // 10).tolist()) == {epoch}
        state = (loop.position, loop.data_epoch, sampler._perm, sampler._perm_epoch)
        second_epoch = loop.data_epoch
        second = sampler.take(4)
        assert (ahead[len(first):] % 10).tolist() == second.tolist()
        assert set((ahead[len(first):] // 10).tolist()) == {second_epoch}
        loop.position, loop.data_epoch, sampler._perm, sampler._perm_epoch = state  # back one batch


def test_regressor_and_bad_input(client, digits):
    X, _ = digits
    target = X[:, :2].sum(axis=1)
    ds = ClientForbidden(X, target)
    est = DaskRegressor(max_epochs=2, batch_size=64, random_state=0).fit(ds)
    assert est.predict(ds).shape == (len(X),) and est.score(ds) > 0
    assert float_targets(np.float64(2.5)).tolist() == [2.5]
    with pytest.raises(ValueError, match="y must be None"):
        DaskRegressor().fit(ds, target)
    with pytest.raises(ValueError, match="validation_fraction"):
        DaskRegressor(validation_fraction=0.2).fit(ds)
    with pytest.raises(ValueError, match="dataset_threads"):
        DaskRegressor(dataset_threads=0).fit(ds)


def test_without_a_client_the_embedded_cluster_reads_the_dataset(digits):
    """No client: the embedded cluster starts before the Dataset is looked at, so its workers read it."""
    X, y = digits
    est = DaskClassifier(max_epochs=1, batch_size=64, random_state=0).fit(ClientForbidden(X[:300], y[:300]))
    assert est.n_iter_ == 1 and est.history_[-1]["n_samples_seen"] == 300
    assert est.predict(X[:5]).shape == (5,)
