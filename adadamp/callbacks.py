"""Callbacks: code that runs at named points of the training loop (skorch's hook names).

A callback is a small object with any of the hooks below; the estimator calls
them on the client, in the order given by ``callbacks=[...]``.  Hooks receive
the estimator and keyword arguments: ``module``, ``optimizer`` and ``damper``
(what is being trained; a warm start trains copies, committed to the
estimator when the call succeeds), ``loop`` (the training clock:
``n_updates``, ``epoch``), ``history`` (the epoch rows so far), and
``record`` (one update) or ``row`` (one epoch).  ``on_update_end`` runs after every model update (one
distributed round).  Raise :class:`StopTraining` from a hook to end ``fit``
early with the weights as they are.

Parameters of named callbacks route like the other parameters:
``callbacks=[("stop", EarlyStopping())], callbacks__stop__patience=3``.
"""

from __future__ import annotations

import copy
import math
import os
import sys
import warnings

import torch
from sklearn.base import BaseEstimator

from .exceptions import StopTraining


class Callback(BaseEstimator):
    """Base class; override the hooks you need.

    Examples
    --------
    >>> class PrintLoss(Callback):
    ...     def on_epoch_end(self, estimator, row=None, **info):
    ...         print(row["epoch"], row["train_loss"])
    """

    def check_params(self) -> None:
        """Raise ``ValueError``/``TypeError`` for a bad parameter; called before any cluster work."""

    def on_train_begin(self, estimator, **info) -> None:
        """Before the first epoch of ``fit``/``partial_fit``."""

    def on_epoch_begin(self, estimator, **info) -> None:
        """Before each epoch."""

    def on_update_end(self, estimator, record=None, **info) -> None:
        """After each model update; ``record`` is the update's row of ``history_``, ``eta`` (in
        ``info``) the estimated seconds left in the call."""

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


