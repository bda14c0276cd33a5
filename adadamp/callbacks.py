"""Callbacks: code that runs at named points of the training loop (skorch's hook names).

A callback is a small object with any of the hooks below; the estimator calls
them on the client, in the order given by ``callbacks=[...]``.  Hooks receive
the estimator and keyword arguments: ``module`` (the module being trained),
``history`` (the epoch rows so far), and ``record`` (one update) or ``row``
(one epoch).  ``on_update_end`` runs after every model update (one
distributed round).  Raise :class:`StopTraining` from a hook to end ``fit``
early with the weights as they are.

Parameters of named callbacks route like the other parameters:
``callbacks=[("stop", EarlyStopping())], callbacks__stop__patience=3``.
"""

from __future__ import annotations

import copy
import math
import os
import warnings

from sklearn.base import BaseEstimator


class StopTraining(Exception):
    """Raised by a callback to end training after the current epoch or update.

    The estimator keeps what it trained so far and logs the message.

    Examples
    --------
    >>> class StopAtLoss(Callback):
    ...     def on_epoch_end(self, estimator, row=None, **info):
    ...         if row["train_loss"] < 0.1:
    ...             raise StopTraining(f"train_loss {row['train_loss']:.3f} < 0.1")
    """


class Callback(BaseEstimator):
    """Base class; override the hooks you need.

    Examples
    --------
    >>> class PrintLoss(Callback):
    ...     def on_epoch_end(self, estimator, row=None, **info):
    ...         print(row["epoch"], row["train_loss"])
    """

    def on_train_begin(self, estimator, **info) -> None:
        """Before the first epoch of ``fit``/``partial_fit``."""

    def on_epoch_begin(self, estimator, **info) -> None:
        """Before each epoch."""

    def on_update_end(self, estimator, record=None, **info) -> None:
        """After each model update; ``record`` is the update's row of ``history_``."""

    def on_epoch_end(self, estimator, row=None, **info) -> None:
        """After each epoch; ``row`` is the epoch's row of ``history_``."""

    def on_train_end(self, estimator, **info) -> None:
        """After the last epoch (also after :class:`StopTraining`)."""


class EarlyStopping(Callback):
    """Stop when a monitored loss has not improved for ``patience`` epochs.

    Parameters
    ----------
    monitor : str, default="valid_loss"
        Key of the epoch row to watch (``"valid_loss"`` needs
        ``validation_fraction``; ``"train_loss"`` always exists).
    patience : int, default=5
        Epochs without improvement before stopping.
    threshold : float, default=1e-4
        Relative improvement that counts.
    load_best : bool, default=True
        Restore the weights of the best epoch when stopping (skorch#808).

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(validation_fraction=0.2, callbacks=[EarlyStopping(patience=3)])
    """

    def __init__(self, monitor: str = "valid_loss", patience: int = 5, threshold: float = 1e-4, load_best: bool = True):
        self.monitor = monitor
        self.patience = patience
        self.threshold = threshold
        self.load_best = load_best

    def on_train_begin(self, estimator, **info) -> None:
        self.best_ = math.inf
        self.best_epoch_ = None
        self.best_state_ = None
        self.waited_ = 0

    def on_epoch_end(self, estimator, row=None, module=None, **info) -> None:
        if self.monitor not in row:
            raise ValueError(f"EarlyStopping monitors {self.monitor!r}, which the epoch rows do not have: {sorted(row)}.")
        value = row[self.monitor]
        if value < self.best_ * (1 - self.threshold):
            self.best_, self.best_epoch_, self.waited_ = value, row["epoch"], 0
            if self.load_best:
                self.best_state_ = copy.deepcopy(module.state_dict())
            return
        self.waited_ += 1
        if self.waited_ >= self.patience:
            row["event_early_stop"] = True
            if self.load_best and self.best_state_ is not None:
                module.load_state_dict(self.best_state_)
            raise StopTraining(f"{self.monitor} did not improve for {self.patience} epochs")


