"""Logger callbacks against the real libraries, read back: TensorBoard (PyTorch's SummaryWriter
writing event files, read with TensorBoard's own event reader)."""

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from adadamp import DaskRegressor, TensorBoard
from adadamp.dampers import GeoDamp


def _scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_writes_what_history_holds(client, regression_data, tmp_path):
    X, y = regression_data
    est = DaskRegressor(
        optimizer=torch.optim.SGD, optimizer__lr=0.01, batch_size=GeoDamp(initial=32, delay=1, factor=2),
        max_epochs=3, random_state=0, validation_fraction=0.25,
        callbacks=[("tb", TensorBoard())], callbacks__tb__log_dir=str(tmp_path / "run"),
    ).fit(X, y)
    acc = EventAccumulator(str(tmp_path / "run"))
    acc.Reload()
    updates = [u for row in est.history_ for u in row["updates"]]
    loss = _scalars(acc, "update/loss")
    assert [s for s, _ in loss] == list(range(1, len(updates) + 1))
    assert [v for _, v in loss] == pytest.approx([u["loss"] for u in updates], rel=1e-6)
    assert [v for _, v in _scalars(acc, "update/batch_size")] == [u["batch_size"] for u in updates]
    epochs = _scalars(acc, "epoch/valid_loss")
    assert [s for s, _ in epochs] == [1, 2, 3]
    assert [v for _, v in epochs] == pytest.approx([r["valid_loss"] for r in est.history_], rel=1e-6)
    assert [v for _, v in _scalars(acc, "epoch/batch_size")] == [32, 64, 128]
    # the HParams tab: the estimator's parameters with the final losses
    assert _scalars(acc, "hparam/valid_loss")[0][1] == pytest.approx(est.history_[-1]["valid_loss"], rel=1e-6)
    hparams = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hparams
    assert b"max_epochs" in hparams["_hparams_/session_start_info"]  # the parameters are recorded
    import pickle

    pickle.loads(pickle.dumps(est))  # the closed writer is not part of the estimator's pickle


def test_a_missing_tensorboard_is_named_before_cluster_work(monkeypatch, regression_data, new_processes):
    import sys

    X, y = regression_data
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were not installed
    with pytest.raises(ImportError, match=r"adadamp\[tensorboard\]"):
        DaskRegressor(max_epochs=1, callbacks=[TensorBoard()]).fit(X, y)
    assert new_processes() == []
