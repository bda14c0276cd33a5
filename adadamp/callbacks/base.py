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

from sklearn.base import BaseEstimator


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


def resolve(callbacks, params: dict) -> list[tuple[str, Callback]]:
    """Named, cloned callbacks with their ``callbacks__<name>__*`` parameters applied.

    Unnamed callbacks are named after their class.

    Examples
    --------
    >>> from adadamp.callbacks import EarlyStopping
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
