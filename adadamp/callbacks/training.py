"""The callbacks that steer or watch a fit: stop early (:class:`EarlyStopping`), save the best
weights (:class:`Checkpoint`), show progress (:class:`ProgressBar`), as skorch's of the same names."""

from __future__ import annotations

import copy
import math
import os
import sys
import warnings

from ..exceptions import StopTraining
from .base import Callback


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
    counts examples and shows the schedule's batch size (an epoch's ragged
    last batch, the examples left, shows the size before it), workers, loss
    and, from the first updates on, the fit's estimated time left (``left``:
    the damper's coming batch sizes times the update time measured so far).
    Where stderr is not a terminal (a log file, a batch job's output) it
    redraws at most every ``mininterval`` seconds.

    Parameters
    ----------
    mininterval : float, default=10.0
        Seconds between redraws where stderr is not a terminal (on a terminal
        or in a notebook: tqdm's 0.1 s).

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(callbacks=[ProgressBar()])
    """

    def __init__(self, mininterval: float = 10.0):
        self.mininterval = mininterval

    def check_params(self) -> None:
        if not (isinstance(self.mininterval, int | float) and self.mininterval >= 0):
            raise ValueError(f"ProgressBar's mininterval must be a number of seconds >= 0; got {self.mininterval!r}.")

    def on_epoch_begin(self, estimator, n_data=None, epoch=None, eta=None, **info) -> None:
        with warnings.catch_warnings():
            # In Jupyter without ipywidgets, tqdm.auto warns and uses the text bar, which works there too.
            warnings.filterwarnings("ignore", message="IProgress not found")
            from tqdm.auto import tqdm
            from tqdm.notebook import tqdm as notebook_bar

        live = issubclass(tqdm, notebook_bar) or _isatty(sys.stderr) or _jupyter_stream(sys.stderr)
        self.bar_ = tqdm(total=n_data, desc=f"epoch {epoch}", unit="ex", leave=False,
                         mininterval=0.1 if live else self.mininterval)

    def on_update_end(self, estimator, record=None, eta=None, loop=None, **info) -> None:
        postfix = {"batch": self._schedule_size(record["batch_size"], loop), "workers": record["n_workers"],
                   "loss": f"{record['loss']:.4g}"}
        if eta is not None:  # the fit's time left, from the schedule and the measured update times
            postfix["left"] = f"{eta:.0f}s"
        self.bar_.set_postfix(postfix, refresh=False)  # drawn with the update, at tqdm's pace
        self.bar_.update(record["batch_size"])

    def _schedule_size(self, size: int, loop) -> int:
        """The schedule's batch size: a data epoch's last batch (the sampler back at position 0) holds
        the examples left, fewer than asked for, and shows the size before it instead."""
        shown = getattr(self, "_batch", None)
        ended = loop is not None and getattr(loop, "position", None) == 0
        if not (ended and shown is not None and size < shown):
            self._batch = shown = size
        return shown

    def on_epoch_end(self, estimator, **info) -> None:
        self.bar_.refresh()  # the epoch's last state, drawn once whatever the pace
        self.bar_.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("bar_", None)
        return state


def _jupyter_stream(stream) -> bool:
    """A Jupyter kernel's output stream (a notebook without ipywidgets draws the text bar live)."""
    return type(stream).__module__.split(".")[0] == "ipykernel"


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


