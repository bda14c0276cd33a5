"""The data package without a cluster: what each source tells the workers, and the targets."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from adadamp import DaskClassifier, DaskRegressor
from adadamp.data import ArrayData, DatasetData, Labels, Values, make_source


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=6):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(3, float(i), dtype=np.float32), i % 2


def test_array_data_is_shared_and_placed():
    X, y = np.zeros((5, 3), dtype=np.float32), np.zeros((5, 1), dtype=np.float32)
    data = ArrayData(X, y)
    assert data.shared_arrays() == (X, y)
    assert data.setup_payload(seed=0) is None
    assert data.bytes_per_example() == 4 * 3 + 4
    assert not data.reads_ahead
    assert data.placement(2).n_blocks == 2 and data.preferred(data.placement(2)) is None


def test_dataset_data_is_read_on_the_workers():
    data = DatasetData(Pairs(), encode=np.asarray, threads=1, cache=False)
    assert data.shared_arrays() is None
    assert data.bytes_per_example() is None
    assert data.reads_ahead
    payload = pickle.loads(data.setup_payload(seed=7))
    assert payload["seed"] == 7 and len(payload["dataset"]) == 6 and payload["threads"] == 1
    assert data.token() == DatasetData(Pairs(), encode=np.asarray, threads=1, cache=False).token()


def test_labels_are_fixed_by_the_first_fit():
    y, attrs = Labels("DaskClassifier", classes=[0, 1, 2]).encode(np.array([2, 0]))
    assert y.tolist() == [2, 0] and attrs["classes_"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="does not know"):
        Labels("DaskClassifier", fitted=np.array([0, 1])).encode(np.array([0, 3]))
    with pytest.raises(ValueError, match="needs at least 2 classes"):
        Labels("DaskClassifier").encode(np.array([1, 1]))


def test_values_keep_their_dimensions():
    y, attrs = Values().encode(np.arange(3.0))
    assert y.shape == (3, 1) and y.dtype == np.float32 and attrs == {"_y_1d": True}
    with pytest.raises(ValueError, match="other shape"):
        Values(fitted_1d=True).encode(np.zeros((3, 2)))


def test_make_source_holds_out_and_weights_in_memory_data():
    X, y = np.random.default_rng(0).normal(size=(20, 4)), np.arange(20.0)
    made = make_source(X, y, Values(), estimator=DaskRegressor(), fresh=True, client=None, seed=lambda: 3,
                       sample_weight=np.ones(20), validation_fraction=0.25)
    assert isinstance(made.source, ArrayData) and len(made.source) == 15 and made.weighted
    assert made.seed == 3 and len(made.valid[0]) == 5 and made.n_outputs == 1
    assert made.attrs["n_features_in_"] == 4 and made.attrs["_y_1d"]


def test_make_source_refuses_once_what_every_input_kind_refuses():
    with pytest.raises(ValueError, match="at least 2 samples"):
        make_source(np.zeros((1, 2)), [0], Labels("DaskClassifier"), estimator=DaskClassifier(), fresh=True,
                    client=None, seed=lambda: 0)
    with pytest.raises(ValueError, match="y must be None"):
        make_source(Pairs(), [0], Labels("DaskClassifier"), estimator=DaskClassifier(), fresh=True, client=None,
                    seed=lambda: 0)
