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
    assert isinstance(updates[0]["shares"], list)  # per-worker lists are in history_, not plotted
    assert "update/shares" not in acc.Tags()["scalars"]
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


def test_mlflow_logs_params_metrics_and_the_model(client, regression_data, tmp_path, monkeypatch):
    """MLflow's own client and local file store, read back with MLflow's client."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the file store (no database) for a test
    from mlflow.tracking import MlflowClient

    from adadamp import MLflowLogger

    tracking = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = tracking.create_run(tracking.create_experiment("adadamp"))
    X, y = regression_data
    est = DaskRegressor(
        optimizer=torch.optim.SGD, optimizer__lr=0.01, batch_size=GeoDamp(initial=32, delay=1, factor=2),
        max_epochs=3, random_state=0, validation_fraction=0.25,
        callbacks=[("mlflow", MLflowLogger(run, tracking, log_on_batch_end=True))],
    ).fit(X, y)
    run_id = run.info.run_id
    logged = tracking.get_run(run_id)
    assert logged.info.status == "FINISHED"
    assert logged.data.params["max_epochs"] == "3" and logged.data.params["optimizer"] == "SGD"
    valid = tracking.get_metric_history(run_id, "valid_loss_epoch")
    assert [m.step for m in valid] == [1, 2, 3]
    assert [m.value for m in valid] == pytest.approx([r["valid_loss"] for r in est.history_], rel=1e-9)
    batch_sizes = [m.value for m in sorted(tracking.get_metric_history(run_id, "batch_size_batch"),
                                           key=lambda m: m.step)]
    assert batch_sizes == [u["batch_size"] for r in est.history_ for u in r["updates"]]
    artifacts = {f.path for f in tracking.list_artifacts(run_id)}
    assert artifacts == {"params.pt", "optimizer.pt", "history.json"}
    # the logged model is the trained one
    path = tracking.download_artifacts(run_id, "params.pt", str(tmp_path / "down"))
    saved = torch.load(path, weights_only=True)
    for name, tensor in est.module_.state_dict().items():
        assert torch.equal(saved[name], tensor)


def test_a_missing_mlflow_is_named_before_cluster_work(monkeypatch, regression_data, new_processes):
    import sys

    from adadamp import MLflowLogger

    X, y = regression_data
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if MLflow were not installed
    with pytest.raises(ImportError, match=r"adadamp\[mlflow\]"):
        DaskRegressor(max_epochs=1, callbacks=[MLflowLogger()]).fit(X, y)
    assert new_processes() == []
