"""Callbacks on the shared LocalCluster: hooks, early stopping, progress bar, routing."""

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.callbacks import Callback, Checkpoint, EarlyStopping, ProgressBar
from adadamp.engine.loop import validation_loss


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
    given = EarlyStopping(patience=1)
    est = DaskClassifier(
        optimizer=torch.optim.SGD,
        optimizer__lr=2.0,  # noisy enough that the validation loss stops improving
        validation_fraction=0.3,
        callbacks=[("stop", given)],
        callbacks__stop__threshold=0.0,
        max_epochs=40,
        random_state=0,
    ).fit(X, y)
    losses = [row["valid_loss"] for row in est.history_]
    assert len(losses) < 40 and est.history_[-1].get("event_early_stop")
    best = min(losses)
    X_valid_loss = validation_loss(est._state(), *_validation_split(est, X, y))
    assert X_valid_loss == pytest.approx(best, rel=1e-5)
    fitted = dict(est.callbacks_)["stop"]  # the clone that ran, not the instance passed in
    assert fitted is not given and not hasattr(given, "best_epoch_")
    assert fitted.best_epoch_ == 1 + losses.index(best) and fitted.patience == 1


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


def _same_weights(state_dict, module) -> bool:
    return all(torch.equal(state_dict[k], v) for k, v in module.state_dict().items())


def test_checkpoint_saves_when_the_validation_loss_improves(client, data, tmp_path):
    X, y = data
    est = DaskClassifier(
        optimizer=torch.optim.SGD,
        optimizer__lr=2.0,  # noisy: the validation loss goes up and down
        validation_fraction=0.3,
        callbacks=[("cp", Checkpoint(f_params="params-{epoch}.pt", dirname=str(tmp_path / "cp")))],
        callbacks__cp__f_optimizer="opt-{epoch}.pt",
        callbacks__cp__f_history="history-{epoch}.json",
        max_epochs=8,
        random_state=0,
    ).fit(X, y)
    losses = [row["valid_loss"] for row in est.history_]
    improved = [row["epoch"] for i, row in enumerate(est.history_) if losses[i] < min(losses[:i], default=np.inf)]
    assert improved != [row["epoch"] for row in est.history_], "the run should have epochs without improvement"
    assert [row["epoch"] for row in est.history_ if row.get("event_cp")] == improved
    assert sorted(p.name for p in (tmp_path / "cp").glob("params-*.pt")) == [f"params-{e}.pt" for e in improved]
    assert len(list((tmp_path / "cp").glob("opt-*.pt"))) == len(list((tmp_path / "cp").glob("history-*.json")))

    best = improved[-1]
    est.load_params(
        f_params=tmp_path / "cp" / f"params-{best}.pt",
        f_optimizer=tmp_path / "cp" / f"opt-{best}.pt",
        f_history=tmp_path / "cp" / f"history-{best}.json",
    )
    valid_loss = validation_loss(est._state(), *_validation_split(est, X, y))
    assert valid_loss == pytest.approx(min(losses), rel=1e-5)
    assert len(est.history_) == best and est.history_[-1]["event_cp"] is True


def test_checkpoint_every_epoch_saves_the_weights_being_trained(client, data, tmp_path):
    X, y = data
    est = DaskClassifier(callbacks=[Checkpoint(monitor=None, dirname=str(tmp_path))], max_epochs=2, random_state=0)
    est.fit(X, y)
    assert all(row["event_cp"] for row in est.history_)
    first = torch.load(tmp_path / "params.pt", weights_only=True)
    assert _same_weights(first, est.module_)
    # A fresh fit of a fitted estimator saves the new fit's weights, not the previous ones.
    est.set_params(random_state=1).fit(X, y)
    second = torch.load(tmp_path / "params.pt", weights_only=True)
    assert _same_weights(second, est.module_) and not _same_weights(first, est.module_)
    est.set_params(random_state=0).fit(X, y)
    assert _same_weights(first, est.module_)


def test_checkpoint_monitor_must_exist(client, data, tmp_path):
    X, y = data
    with pytest.raises(ValueError, match="Checkpoint monitors 'valid_loss'"):
        DaskClassifier(callbacks=[Checkpoint(dirname=str(tmp_path))], max_epochs=1).fit(X, y)


def test_time_left_follows_the_schedule_and_the_measured_update_time(client, data, capsys):
    """The estimate: the schedule's coming batch sizes (forecast_batch_size, pure) times a line fitted
    to the measured update times; the verbose table and ProgressBar show it."""
    from adadamp.dampers import GeoDamp, simulate_schedule
    from adadamp.engine.loop import coming_batches, time_left

    X, y = data
    seen = []

    class Watch(Callback):
        def on_epoch_begin(self, estimator, eta=None, **info):
            seen.append(eta)

    damper = GeoDamp(initial=16, delay=1, factor=2)
    est = DaskClassifier(batch_size=damper, max_epochs=3, random_state=0, verbose=1,
                         callbacks=[Watch(), ProgressBar()]).fit(X, y)
    assert seen[0] is None and all(e > 0 for e in seen[1:])  # nothing measured before the first epoch
    state = est._state()
    # two more epochs: exactly the updates GeoDamp will make, at the fitted line's times
    assert coming_batches(state, 5) == [
        r["batch_size"] for r in simulate_schedule(damper, len(X), 5)
    ][est.meta_["n_updates"]:]
    updates = [u for row in est.history_ for u in row["updates"]]
    slope, base = np.polyfit([u["batch_size"] for u in updates], [u["update_time"] for u in updates], 1)
    if slope >= 0 and base >= 0:
        assert time_left(state, 5) == pytest.approx(sum(base + slope * b for b in coming_batches(state, 5)))
    assert time_left(state, 5) > 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-2:] == ["time", "left"] and out[1].split()[-1] == "-" and out[2].split()[-1] == "s"
