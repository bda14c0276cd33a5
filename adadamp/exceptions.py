"""Errors adadamp raises on purpose, every one of them defined here.

The ones a user catches around ``fit`` are also names of :mod:`adadamp` (``ConvergenceError``,
``NoWorkersError``, ``SchedulerLostError``, ``FitInterrupted``, ``StopTraining``,
``InvalidParameterError``).  The others name the part that raises them, and stay importable from
it: a refused checkpoint file (``adadamp.checkpoint``), a spelling of the original adadamp
(``adadamp.porting``), the gradient channel (``adadamp.wire.channel``), a worker's error while
computing or reading a Dataset (``adadamp.worker.loading``).  This module imports nothing of
adadamp, so every layer may raise them.
"""

from __future__ import annotations


class ConvergenceError(ArithmeticError):
    """The training loss became non-finite; the last finite weights are kept.

    Raised by ``fit``/``partial_fit`` when an update's loss or gradient is
    NaN or infinite.  The estimator stays fitted with the weights from before
    that update, so it can still predict, or continue with a lower learning
    rate (``warm_start=True``).

    Examples
    --------
    >>> from adadamp import ConvergenceError
    >>> try:  # doctest: +SKIP
    ...     est.fit(X, y)
    ... except ConvergenceError:
    ...     est.set_params(optimizer__lr=1e-4, warm_start=True).fit(X, y)
    >>> issubclass(ConvergenceError, ArithmeticError)
    True
    """


class NoWorkersError(RuntimeError):
    """No Dask worker was left to train on, and none joined in time.

    Raised when every worker is gone and none joined within the estimator's
    ``worker_timeout`` (with ``scale_cluster`` the cluster is asked for
    workers again while waiting), or when an update failed on every retry
    because workers kept dying.  The estimator keeps the last good weights:
    add workers and call ``fit`` again with ``warm_start=True``.

    Examples
    --------
    >>> from adadamp import NoWorkersError
    >>> try:  # doctest: +SKIP
    ...     est.fit(X, y)
    ... except NoWorkersError:
    ...     cluster.scale(4)
    ...     est.set_params(warm_start=True).fit(X, y)
    >>> issubclass(NoWorkersError, RuntimeError)
    True
    """


class SchedulerLostError(RuntimeError):
    """The Dask scheduler is gone: training cannot go on; resume from a checkpoint.

    A scheduler cannot be replaced during a fit.  The estimator keeps the last
    good weights; start a new cluster and either fit again with the same
    ``checkpoint`` path (training resumes where the checkpoint was written)
    or continue with ``warm_start=True``.

    Examples
    --------
    >>> from adadamp import SchedulerLostError
    >>> try:  # doctest: +SKIP
    ...     est.fit(X, y)  # est = DaskClassifier(checkpoint="fit.ckpt", client=client)
    ... except SchedulerLostError:
    ...     est.set_params(client=new_client).fit(X, y)  # resumes from fit.ckpt
    >>> issubclass(SchedulerLostError, RuntimeError)
    True
    """


class FitInterrupted(KeyboardInterrupt):
    """``fit`` stopped at an update's end because the process was asked to stop (Ctrl-C, SIGTERM).

    The first SIGINT or SIGTERM during ``fit`` (in the main thread) asks the fit to stop at the
    end of the update running: the estimator keeps the weights trained so far (it stays fitted),
    the checkpoint is written when one is configured, every worker and job the fit held is given
    back, and this is raised -- a ``KeyboardInterrupt``, so a script exits with a nonzero status.
    A second Ctrl-C stops at once.  ``signal`` is the signal's number.

    Examples
    --------
    >>> from adadamp import FitInterrupted
    >>> try:  # doctest: +SKIP
    ...     est.fit(X, y)
    ... except FitInterrupted:
    ...     est.save_params(f_params="model.pt")  # what the fit trained until Ctrl-C
    ...     raise
    >>> issubclass(FitInterrupted, KeyboardInterrupt)
    True
    """

    def __init__(self, message: str, signal: int):
        super().__init__(message)
        self.signal = signal


