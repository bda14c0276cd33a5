"""Logger callbacks: the training written where teams watch it (TensorBoard, MLflow), with skorch's names.

Each is a :class:`~adadamp.callbacks.Callback`, routed like every callback
(``callbacks=[("tb", TensorBoard())], callbacks__tb__log_dir=...``), and needs its library only
when used (an optional extra; a missing one is named before any cluster work).
"""

from __future__ import annotations

import os
import tempfile

from .base import Callback

__all__ = ["MLflowLogger", "MlflowLogger", "TensorBoard"]


class TensorBoard(Callback):
    """Write the training to TensorBoard (skorch's name): scalars per update and per epoch, and the
    estimator's parameters with the final losses as hyperparameters.

    Needs the ``tensorboard`` package (``pip install "adadamp[tensorboard]"``); the writer is
    PyTorch's ``torch.utils.tensorboard.SummaryWriter``.  Per update (step = model updates):
    ``update/loss``, ``update/batch_size``, ``update/lr``, ``update/n_workers`` and the time
    breakdown (``update/compute_time``, ...); per epoch (step = epoch): every number of the
    epoch's row (``epoch/train_loss``, ``epoch/valid_loss``, ``epoch/dur``, ...).

    Parameters
    ----------
    log_dir : str or None, default=None
        The run's directory (None: ``runs/<date>_<host>``, as ``SummaryWriter``).
    every_update : bool, default=True
        Also write the per-update scalars (False: per epoch only).
    hparams : bool, default=True
        At the end, record the estimator's scalar parameters with the last ``train_loss`` (and
        ``valid_loss``) in TensorBoard's HParams tab.

    Attributes
    ----------
    writer_ : SummaryWriter
        The writer of the last fit (closed at its end).

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(callbacks=[("tb", TensorBoard())], callbacks__tb__log_dir="runs/geodamp")
    """

    def __init__(self, log_dir: str | None = None, every_update: bool = True, hparams: bool = True):
        self.log_dir = log_dir
        self.every_update = every_update
        self.hparams = hparams

    def check_params(self) -> None:
        """The tensorboard package must be installed (checked before any cluster work)."""
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as err:
            raise ImportError(
                'The TensorBoard callback needs the tensorboard package: pip install "adadamp[tensorboard]".'
            ) from err

    def on_train_begin(self, estimator, **info) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer_ = SummaryWriter(log_dir=self.log_dir)

    def on_update_end(self, estimator, record=None, loop=None, **info) -> None:
        if self.every_update:
            for key, value in _numbers(record):
                self.writer_.add_scalar(f"update/{key}", value, global_step=loop.n_updates)

    def on_epoch_end(self, estimator, row=None, **info) -> None:
        for key, value in _numbers(row):
            if key != "epoch":
                self.writer_.add_scalar(f"epoch/{key}", value, global_step=row["epoch"])
        self.writer_.flush()

    def on_train_end(self, estimator, history=None, **info) -> None:
        if self.hparams and history:
            params = {
                k: v for k, v in estimator.get_params(deep=False).items()
                if isinstance(v, int | float | str | bool) and not k.startswith("callbacks")
            }
            metrics = {f"hparam/{k}": history[-1][k] for k in ("train_loss", "valid_loss") if k in history[-1]}
            self.writer_.add_hparams(params, metrics, run_name=".")
        self.writer_.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("writer_", None)  # an open file: not part of a pickled estimator
        return state


