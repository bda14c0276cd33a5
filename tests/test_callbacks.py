"""Callbacks on the shared LocalCluster: hooks, early stopping, progress bar, routing."""

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.callbacks import Callback, EarlyStopping, ProgressBar


@pytest.fixture(scope="module")
def data():
    return make_classification(n_samples=300, n_features=6, n_informative=4, n_classes=2, random_state=0)


EVENTS = []


class Recorder(Callback):
    """Logs hook calls into EVENTS (estimators clone their callbacks)."""

    @property
    def events(self):
        return EVENTS

    def on_train_begin(self, estimator, **info):
        self.events.append("train_begin")

    def on_epoch_begin(self, estimator, epoch=None, **info):
        self.events.append(f"epoch_begin {epoch}")

    def on_update_end(self, estimator, record=None, **info):
        self.events.append("update")

    def on_epoch_end(self, estimator, row=None, **info):
        self.events.append(f"epoch_end {row['epoch']}")

    def on_train_end(self, estimator, **info):
        self.events.append("train_end")


def test_hooks_run_in_loop_order(client, data):
    X, y = data
    EVENTS.clear()
    DaskClassifier(batch_size=100, max_epochs=2, callbacks=[Recorder()], random_state=0).fit(X, y)
    assert EVENTS == ["train_begin", "epoch_begin 1", "update", "update", "update", "epoch_end 1",
                      "epoch_begin 2", "update", "update", "update", "epoch_end 2", "train_end"]


def test_early_stopping_restores_the_best_weights(client, data):
    X, y = data
    est = DaskClassifier(
        optimizer=torch.optim.SGD,
        optimizer__lr=2.0,  # noisy enough that the validation loss stops improving
        validation_fraction=0.3,
        callbacks=[("stop", EarlyStopping(patience=1))],
        callbacks__stop__threshold=0.0,
        max_epochs=40,
        random_state=0,
    ).fit(X, y)
    losses = [row["valid_loss"] for row in est.history_]
    assert len(losses) < 40 and est.history_[-1].get("event_early_stop")
    best = min(losses)
    X_valid_loss = est._loss(
        {"module_": est.module_, "criterion_": est.criterion_},
        *_validation_split(est, X, y),
    )
    assert X_valid_loss == pytest.approx(best, rel=1e-5)


def _validation_split(est, X, y):
    from sklearn.model_selection import train_test_split

    X = X.astype(np.float32)
    _, X_valid, _, y_valid = train_test_split(X, y, test_size=0.3, random_state=est.loop_.seed)
    return X_valid, y_valid.astype(np.int64)


def test_progress_bar_and_verbose_table(client, data, capsys):
    X, y = data
    est = DaskClassifier(validation_fraction=0.2, callbacks=[ProgressBar()], verbose=1, max_epochs=2, random_state=0)
    est.fit(X, y)
    out, err = capsys.readouterr()
    assert "valid_loss" in out.splitlines()[0] and len(out.splitlines()) == 3
    assert "epoch 1" in err  # tqdm writes to stderr


def test_unknown_callback_name_is_rejected(data):
    X, y = data
    with pytest.raises(ValueError, match="no callback named 'nope'"):
        DaskClassifier(callbacks=[("stop", EarlyStopping())], callbacks__nope__patience=2).fit(X, y)
