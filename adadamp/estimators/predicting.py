"""``predict``, ``predict_proba`` and ``score``: what a fitted estimator answers.

One mixin per kind of estimator, as scikit-learn's ``LinearClassifierMixin`` gives its linear
classifiers their predictions: :class:`ClassifierPredictMixin` (labels from ``classes_``, class
probabilities, accuracy) and :class:`RegressorPredictMixin` (targets, R^2).  The module's outputs
are computed on the client for in-memory data and on the workers for dask data and torch Datasets,
which are scored there too.  For a dask ``X`` the module goes into the graph once (one key,
fetched once per worker) and every partition is mapped through it where it lives, so ``predict``
returns a dask array with ``X``'s partitions (dask-ml's ``ParallelPostFit`` convention).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.utils.validation import check_is_fitted
from torch import nn

from ..cluster import policy as cl
from ..data import convert
from ..data.convert import aligned

_ROWS = 4096  # examples per forward pass


def forward(module: torch.nn.Module, X: np.ndarray) -> np.ndarray:
    """The module's outputs for ``X`` (eval mode, no gradients), float64.

    Examples
    --------
    >>> forward(torch.nn.Linear(2, 1), np.zeros((3, 2), dtype=np.float32)).shape
    (3, 1)
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    training = module.training
    module.eval()
    outs = []
    try:
        with torch.no_grad():
            for start in range(0, len(X), _ROWS):
                outs.append(module(torch.tensor(X[start : start + _ROWS])))  # a copy: X may be read-only
    finally:
        module.train(training)
    return torch.cat(outs).double().numpy() if outs else np.zeros((0, 0))


def _forward_block(block: np.ndarray, module: torch.nn.Module) -> np.ndarray:
    return forward(module, block)


def probabilities(outputs, log_probabilities: bool):
    """Class probabilities from module outputs: their softmax, or their exponential when the
    outputs are log-probabilities (``NLLLoss``).  Dask outputs are mapped block by block.

    Examples
    --------
    >>> probabilities(np.zeros((1, 2)), log_probabilities=False).tolist()
    [[0.5, 0.5]]
    """
    if convert.is_dask(outputs):
        return outputs.map_blocks(probabilities, log_probabilities=log_probabilities, dtype=np.float64)
    out = torch.from_numpy(np.ascontiguousarray(outputs))
    return (out.exp() if log_probabilities else torch.softmax(out, dim=1)).numpy()


def labels(outputs, classes: np.ndarray):
    """The most likely class of each example.  Dask outputs are mapped block by block.

    Examples
    --------
    >>> labels(np.array([[0.1, 0.9]]), np.array(["no", "yes"])).tolist()
    ['yes']
    """
    if convert.is_dask(outputs):
        return outputs.map_blocks(labels, classes=classes, drop_axis=1, dtype=classes.dtype)
    return classes[np.argmax(outputs, axis=1)]


def dask_outputs(module: torch.nn.Module, X, n_outputs: int):
    """``forward`` mapped over a dask array's partitions on the workers; the module is one key."""
    import dask

    module_key = dask.delayed(module, pure=False)
    drop = list(range(2, X.ndim))
    return X.map_blocks(
        _forward_block, module_key, chunks=(X.chunks[0], (n_outputs,)), dtype=np.float64,
        drop_axis=drop if drop else None,
    )


def dask_accuracy(predicted, y, sample_weight=None) -> float:
    """Accuracy of dask predictions, computed on the cluster (only the number comes back)."""
    import dask

    correct = predicted == aligned(y, predicted)
    if sample_weight is None:
        value = correct.mean()
    else:
        w = aligned(sample_weight, predicted)
        value = (correct * w).sum() / w.sum()
    return float(dask.compute(value)[0])


def dask_r2(predicted, y, sample_weight=None) -> float:
    """R^2 of dask predictions (scikit-learn's ``r2_score``, uniform average over outputs),
    computed on the cluster: only the per-output sums come back."""
    import dask
    import dask.array as da

    y = aligned(y, predicted).astype(np.float64)
    p = predicted.astype(np.float64)
    y2, p2 = (y[:, None] if y.ndim == 1 else y), (p[:, None] if p.ndim == 1 else p)
    w = da.ones(y2.shape[0], chunks=(y2.chunks[0],)) if sample_weight is None else aligned(sample_weight, p)
    w2 = w.astype(np.float64)[:, None]
    mean = (w2 * y2).sum(axis=0) / w2.sum()
    ss_res, ss_tot = dask.compute((w2 * (y2 - p2) ** 2).sum(axis=0), (w2 * (y2 - mean) ** 2).sum(axis=0))
    scores = np.where(ss_tot != 0, 1 - ss_res / np.where(ss_tot != 0, ss_tot, 1.0), np.where(ss_res == 0, 1.0, 0.0))
    return float(np.mean(scores))


def outputs(module: torch.nn.Module, X, estimator, client):
    """``module``'s outputs for any ``X`` a fitted ``estimator`` predicts on: NumPy for in-memory
    ``X``; for a dask ``X`` a dask array computed on the workers, partition by partition (nothing
    is computed until asked); for a torch Dataset, NumPy computed on the workers of ``client`` (or
    read here without one).  ``estimator``: its ``n_features_in_`` checks ``X``."""
    if isinstance(X, torch.utils.data.Dataset):
        if client is None:
            return outputs(module, convert.from_dataset(X, None)[0], estimator, None)
        with client.as_current():
            return outputs(module, convert.dataset_arrays(client, X)[0], estimator, client).compute()
    if convert.is_dask(X):
        X = convert.dask_features(X)
        convert.check_features(X.shape[1], estimator)
        width = forward(module, np.zeros((1, *X.shape[1:]), dtype=np.float32)).shape[1]  # one zero example
        return dask_outputs(module, X, width)
    return forward(module, convert.features(estimator, X))


def scoring_inputs(X, y, client):
    """``score``'s ``X, y``: a torch Dataset becomes dask arrays the workers of ``client`` read (else
    arrays read here)."""
    if isinstance(X, torch.utils.data.Dataset) and client is not None:
        convert.check_no_targets(y)
        return convert.dataset_arrays(client, X)
    return convert.scoring_data(X, y)



class _Predictor:
    """What both mixins share: the module's outputs, and the score on the cluster or in memory."""

    #: ``metric(predictions, y, sample_weight)`` on dask collections, run on the cluster.
    _dask_metric = None

    def _forward(self, X):
        """The module's outputs for ``X`` (:func:`adadamp.outputs`)."""
        check_is_fitted(self)
        with self._call_client(needed=convert.is_dataset(X)) as client:
            return outputs(getattr(self, "averaged_module_", self.module_), X, self, client)

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
            X, y = scoring_inputs(X, y, client)
            if convert.is_dask(X):
                with cl.as_current(client):
                    return self._dask_metric(self.predict(X), y, sample_weight)
        return super().score(X, y, sample_weight=sample_weight)  # ClassifierMixin's or RegressorMixin's


class ClassifierPredictMixin(_Predictor, ClassifierMixin):
    """A fitted classifier's labels (from ``classes_``), probabilities and accuracy."""

    _dask_metric = staticmethod(dask_accuracy)

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
        return probabilities(self._forward(X), isinstance(self.criterion_, nn.NLLLoss))

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
        return labels(out, self.classes_)


class RegressorPredictMixin(_Predictor, RegressorMixin):
    """A fitted regressor's targets (1-d when ``y`` was) and R^2."""

    _dask_metric = staticmethod(dask_r2)

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