class ShareTooSmallError(ValueError):
    """A worker's share of an update was too small for the module (BatchNorm in training mode
    needs more than one value per channel).

    Raised on the worker; the message names the fix (a larger batch, fewer workers per batch).

    Examples
    --------
    >>> issubclass(ShareTooSmallError, ValueError)
    True
    """


class CollectiveError(RuntimeError):
    """An all-reduce fit's collective failed on a worker: a peer died, hung past the collective
    timeout, or the group was re-formed meanwhile.

    The client re-forms the group without the lost workers and recomputes the update from the
    committed state; users see it only if that keeps failing.

    Examples
    --------
    >>> issubclass(CollectiveError, RuntimeError)
    True
    """


class UnknownFitError(KeyError):
    """A worker holds no state for the fit a call names: it was never set up there, or was
    released or dropped as idle meanwhile (its client's channel closed).

    A ``KeyError``, as a missing fit always was; the worker answers it to the client, which
    raises it where it raised the ``KeyError``.

    Examples
    --------
    >>> issubclass(UnknownFitError, KeyError)
    True
    """


class StopTraining(Exception):
    """Raised by a callback to end training after the current epoch or update.

    The estimator keeps what it trained so far and logs the message.

    Examples
    --------
    >>> from adadamp.callbacks import Callback
    >>> class StopAtLoss(Callback):
    ...     def on_epoch_end(self, estimator, row=None, **info):
    ...         if row["train_loss"] < 0.1:
    ...             raise StopTraining(f"train_loss {row['train_loss']:.3f} < 0.1")
    """


class InvalidParameterError(ValueError, TypeError):
    """A constructor parameter has a value it does not accept; raised by ``fit`` before any work.

    The message names the parameter, what it accepts and the value it got.  It is both a
    ``ValueError`` and a ``TypeError`` (a wrong value and a wrong type are one mistake to a user),
    like scikit-learn's error of the same name.

    Examples
    --------
    >>> from adadamp import DaskRegressor, InvalidParameterError
    >>> try:
    ...     DaskRegressor(max_epochs=0).fit([[0.0], [1.0]], [0.0, 1.0])
    ... except InvalidParameterError as err:
    ...     print(err)
    max_epochs must be an integer >= 1; got 0.
    """


class OldSpellingError(TypeError):
    """A name of the original adadamp that is spelled differently here (the message says how).

    Raised before any cluster work (:mod:`adadamp.porting` holds the table of old names).

    Examples
    --------
    >>> from adadamp.dampers import GeoDamp
    >>> try:
    ...     GeoDamp(dampingdelay=5)
    ... except OldSpellingError as err:
    ...     print(err)
    GeoDamp: `dampingdelay` is called `delay` here (epochs between increases).
    """


class UnsafeCheckpointError(PermissionError):
    """A checkpoint file that others could have written; it is not read.

    Examples
    --------
    >>> issubclass(UnsafeCheckpointError, PermissionError)
    True
    """


class CorruptCheckpointError(ValueError):
    """A checkpoint file that is not as adadamp writes it, or not for this estimator; nothing of it is used.

    Raised while loading, before any array is built from the file and before any cluster work or
    training step, so a crafted file costs neither memory nor a fitted state.

    Examples
    --------
    >>> issubclass(CorruptCheckpointError, ValueError)
    True
    """


class ChannelAuthError(PermissionError):
    """The peer did not prove that it holds the fit's key (:mod:`adadamp.wire.channel`).

    The client then sends that worker's gradients as Dask RPCs; the fit goes on.

    Examples
    --------
    >>> issubclass(ChannelAuthError, PermissionError)
    True
    """


class WorkerError(RuntimeError):
    """A gradient computation raised on the worker (not a lost worker).

    Its message is the worker's error as text, ``"TypeName: message"``: nothing a channel
    receives is unpickled.

    Examples
    --------
    >>> issubclass(WorkerError, RuntimeError)
    True
    """


class DatasetError(RuntimeError):
    """``dataset[i]`` raised on a worker; the message names the example and the worker.

    Examples
    --------
    >>> issubclass(DatasetError, RuntimeError)
    True
    """
