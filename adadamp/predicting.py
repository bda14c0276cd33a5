"""``predict``, ``predict_proba`` and ``score``: what a fitted estimator answers.

One mixin per kind of estimator, as scikit-learn's ``LinearClassifierMixin`` gives its linear
classifiers their predictions: :class:`ClassifierPredictMixin` (labels from ``classes_``, class
probabilities, accuracy) and :class:`RegressorPredictMixin` (targets, R^2).  The module's outputs
come from :mod:`adadamp.inference`: on the client for in-memory data, on the workers for dask data
and torch Datasets, which are scored there too.  Its own module because predicting is
a concept apart from the estimators' declaration (:mod:`adadamp.estimators`) and their training
(:mod:`adadamp.fitting`).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.utils.validation import check_is_fitted
from torch import nn

from . import cluster as cl
from . import inference
from .data import convert


class _Predictor:
    """What both mixins share: the module's outputs, and the score on the cluster or in memory."""

    #: ``metric(predictions, y, sample_weight)`` on dask collections, run on the cluster.
    _dask_metric = None

    def _forward(self, X):
        """The module's outputs for ``X`` (:func:`adadamp.inference.outputs`)."""
        check_is_fitted(self)
        with self._call_client(needed=convert.is_dataset(X)) as client:
            return inference.outputs(self.module_, X, self, client)

    def score(self, X, y=None, sample_weight=None) -> float:
        """Mean accuracy (classifier) or R^2 (regressor) of :meth:`predict` on ``X``, as scikit-learn's.

        Greater is better, so ``GridSearchCV`` picks the best model.  Dask
        collections and Datasets are scored on the cluster.

        Parameters
        ----------
        X : array-like of shape (n_samples, ...) or torch Dataset
            A map-style Dataset of ``(x, y)`` pairs takes ``y=None``.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            True labels or targets.
        sample_weight : array-like of shape (n_samples,), optional

        Returns
        -------
        float

        Examples
        --------
        >>> DaskClassifier(max_epochs=5).fit(X, y).score(X_test, y_test)  # doctest: +SKIP
        0.96
        """
        with self._call_client(needed=convert.is_dataset(X) or convert.is_dask(X)) as client:  # in memory: none
            X, y = inference.scoring_inputs(X, y, client)
            if convert.is_dask(X):
                with cl.as_current(client):
                    return self._dask_metric(self.predict(X), y, sample_weight)
        return super().score(X, y, sample_weight=sample_weight)  # ClassifierMixin's or RegressorMixin's


class ClassifierPredictMixin(_Predictor, ClassifierMixin):
    """A fitted classifier's labels (from ``classes_``), probabilities and accuracy."""

    _dask_metric = staticmethod(inference.dask_accuracy)

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, columns in ``classes_`` order.

        The softmax of the module's output (its exponential when the
        criterion is ``NLLLoss``, whose inputs are log-probabilities),
        computed on the client's CPU in eval mode.

        Parameters
        ----------
        X : array-like of shape (n_samples, ...)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)

        Examples
        --------
        >>> est.fit(X, y).predict_proba(X[:2]).sum(axis=1)  # doctest: +SKIP
        array([1., 1.])
        """
        return inference.probabilities(self._forward(X), isinstance(self.criterion_, nn.NLLLoss))

    def predict(self, X) -> np.ndarray:
        """The most likely label of each example.

        Parameters
        ----------
        X : array-like of shape (n_samples, ...), dask collection or torch Dataset
            Dask data and Datasets are predicted on the workers.

        Returns
        -------
        ndarray of shape (n_samples,)
            Labels from ``classes_`` (strings stay strings).

        Examples
        --------
        >>> est = DaskClassifier().fit(X, ["odd" if v % 2 else "even" for v in y])  # doctest: +SKIP
        >>> est.predict(X[:3])  # doctest: +SKIP
        array(['even', 'odd', 'even'], dtype='<U4')
        """
        out = self._forward(X)  # checks that the estimator is fitted, before classes_ is read
        return inference.labels(out, self.classes_)


class RegressorPredictMixin(_Predictor, RegressorMixin):
    """A fitted regressor's targets (1-d when ``y`` was) and R^2."""

    _dask_metric = staticmethod(inference.dask_r2)

    def predict(self, X) -> np.ndarray:
        """Predicted targets, 1-d when ``y`` was 1-d.

        Parameters
        ----------
        X
            As for :meth:`DaskClassifier.predict`.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_targets)
            float64.

        Examples
        --------
        >>> DaskRegressor().fit(X, y).predict(X[:2]).shape  # doctest: +SKIP
        (2,)
        """
        out = self._forward(X)
        return out[:, 0] if self._y_1d else out