class LRScheduler(Callback):
    """A torch learning-rate scheduler, composed with the damper's learning-rate factor.

    The damper sets every update's learning rate as ``base_lr * factor``
    (GeoDampLR's decay, AdaScale's gain, a capped batch); a scheduler given
    here multiplies in: ``lr = scheduled_lr * factor``, where
    ``scheduled_lr`` is what ``policy`` would set from ``base_lr``
    (``optimizer__lr``).  The scheduler runs on a shadow copy of the param
    groups, so it never fights the damper over ``param_group["lr"]``.

    The scheduler is stepped in the damper's clock: with
    ``step_every="batch"`` once per model update, or under
    :class:`~adadamp.dampers.AdaScale` once per scale-invariant iteration
    ``floor(tau)`` (Johnson et al. 2020, Alg. 2: ``lr(floor(tau_t))``), so a
    cosine or step schedule tuned at the base batch size keeps its shape when
    the batch grows; with ``step_every="epoch"`` once per epoch of the
    engine's epoch clock (scale-invariant epochs under AdaScale).  The
    scheduler's position is a function of that clock, so ``partial_fit``,
    warm starts and a ``fit`` resumed from a checkpoint continue the schedule
    where it was.  ``ReduceLROnPlateau`` steps at the end of each epoch with
    ``row[monitor]`` (its patience counters restart with each ``fit`` call).

    Parameters
    ----------
    policy : str or class, default="StepLR"
        A class of :mod:`torch.optim.lr_scheduler` or its name.
    step_every : {"epoch", "batch"}, default="epoch"
        Step per epoch or per model update (skorch's names).
    monitor : str, default="train_loss"
        Key of the epoch row passed to ``ReduceLROnPlateau``.
    **kwargs
        Parameters of ``policy`` (e.g. ``T_max=...``); they route as
        ``callbacks__<name>__T_max=...``.

    Attributes
    ----------
    lr_scheduler_ : torch.optim.lr_scheduler.LRScheduler
        The scheduler of the last fit (stepping a shadow optimizer).

    Examples
    --------
    >>> import torch
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(
    ...     optimizer=torch.optim.SGD, optimizer__lr=0.1,
    ...     callbacks=[("lr", LRScheduler(policy=torch.optim.lr_scheduler.CosineAnnealingLR, T_max=20))],
    ... )
    """

    _own = ("policy", "step_every", "monitor")

    def __init__(self, policy="StepLR", step_every: str = "epoch", monitor: str = "train_loss", **kwargs):
        self.policy = policy
        self.step_every = step_every
        self.monitor = monitor
        vars(self).update(kwargs)

    def _policy_kwargs(self) -> dict:
        return {k: v for k, v in vars(self).items() if k not in self._own and not k.endswith("_")}

    def get_params(self, deep: bool = True) -> dict:
        return {**super().get_params(deep=deep), **self._policy_kwargs()}

    def set_params(self, **params) -> LRScheduler:
        vars(self).update(params)  # policy parameters are open-ended (skorch: LRScheduler(**kwargs))
        return self

    def check_params(self) -> None:
        """Build the scheduler once on a stand-in optimizer: a bad policy or argument fails here, not mid-fit."""
        self._build([1.0])

    def _build(self, base_lrs: list[float]):
        """The scheduler on a shadow optimizer whose param groups hold ``base_lrs``."""
        policy = self._policy_class()
        shadow = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in base_lrs])
        try:
            scheduler = policy(shadow, **self._policy_kwargs())
        except (TypeError, ValueError) as err:
            raise type(err)(f"LRScheduler: {policy.__name__}({self._policy_kwargs()}): {err}") from err
        shadow.step()  # a no-op (no gradients): marks the optimizer-then-scheduler order torch checks
        return scheduler

    def _policy_class(self):
        policy = self.policy
        if isinstance(policy, str):
            policy = getattr(torch.optim.lr_scheduler, policy, None)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
        if not (isinstance(policy, type) and issubclass(policy, (torch.optim.lr_scheduler.LRScheduler, plateau))):
            raise TypeError(
                f"LRScheduler: policy must be a class of torch.optim.lr_scheduler or its name, e.g. "
                f"policy='CosineAnnealingLR'; got {self.policy!r}."
            )
        if self.step_every not in ("epoch", "batch"):
            raise ValueError(f"LRScheduler: step_every must be 'epoch' or 'batch'; got {self.step_every!r}.")
        if issubclass(policy, plateau) and self.step_every != "epoch":
            raise ValueError("LRScheduler: ReduceLROnPlateau steps on an epoch metric; use step_every='epoch'.")
        return policy

    def on_train_begin(self, estimator, optimizer=None, damper=None, loop=None, **info) -> None:
        self.optimizer_, self.damper_, self.loop_ = optimizer, damper, loop
        self.lr_scheduler_ = self._build([g["adadamp_base_lr"] for g in optimizer.param_groups])
        self._follow_clock()

    def _clock(self) -> int:
        if self.step_every == "batch":
            return self.damper_.scheduler_steps(self.loop_.n_updates)
        return math.floor(self.loop_.epoch + 1e-9)

    def _follow_clock(self) -> None:
        scheduler = self.lr_scheduler_
        if not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            for _ in range(self._clock() - scheduler.last_epoch):
                scheduler.step()
        for group, shadow in zip(self.optimizer_.param_groups, scheduler.optimizer.param_groups):
            group["adadamp_scheduled_lr"] = float(shadow["lr"])

    def on_update_end(self, estimator, **info) -> None:
        self._follow_clock()

    def on_epoch_end(self, estimator, row=None, **info) -> None:
        if isinstance(self.lr_scheduler_, torch.optim.lr_scheduler.ReduceLROnPlateau):
            if self.monitor not in row:
                raise ValueError(f"LRScheduler monitors {self.monitor!r}, which the epoch rows do not have: {sorted(row)}.")
            self.lr_scheduler_.step(row[self.monitor])
            self._follow_clock()

    def on_train_end(self, estimator, **info) -> None:
        for group in self.optimizer_.param_groups:
            group.pop("adadamp_scheduled_lr", None)

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in ("optimizer_", "damper_", "loop_"):  # borrowed from the fit, not part of the callback
            state.pop(key, None)
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
    for _, cb in named:
        if hasattr(cb, "check_params"):
            cb.check_params()
    return named
