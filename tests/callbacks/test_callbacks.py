"""Callbacks on the shared LocalCluster: hooks, early stopping, progress bar, routing."""

import re

import joblib
import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV

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


def _table(out: str) -> list[str]:
    """The verbose table's lines (header first) of what a fit printed."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["epoch"])
    return lines[header:header + 1] + [line for line in lines[header + 1:] if line.strip()[:1].isdigit()]


def test_progress_bar_and_verbose_table(client, data, capsys):
    X, y = data
    est = DaskClassifier(validation_fraction=0.2, callbacks=[ProgressBar()], verbose=1, max_epochs=2, random_state=0)
    est.fit(X, y)
    out, err = capsys.readouterr()
    assert "valid_loss" in _table(out)[0] and len(_table(out)) == 3
    assert "epoch 1" in err  # tqdm writes to stderr


def _drive(bar: ProgressBar, updates: int) -> None:
    bar.on_epoch_begin(None, n_data=100 * updates, epoch=1, eta=None)
    for _ in range(updates):
        bar.on_update_end(None, record={"batch_size": 100, "n_workers": 2, "loss": 0.5}, eta=42.0)
    bar.on_epoch_end(None)


def test_progress_bar_throttles_where_stderr_is_no_terminal(capsys):
    """Issue 35: 1,243 redraws in 5 s into a log file; now one when it starts, its last state and the clearing at its end."""
    _drive(ProgressBar(), 500)
    err = capsys.readouterr().err
    assert "epoch 1" in err and err.count("\r") <= 4, f"{err.count(chr(13))} redraws"


def test_progress_bar_is_live_on_a_terminal(monkeypatch):
    """On a terminal tqdm's own pace (0.1 s), with the time left from the loop's estimate."""
    import fcntl
    import os
    import select
    import struct
    import termios

    main, side = os.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # a width, or tqdm draws nothing
    with os.fdopen(side, "w") as terminal:
        monkeypatch.setattr("sys.stderr", terminal)
        bar = ProgressBar()
        bar.on_epoch_begin(None, n_data=100, epoch=1, eta=None)
        assert bar.bar_.mininterval == pytest.approx(0.1)
        bar.on_update_end(None, record={"batch_size": 100, "n_workers": 2, "loss": 0.5}, eta=42.0)
        bar.bar_.refresh()
        terminal.flush()
        drawn = ""
        while "left=42s" not in drawn and select.select([main], [], [], 10)[0]:  # the draws, as they come
            drawn += os.read(main, 65536).decode()
        assert "left=42s" in drawn, drawn or "nothing drawn on the terminal"
        bar.on_epoch_end(None)
    os.close(main)
    with pytest.raises(ValueError, match="mininterval"):
        ProgressBar(mininterval=-1).check_params()


def test_verbose_tells_the_time_left_from_the_first_updates(client, data, capsys):
    """Issue 35: with ``verbose=1`` the time left was ``-`` for the whole first epoch."""
    from adadamp.dampers import GeoDamp

    X, y = data
    seen = []

    class Watch(Callback):
        def on_update_end(self, estimator, eta=None, **info):
            seen.append(eta)

    est = DaskClassifier(batch_size=GeoDamp(initial=10, delay=1, factor=2), max_epochs=2, random_state=0, verbose=1,
                         callbacks=[Watch()]).fit(X, y)
    assert len(seen) == est.meta_["n_updates"] and all(e is not None and e >= 0 for e in seen)  # from the first
    assert seen[0] > 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    early = [i for i, line in enumerate(lines) if re.fullmatch(r"time left: about [\d.]+ s \(estimated from the "
                                                               r"first ([1-9]|1[0-9]|20) updates; fit [0-9a-f]{12}\)", line)]
    assert len(early) == 1  # once,
    assert early[0] < lines.index(_table(out)[0])  # before the first epoch's row
    first_row = _table(out)[1].split()
    assert first_row[0] == "1" and first_row[-2] == "s"  # a number of seconds, not "-"


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
    """The estimate: the schedule's coming batch sizes (forecast_batch_size, pure), each at the time
    update_time_model gives it; the verbose table and ProgressBar show it.  (Its accuracy against the
    wall clock: python -m benchmarks.time_left.)"""
    from adadamp.dampers import GeoDamp, simulate_schedule
    from adadamp.engine.loop import coming_batches, time_left, update_time_model

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
    base, per_example = update_time_model(updates)
    workers = updates[-1]["n_workers"]
    assert time_left(state, 5) == pytest.approx(sum(base + per_example * b / workers for b in coming_batches(state, 5)))
    assert time_left(state, 5) > 0
    table = _table(capsys.readouterr().out)
    assert table[0].split()[-3:] == ["time", "left", "fit"] and all(row.split()[-2] == "s" for row in table[1:])


def test_time_left_is_not_set_by_a_slow_first_update_nor_a_growth_step():
    """One slow first update (the workers' warm-up) and one slow growth step (a worker starting) at the
    largest batch made the pace: the line through every update's time had said 170x the real time."""
    from adadamp.dampers import GeoDamp
    from adadamp.engine import LoopState
    from adadamp.engine.loop import coming_batches, time_left
    from adadamp.records import TrainingState

    damper = GeoDamp(initial=10, delay=1, factor=2)
    loop = LoopState(seed=0, n_data=100)
    history = []
    for epoch, batch in enumerate([10, 20]):
        updates = [{"batch_size": batch, "n_workers": 1, "update_time": 0.001} for _ in range(100 // batch)]
        loop.progress, loop.n_updates = 100 * (epoch + 1), loop.n_updates + len(updates)
        history.append({"updates": updates})
    history[0]["updates"][0]["update_time"] = 0.05  # the fit's first update
    history[1]["updates"][-1]["update_time"] = 2.5  # the worker start that came with the growth
    state = TrainingState(None, None, None, damper, loop, history=history)
    truth = 0.001 * len(coming_batches(state, 6))  # 4 more epochs of updates at 1 ms
    assert time_left(state, 6) == pytest.approx(truth, rel=0.3)


def test_time_left_in_a_search_counts_the_workers_a_fit_has_not_those_it_wants():
    """A search's fits divide the cluster: each wants 4 workers and trains on 2.  Their time left
    counted 4 (and a worker start before the next epoch) at every epoch: ~6.3 s where 0.15 s were left.
    Once an update ran short of a want, the estimate counts the workers the fit has; a larger want
    (a growth to come) is still counted as asked for."""
    import types

    from adadamp.engine.loop import FitLoop

    members = types.SimpleNamespace(policy=types.SimpleNamespace(scale=True), workers=["a", "b"],
                                    wanted=lambda batch: 4 if batch <= 64 else 8, running=lambda: 4)
    loop = FitLoop(None, None, page=None)
    loop._backend, loop._short = types.SimpleNamespace(members=members), 0
    assert loop._workers_for(64) == 4  # nothing measured: what the fit asked for
    loop._note_shortfall({"batch_size": 64, "n_workers": 2})  # it trained on 2 of the 4
    assert loop._workers_for(64) == 2 and loop._workers_for(32) == 2
    assert loop._workers_for(128) == 8  # a want never asked for yet: the cluster may grow for it
    loop._note_shortfall({"batch_size": 64, "n_workers": 4})  # one update with its 4 changes nothing
    assert loop._workers_for(64) == 2


def test_progress_bar_shows_the_schedules_batch_size():
    """Issue 54, item 5: an epoch's ragged last batch (the 3 examples left of 67 at batch 32) showed
    ``batch=3``; the bar shows the schedule's size and still counts the examples trained."""
    from adadamp.dampers.clock import LoopState, Sampler

    loop = LoopState(seed=0, n_data=67)
    sampler = Sampler(loop)
    bar, trained, shown = ProgressBar(), [], []
    for epoch, size in ((1, 32), (2, 64)):
        bar.on_epoch_begin(None, n_data=67, epoch=epoch, eta=None)
        while True:
            n = len(sampler.take(size))
            loop.advance(n)
            bar.on_update_end(None, record={"batch_size": n, "n_workers": 1, "loss": 0.5}, eta=None, loop=loop)
            trained.append(n)
            shown.append(int(re.search(r"batch=(\d+)", bar.bar_.postfix).group(1)))
            if loop.position == 0:
                break
        assert bar.bar_.n == 67
        bar.on_epoch_end(None)
    assert trained == [32, 32, 3, 64, 3]
    assert shown == [32, 32, 32, 64, 64]


def test_a_searchs_verbose_rows_name_their_fit(client, data, capsys):
    """A search's fits print their rows interleaved: each fit says once which estimator it is, and
    each of its rows ends with its id; the page's address is printed once per process."""
    X, y = data
    search = GridSearchCV(DaskClassifier(client=client, verbose=1, max_epochs=2, random_state=0), {"optimizer__lr": [1e-3, 3e-3]},
                          cv=2, n_jobs=2)
    with joblib.parallel_backend("threading"):
        search.fit(X, y)
    out = capsys.readouterr().out
    named = dict(re.findall(r"^fit ([0-9a-f]{12}): (DaskClassifier\(.*\))$", out, re.MULTILINE))
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert len(named) == 5, out  # 2 candidates x 2 folds, and the refit
    assert all("optimizer__lr=" in label and "max_epochs=2" in label for label in named.values()), named
    assert len(rows) == 5 * 2 and all(row[-1] in named for row in rows), out
    assert {row[-1] for row in rows} == set(named)
    assert sum("live training page" in line for line in out.splitlines()) <= 1, out


def test_a_resumed_fit_says_from_where(client, data, tmp_path, capsys):
    X, y = data
    path = tmp_path / "fit.ckpt"
    DaskClassifier(max_epochs=2, random_state=0, checkpoint=path).fit(X, y)
    capsys.readouterr()
    est = DaskClassifier(max_epochs=3, random_state=0, checkpoint=path, verbose=1).fit(X, y)
    out = capsys.readouterr().out
    said = re.search(r"resumed from the checkpoint fit\.ckpt at update (\d+) \(epoch 2\.00, 2 epochs done\)", out)
    assert said, out
    assert int(said.group(1)) == est.history_[1]["n_updates"]