class Checkpoint(Callback):
    """Save the parameters at the end of each epoch where a monitored score improved.

    The files are written with :meth:`~adadamp.DaskClassifier.save_params`
    (skorch's names and formats), so :meth:`~adadamp.DaskClassifier.load_params`
    restores them.  The epoch rows of ``history_`` get ``event_cp=True`` when a
    checkpoint was written.  (To resume an interrupted ``fit``, use the
    estimator's ``checkpoint=`` parameter instead: it keeps the whole
    training state.)

    Parameters
    ----------
    monitor : str or None, default="valid_loss"
        Key of the epoch row to watch (``"valid_loss"`` needs
        ``validation_fraction``; ``"train_loss"`` always exists).  None
        saves after every epoch.
    lower_is_better : bool, default=True
        Whether a smaller value of ``monitor`` is an improvement.
    f_params : str or None, default="params.pt"
        File for the module's ``state_dict``.
    f_optimizer : str or None, default=None
        File for the optimizer's ``state_dict``.
    f_history : str or None, default=None
        File for ``history_`` as JSON.
    dirname : str, default=""
        Directory of the files (created if missing).  File names may
        contain ``{epoch}``, e.g. ``f_params="params-{epoch}.pt"``, to keep
        one file per saved epoch.

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(
    ...     validation_fraction=0.2,
    ...     callbacks=[("cp", Checkpoint(monitor="valid_loss", dirname="run1"))],
    ...     callbacks__cp__f_history="history.json",
    ... )
    >>> est.fit(X, y).load_params(f_params="run1/params.pt")  # doctest: +SKIP
    """

    def __init__(
        self,
        monitor: str | None = "valid_loss",
        lower_is_better: bool = True,
        f_params: str | None = "params.pt",
        f_optimizer: str | None = None,
        f_history: str | None = None,
        dirname: str = "",
    ):
        self.monitor = monitor
        self.lower_is_better = lower_is_better
        self.f_params = f_params
        self.f_optimizer = f_optimizer
        self.f_history = f_history
        self.dirname = dirname

    def on_train_begin(self, estimator, **info) -> None:
        self.best_ = math.inf if self.lower_is_better else -math.inf
        self.best_epoch_ = None

    def on_epoch_end(self, estimator, row=None, **info) -> None:
        if self.monitor is not None:
            if self.monitor not in row:
                raise ValueError(f"Checkpoint monitors {self.monitor!r}, which the epoch rows do not have: {sorted(row)}.")
            value = row[self.monitor]
            if not (value < self.best_ if self.lower_is_better else value > self.best_):
                return
            self.best_, self.best_epoch_ = value, row["epoch"]
        row["event_cp"] = True
        files = {key: self._path(getattr(self, key), row["epoch"]) for key in ("f_params", "f_optimizer", "f_history")}
        estimator.save_params(**files)

    def _path(self, name: str | None, epoch: int) -> str | None:
        if name is None:
            return None
        path = os.path.join(self.dirname, name.format(epoch=epoch))
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return path


class ProgressBar(Callback):
    """A notebook-aware progress bar (``tqdm.auto``) over the examples of each epoch.

    The number of updates per epoch changes with the batch size, so the bar
    counts examples and shows the batch size, workers and loss.

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(callbacks=[ProgressBar()])
    """

    def on_epoch_begin(self, estimator, n_data=None, epoch=None, **info) -> None:
        with warnings.catch_warnings():
            # In Jupyter without ipywidgets, tqdm.auto warns and uses the text bar, which works there too.
            warnings.filterwarnings("ignore", message="IProgress not found")
            from tqdm.auto import tqdm

        self.bar_ = tqdm(total=n_data, desc=f"epoch {epoch}", unit="ex", leave=False)

    def on_update_end(self, estimator, record=None, **info) -> None:
        self.bar_.update(record["batch_size"])
        self.bar_.set_postfix(batch=record["batch_size"], workers=record["n_workers"], loss=f"{record['loss']:.4g}")

    def on_epoch_end(self, estimator, **info) -> None:
        self.bar_.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("bar_", None)
        return state


def resolve(callbacks, params: dict) -> list[tuple[str, Callback]]:
    """Named, cloned callbacks with their ``callbacks__<name>__*`` parameters applied.

    Unnamed callbacks are named after their class.

    Examples
    --------
    >>> [(name, cb.patience) for name, cb in resolve([EarlyStopping()], {"EarlyStopping__patience": 2})]
    [('EarlyStopping', 2)]
    """
    from sklearn.base import clone

    named = []
    for item in callbacks or []:
        name, cb = item if isinstance(item, tuple) else (type(item).__name__, item)
        if not hasattr(cb, "get_params"):
            raise TypeError(f"callback {name!r} must be a Callback instance; got {cb!r}.")
        named.append((name, clone(cb)))
    names = {name for name, _ in named}
    for key, value in params.items():
        name, _, param = key.partition("__")
        if name not in names or not param:
            raise ValueError(f"callbacks__{key}: no callback named {name!r} (callbacks are {sorted(names)}).")
        dict(named)[name].set_params(**{param: value})
    return named
