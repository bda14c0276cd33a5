"""``fit`` and ``partial_fit``, and the fitted state they leave: the estimators' training side.

:mod:`adadamp.estimators` declares the parameters; this mixin is what a fit does with them, one
recipe for ``fit``, ``partial_fit`` and warm starts (``_fit``): check them, turn the inputs into a
data source (:mod:`adadamp.data`), build or continue the state (:mod:`adadamp.building`, with the
fit's seed and its resumption from a checkpoint file), train it in
:func:`adadamp.engine.session.train`, and set it on the estimator only when training returns.
Saving and loading that state (skorch's ``save_params`` / ``load_params``) and its summary
``meta_`` go with it.  Its own module because it is one concept, the fit's orchestration, which
the estimators' scikit-learn declaration (parameters, constraints, cloning, pickling) and their
predictions (:mod:`adadamp.predicting`) need not read.
"""

from __future__ import annotations

import copy
import functools
import types
from typing import Self

from sklearn.base import ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from . import building, checkpoint, dashboard, porting
from . import cluster as cl
from .data import convert, make_source
from .engine import session
from .engine.loop import FitLoop
from .exceptions import ConvergenceError, FitInterrupted, NoWorkersError, SchedulerLostError
from .records import TrainingState


class FitMixin:
    """The training side of :class:`~adadamp.estimators.BaseDaskEstimator` (whose docstring
    documents the parameters and fitted attributes): ``fit``, ``partial_fit``, ``save_params``,
    ``load_params`` and ``meta_``."""

    def fit(self, X, y=None, sample_weight=None, **fit_params) -> Self:
        """Train for ``max_epochs`` epochs (afresh unless ``warm_start``).

        Parameters
        ----------
        X : array-like of shape (n_samples, ...) or torch Dataset
            numpy, torch tensor, pandas or list (placed on the workers once),
            a dask array or DataFrame (trained on where its partitions are;
            the client holds none of it), or a map-style torch Dataset of
            ``(x, y)`` pairs (then ``y=None``), which the workers read example
            by example (the embedded cluster's too).
            N-dimensional inputs (images, sequences) are kept as they are.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            Targets: labels for the classifier, numbers for the regressor.
            None when ``X`` is a torch Dataset.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the examples: the trained loss is the
            weighted mean ``sum(w * loss) / sum(w)`` of each batch (with the
            criterion's class weights, if any, multiplied in).  A dask array
            when ``X`` is one.  Not with a torch Dataset.
        **fit_params
            ``classes`` (:class:`DaskClassifier` only): every label, when
            ``y`` may not contain all of them.

        Returns
        -------
        self

        Raises
        ------
        ConvergenceError
            The loss became non-finite; the estimator keeps the last finite
            weights.
        NoWorkersError
            No worker was left and none joined within ``worker_timeout``.
        SchedulerLostError
            The Dask scheduler went away during the fit.

        Examples
        --------
        >>> from sklearn.datasets import load_digits
        >>> from adadamp import DaskClassifier
        >>> X, y = load_digits(return_X_y=True)
        >>> est = DaskClassifier(max_epochs=3, random_state=0)
        >>> est.fit(X / 16, y)  # doctest: +SKIP
        DaskClassifier(max_epochs=3, random_state=0)
        >>> len(est.history_)  # doctest: +SKIP
        3
        """
        warm = self.warm_start and is_fitted(self)
        return self._fit(X, y, epochs=self.max_epochs, fresh=not warm, sample_weight=sample_weight,
                         **self._check_fit_params(fit_params))

    def partial_fit(self, X, y=None, sample_weight=None, **fit_params) -> Self:
        """Train for exactly one epoch, continuing from the fitted state.

        ``max_epochs`` is ignored.  The first call on an unfitted estimator
        starts afresh; later calls continue with the same weights,
        optimizer state, damper state and epoch clock, so ``n`` calls train
        like ``fit`` with ``max_epochs=n``.  If ``batch_size`` (or a
        ``batch_size__*`` parameter) changed since the last call, the damper
        is built again.

        On a cluster of yours (``client``, or a current Client) the workers
        keep the module and the placed data between calls: a call on the
        same data (the same dask graph, Dataset, or arrays with the same
        contents) starts at once.  They are released by a call on other
        data, by ``fit``, after 10 minutes without a call, or when the
        estimator is deleted.

        Parameters
        ----------
        X, y
            As for :meth:`fit`.
        **fit_params
            As for :meth:`fit`.

        Returns
        -------
        self

        Examples
        --------
        >>> from sklearn.datasets import make_regression
        >>> from adadamp import DaskRegressor
        >>> X, y = make_regression(n_features=10, random_state=0)
        >>> est = DaskRegressor(random_state=0)
        >>> for _ in range(3):  # doctest: +SKIP
        ...     est = est.partial_fit(X, y)
        >>> est.n_iter_  # doctest: +SKIP
        3
        """
        return self._fit(X, y, epochs=1, fresh=not is_fitted(self), keep=True, sample_weight=sample_weight,
                         **self._check_fit_params(fit_params))

    def _check_fit_params(self, fit_params: dict) -> dict:
        """The keyword arguments of ``fit`` beyond ``sample_weight`` that this estimator takes."""
        allowed = ("classes",) if isinstance(self, ClassifierMixin) else ()
        unknown = sorted(set(fit_params) - set(allowed))
        if unknown:
            takes = ", ".join(("sample_weight", *allowed))
            raise TypeError(f"{type(self).__name__}.fit got unexpected keyword argument(s) {unknown}; "
                            f"it takes X, y and {takes}.")
        return fit_params

    def _fit(self, X, y, *, epochs: int, fresh: bool, classes=None, keep: bool = False, sample_weight=None):
        """The recipe of ``fit`` and ``partial_fit``: check, make the data source, build or continue
        the state, train it on the cluster, and commit it only when training returns."""
        callbacks = self._check_params()
        if sample_weight is not None and convert.is_dataset(X):
            raise ValueError("sample_weight is not taken with a torch Dataset as X: weight the examples' loss in "
                             "the criterion, or fit arrays.")
        params = self.get_params(deep=False)
        with self._call_client() as client:
            return self._fit_with(client, X, y, epochs=epochs, fresh=fresh, classes=classes, keep=keep,
                                  sample_weight=sample_weight, callbacks=callbacks, params=params)

    def _fit_with(self, given, X, y, *, epochs, fresh, classes, keep, sample_weight, callbacks, params):
        """:meth:`_fit` on the ``given`` client (None: the embedded cluster)."""
        policy = cl.ClusterPolicy.of(params, embedded=given is None)
        with cl.reading_client(given, policy, workers_read=convert.is_dataset(X)) as (client, policy):
            targets = self._targets(fresh, classes)
            made = make_source(
                X, y, targets, estimator=self, fresh=fresh, client=client, sample_weight=sample_weight,
                seed=functools.partial(building.draw_seed, self.random_state) if fresh else lambda: self.loop_.seed,
                validation_fraction=self.validation_fraction,
                loading={"threads": int(self.dataset_threads), "cache": bool(self.dataset_cache)},
                dask_data=self.dask_data,
            )
            if fresh:
                state = building.initial_state(params, made, targets)
            else:  # on copies, so that a failed call leaves the fitted state as it was
                state = building.continued_state(copy.deepcopy(self._state()), params, made, self._damper_spec_)
            epoch_updates = building.resume(state, params, made.source, fresh)  # from the checkpoint file
            if fresh:
                epochs -= len(state.history)  # the epochs a resumed checkpoint trained
            state.callbacks = callbacks  # the clones that run, kept with what they learn
            weighted, valid = building.ready(state, made)
            loop = FitLoop(self, state, checkpoint=self.checkpoint, checkpoint_every=self.checkpoint_every,
                           verbose=self.verbose, valid=valid, page=dashboard.opener(type(self).__name__, params, state),
                           budgeted=not keep)
            self._training_state = state  # save_params from a callback saves this state, not the last fit's
            start = state.loop.n_updates
            try:
                self._kept_backend = session.train(
                    loop, made.source, epochs, epoch_updates, backend=self.backend, device=str(self.device),
                    client=client, policy=policy, criterion=weighted, fresh=fresh, keep=keep, owner=self,
                    kept=self.__dict__.pop("_kept_backend", None),  # one call at a time uses it
                )
            except (ConvergenceError, NoWorkersError, SchedulerLostError, FitInterrupted):
                if state.loop.n_updates > start:
                    self._commit(state)  # training stopped cleanly, with the last good weights
                raise
            finally:
                del self._training_state
        self._commit(state)
        self._data_path = made.path
        return self

    def _commit(self, state: TrainingState) -> None:
        state.set_on(self)
        self._damper_spec_ = building.damper_spec(self.get_params(deep=False))

    # --------------------------------------------------------- save / load
    def save_params(self, f_params=None, f_optimizer=None, f_history=None, f_checkpoint=None) -> None:
        """Save parts of the fitted state (skorch's names).

        Parameters
        ----------
        f_params : path, optional
            The module's ``state_dict`` (``torch.save``).
        f_optimizer : path, optional
            The optimizer's ``state_dict``.
        f_history : path, optional
            ``history_`` as JSON.
        f_checkpoint : path, optional
            Everything needed to resume training (see ``checkpoint``).

        Examples
        --------
        >>> est.save_params(f_params="model.pt", f_history="history.json")  # doctest: +SKIP
        """
        state = getattr(self, "_training_state", None)  # during fit (from a callback): what is being trained
        if state is None:
            check_is_fitted(self)
            state = self._state()
        checkpoint.save_parts(state, f_params=f_params, f_optimizer=f_optimizer, f_history=f_history,
                              f_checkpoint=f_checkpoint)

    def load_params(self, f_params=None, f_optimizer=None, f_history=None, f_checkpoint=None) -> Self:
        """Load what :meth:`save_params` saved into a fitted estimator of the same structure.

        There is no separate initialisation step: the estimator must have
        been fitted (for instance for one epoch on the same data), so that
        ``module_`` and ``optimizer_`` exist to receive the saved state.

        Parameters
        ----------
        f_params : path, optional
            A module ``state_dict`` saved by :meth:`save_params`.
        f_optimizer : path, optional
            An optimizer ``state_dict``.
        f_history : path, optional
            A JSON history; sets ``history_`` and ``n_iter_``.
        f_checkpoint : path, optional
            A full training state (weights, optimizer, damper, epoch clock,
            history).  It must have been written for the same number of
            training examples as this estimator was fitted on.

        Returns
        -------
        self

        Examples
        --------
        >>> est.save_params(f_params="model.pt")  # doctest: +SKIP
        >>> new = DaskClassifier(max_epochs=1).fit(X, y)  # doctest: +SKIP
        >>> new.load_params(f_params="model.pt")  # doctest: +SKIP
        """
        check_is_fitted(self)
        state = self._state()
        checkpoint.load_parts(state, self.loop_.n_data, f_params=f_params, f_optimizer=f_optimizer,
                              f_history=f_history, f_checkpoint=f_checkpoint)
        if f_checkpoint is not None:
            self._commit(state)  # the damper and the epoch clock too
        self.history_, self.n_iter_ = state.history, len(state.history)
        return self

    def _state(self) -> TrainingState:
        """The fitted state as a :class:`~adadamp.records.TrainingState` (shares the objects)."""
        return TrainingState.of(self, target_keys=("classes_", "_y_1d"))

    @property
    def meta_(self) -> types.MappingProxyType:
        """Read-only summary of the fitted state (adadamp's ``meta_``).

        Keys: ``n_updates``, ``n_samples_seen``, ``epochs`` (the epoch
        clock), from the last epoch's row of ``history_``: ``batch_size``,
        ``lr``, ``n_workers`` and ``train_loss``, and ``data``: how the last
        call's examples reached the workers ("sent", "persisted",
        "streamed" or "read").

        Examples
        --------
        >>> est.fit(X, y).meta_["n_updates"]  # doctest: +SKIP
        570
        """
        check_is_fitted(self)
        return porting.meta(self.loop_, self.history_, data=getattr(self, "_data_path", None))


def is_fitted(est) -> bool:
    return hasattr(est, "module_")