class MLflowLogger(Callback):
    """Log the training to MLflow (skorch's name and parameters): the estimator's parameters, the
    numbers of every epoch's row as metrics, and the trained model as artifacts.

    Needs MLflow (``pip install "adadamp[mlflow]"``; ``mlflow-skinny`` suffices).  Metrics per
    epoch (step = epoch) are the epoch row's numbers (``train_loss``, ``valid_loss``,
    ``batch_size``, ``lr``, ``n_workers``, ``dur``, ...); per update (step = model updates, with
    ``log_on_batch_end``) the update record's.  At the end of training the fitted state is saved
    with :meth:`~adadamp.estimators.BaseDaskEstimator.save_params` (``params.pt``,
    ``optimizer.pt``, ``history.json``) and logged as the run's artifacts.

    Parameters
    ----------
    run : mlflow.entities.Run or None, default=None
        The run to log to (None: MLflow's active run, else a new one started with
        ``mlflow.start_run()``).
    client : mlflow.tracking.MlflowClient or None, default=None
        The client to log with (None: ``MlflowClient()``, MLflow's tracking URI).
    create_artifact : bool, default=True
        Log the trained model (``save_params``) at the end of training.
    terminate_after_train : bool, default=True
        Mark the run finished at the end of training (False: a later ``partial_fit`` logs on).
    log_on_batch_end : bool, default=False
        Also log every update's record.
    log_on_epoch_end : bool, default=True
        Log every epoch's row.
    batch_suffix, epoch_suffix : str or None, default=None
        Appended to the metric names per update / per epoch; None: ``"_batch"`` / ``"_epoch"``
        when both are logged, else nothing.
    keys_ignored : list of str or None, default=None
        Keys of the rows not to log.

    Attributes
    ----------
    run_ : mlflow.entities.Run
    client_ : mlflow.tracking.MlflowClient

    Examples
    --------
    >>> import mlflow  # doctest: +SKIP
    >>> with mlflow.start_run() as run:  # doctest: +SKIP
    ...     DaskClassifier(callbacks=[("mlflow", MLflowLogger(run))]).fit(X, y)
    """

    def __init__(
        self,
        run=None,
        client=None,
        create_artifact: bool = True,
        terminate_after_train: bool = True,
        log_on_batch_end: bool = False,
        log_on_epoch_end: bool = True,
        batch_suffix: str | None = None,
        epoch_suffix: str | None = None,
        keys_ignored: list[str] | None = None,
    ):
        self.run = run
        self.client = client
        self.create_artifact = create_artifact
        self.terminate_after_train = terminate_after_train
        self.log_on_batch_end = log_on_batch_end
        self.log_on_epoch_end = log_on_epoch_end
        self.batch_suffix = batch_suffix
        self.epoch_suffix = epoch_suffix
        self.keys_ignored = keys_ignored

    def check_params(self) -> None:
        """MLflow must be installed (checked before any cluster work)."""
        try:
            import mlflow  # noqa: F401
        except ImportError as err:
            raise ImportError('The MLflowLogger callback needs MLflow: pip install "adadamp[mlflow]".') from err

    def on_train_begin(self, estimator, **info) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.client_ = self.client if self.client is not None else MlflowClient()
        self.run_ = self.run if self.run is not None else (mlflow.active_run() or mlflow.start_run())
        both = self.log_on_batch_end and self.log_on_epoch_end
        self.batch_suffix_ = self.batch_suffix if self.batch_suffix is not None else ("_batch" if both else "")
        self.epoch_suffix_ = self.epoch_suffix if self.epoch_suffix is not None else ("_epoch" if both else "")
        self._ignored = set(self.keys_ignored or ())
        run_id = self.run_.info.run_id
        logged = self.client_.get_run(run_id).data.params  # a run's parameters cannot change: log new ones only
        for key, value in estimator.get_params(deep=False).items():
            if key not in logged and not key.startswith("callbacks") and key != "client":
                text = getattr(value, "__name__", None) or repr(value)
                self.client_.log_param(run_id, key, text[:500])

    def _log(self, values: dict, suffix: str, step: int) -> None:
        for key, value in _numbers(values):
            if key in self._ignored:
                continue
            self.client_.log_metric(self.run_.info.run_id, key + suffix, float(value), step=step)

    def on_update_end(self, estimator, record=None, loop=None, **info) -> None:
        if self.log_on_batch_end:
            self._log(record, self.batch_suffix_, loop.n_updates)

    def on_epoch_end(self, estimator, row=None, **info) -> None:
        if self.log_on_epoch_end:
            self._log({k: v for k, v in row.items() if k != "epoch"}, self.epoch_suffix_, row["epoch"])

    def on_train_end(self, estimator, **info) -> None:
        run_id = self.run_.info.run_id
        if self.create_artifact:
            with tempfile.TemporaryDirectory() as tmp:
                files = {name: os.path.join(tmp, name) for name in ("params.pt", "optimizer.pt", "history.json")}
                estimator.save_params(f_params=files["params.pt"], f_optimizer=files["optimizer.pt"],
                                      f_history=files["history.json"])
                for path in files.values():
                    self.client_.log_artifact(run_id, path)
        if self.terminate_after_train:
            self.client_.set_terminated(run_id)


def _numbers(values: dict):
    """The ``(key, value)`` pairs of a history row that are numbers (not the per-worker lists, such
    as ``shares``, nor flags): what a metric logger can plot."""
    return ((k, v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool))


#: skorch's spelling of :class:`MLflowLogger`.
MlflowLogger = MLflowLogger
