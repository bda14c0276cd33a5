"""The targets of a fit as the criterion takes them: one object per task, whatever holds ``y``.

A classifier's targets are class labels (:class:`Labels`: ``classes_``, labels encoded as class
indices); a regressor's are values (:class:`Values`: float32 columns, ``_y_1d``).  Either encodes
``y`` held in memory (:meth:`Targets.encode`), a dask ``y`` lazily on the cluster after one pass
of checks (:meth:`Targets.dask_checks`, :meth:`Targets.encode_dask`), and one example's target
on the workers that read a torch Dataset (:meth:`Targets.example_encoder`).  Each also says
which criterion fits it by default and what output shape a criterion needs for it.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable

import dask.array as da
import numpy as np
from sklearn.exceptions import DataConversionWarning
from sklearn.utils.multiclass import check_classification_targets
from torch import nn

from ..worker.loading import float_targets
from .convert import dataset_arrays

logger = logging.getLogger(__name__)


def encode_labels(labels: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Class indices of ``labels`` in the sorted ``known`` classes (a module-level function, so a
    dask graph that uses it tokenizes the same in every run).

    Examples
    --------
    >>> encode_labels(np.array(["b", "a", "b"]), known=np.array(["a", "b"])).tolist()
    [1, 0, 1]
    """
    return np.searchsorted(known, labels).astype(np.int64)


class Targets:
    """How a fit's ``y`` becomes what the criterion takes, and the attributes it fixes.

    Each ``encode*`` method returns the encoded targets and the estimator attributes to commit
    (``classes_`` or ``_y_1d``); a warm start checks ``y`` against the fitted ones.
    """

    #: Whether scikit-learn's validation requires numeric ``y`` (``validate_data(y_numeric=...)``).
    y_numeric = False
    #: The criterion of ``criterion=None``.
    default_criterion: type[nn.Module]

    def encode(self, y: np.ndarray) -> tuple[np.ndarray, dict]:
        """``y`` in memory, encoded; and the target attributes."""
        raise NotImplementedError

    def dask_checks(self, y: da.Array) -> dict:
        """What the one pass over a dask ``y`` computes (lazy scalars and small arrays)."""
        raise NotImplementedError

    def encode_dask(self, y: da.Array, checked: dict) -> tuple[da.Array, dict]:
        """A dask ``y`` encoded lazily, given the computed :meth:`dask_checks`; and the attributes."""
        raise NotImplementedError

    def example_encoder(self, attrs: dict) -> Callable:
        """What turns one example's target into the criterion's (on the workers reading a Dataset)."""
        raise NotImplementedError

    def dataset_values(self, client, dataset, head_y: np.ndarray) -> np.ndarray:
        """The targets of a Dataset that :meth:`encode` checks before training (two suffice here)."""
        return head_y

    def n_outputs(self, attrs: dict, y: np.ndarray) -> int:
        """The module's output width for encoded targets ``y``."""
        raise NotImplementedError

    def output_shape(self, criterion: nn.Module, y: np.ndarray, n_outputs: int) -> tuple | None:
        """The module output's shape ``criterion`` needs for encoded targets ``y`` (None: any it takes)."""
        return None


class Labels(Targets):
    """Class labels of any type; ``classes_`` holds them sorted, training takes their indices.

    Parameters
    ----------
    owner : str
        The estimator's class name, for messages.
    fitted : ndarray or None
        The fitted ``classes_`` (a warm start), else None.
    classes : array-like, optional
        Every label (``partial_fit``'s ``classes=``) on a fresh fit.

    Examples
    --------
    >>> y, attrs = Labels("DaskClassifier").encode(np.array(["b", "a", "b"]))
    >>> y.tolist(), attrs["classes_"].tolist()
    ([1, 0, 1], ['a', 'b'])
    """

    default_criterion = nn.CrossEntropyLoss

    def __init__(self, owner: str, fitted: np.ndarray | None = None, classes=None):
        self.owner = owner
        self.fitted = fitted
        self.classes = classes

    def encode(self, y: np.ndarray) -> tuple[np.ndarray, dict]:
        if y.ndim == 2 and y.shape[1] == 1:
            warnings.warn(
                "A column-vector y was passed when a 1d array was expected; it is raveled.",
                DataConversionWarning,
                stacklevel=6,  # the caller of fit: encode < _array_source < make_source < _fit < fit < caller
            )
            y = y.ravel()
        self._check_1d(y)
        check_classification_targets(y)
        known = self._known(np.unique(y))
        return encode_labels(y, known), {"classes_": known}

    def dask_checks(self, y: da.Array) -> dict:
        """The labels."""
        self._check_1d(y)
        return {"labels": da.unique(y)}

    def encode_dask(self, y: da.Array, checked: dict) -> tuple[da.Array, dict]:
        labels = checked["labels"]
        check_classification_targets(labels)
        known = self._known(labels)
        return y.map_blocks(encode_labels, known=known, dtype=np.int64), {"classes_": known}

    def example_encoder(self, attrs: dict) -> Callable:
        return functools.partial(encode_labels, known=attrs["classes_"])

    def dataset_values(self, client, dataset, head_y: np.ndarray) -> np.ndarray:
        """Every label: the Dataset's ``targets`` (torchvision's convention), else read on the workers."""
        labels = getattr(dataset, "targets", None)
        if labels is not None and len(labels) == len(dataset):
            return np.asarray(labels)
        start = time.perf_counter()
        with client.as_current():  # the Dataset's targets, read chunk by chunk on the workers
            labels = np.asarray(dataset_arrays(client, dataset)[1].compute())
        logger.info("read %d labels on the cluster in %.2f s (a Dataset with a `targets` attribute skips this)",
                    len(labels), time.perf_counter() - start)
        return labels

    def n_outputs(self, attrs: dict, y: np.ndarray) -> int:
        return len(attrs["classes_"])

    def output_shape(self, criterion: nn.Module, y: np.ndarray, n_outputs: int) -> tuple | None:
        """One score per class, for the criteria that take class indices."""
        if isinstance(criterion, (nn.CrossEntropyLoss, nn.NLLLoss)):
            return (len(y), n_outputs)
        return None

    @staticmethod
    def _check_1d(y) -> None:
        if y.ndim != 1:
            raise ValueError(f"DaskClassifier expects 1-d labels; got y of shape {y.shape}.")

    def _known(self, labels: np.ndarray) -> np.ndarray:
        """The classes y's ``labels`` (each once) are encoded in; a label outside them, or a single
        class, is refused with the fix (scikit-learn's ``classes=`` convention for partial_fit)."""
        fresh = self.fitted is None
        known = (np.unique(self.classes) if self.classes is not None else labels) if fresh else self.fitted
        unknown = np.setdiff1d(labels, known)
        if len(unknown) and fresh:
            raise ValueError(f"y contains labels not in classes=: {unknown[:10].tolist()}; classes= must list "
                             "every label.")
        if len(unknown):
            raise ValueError(
                f"y contains labels the fitted classifier does not know: {unknown[:10].tolist()} (its classes_ are "
                f"{known[:10].tolist()}). Labels are fixed by the first call: pass every label as classes= to the "
                "first partial_fit, e.g. partial_fit(X, y, classes=np.unique(all_labels)), or fit afresh."
            )
        if len(known) < 2:
            raise ValueError(
                f"{self.owner} needs at least 2 classes; y has only one class, {known.tolist()[0]!r}. With "
                "partial_fit on data whose first part has one class, pass every label as classes= on the first call."
            )
        return known


class Values(Targets):
    """Numbers to regress on, trained as float32 columns; ``_y_1d`` remembers a 1-d ``y``.

    Parameters
    ----------
    fitted_1d : bool or None
        Whether the fitted ``y`` was 1-d (a warm start keeps its dimensions), else None.

    Examples
    --------
    >>> y, attrs = Values().encode(np.array([1.0, 2.0]))
    >>> y.shape, attrs
    ((2, 1), {'_y_1d': True})
    """

    y_numeric = True
    default_criterion = nn.MSELoss

    def __init__(self, fitted_1d: bool | None = None):
        self.fitted_1d = fitted_1d

    def encode(self, y: np.ndarray) -> tuple[np.ndarray, dict]:
        y_1d = self._check_dims(y)
        with np.errstate(over="ignore"):
            y32 = y.astype(np.float32)
        if not np.isfinite(y32).all():
            raise ValueError(
                f"y has values beyond float32's range (largest magnitude {float(np.max(np.abs(y))):.3g}); "
                "training is in float32. Scale y (e.g. sklearn's TransformedTargetRegressor with a StandardScaler)."
            )
        return np.ascontiguousarray(y32.reshape(len(y), -1)), {"_y_1d": y_1d}

    def dask_checks(self, y: da.Array) -> dict:
        """Whether it fits float32."""
        return {"y_finite": da.isfinite(y.astype(np.float32)).all()}

    def encode_dask(self, y: da.Array, checked: dict) -> tuple[da.Array, dict]:
        if not checked["y_finite"]:
            raise ValueError("y has values beyond float32's range (or NaN); scale y, training is in float32.")
        y_1d = self._check_dims(y)
        return (y[:, None] if y_1d else y).astype(np.float32), {"_y_1d": y_1d}

    def example_encoder(self, attrs: dict) -> Callable:
        return float_targets

    def n_outputs(self, attrs: dict, y: np.ndarray) -> int:
        return y.shape[1]

    def output_shape(self, criterion: nn.Module, y: np.ndarray, n_outputs: int) -> tuple:
        return tuple(y.shape)

    def _check_dims(self, y) -> bool:
        """Whether y is 1-d; a warm start keeps the dimensions it was fitted with."""
        y_1d = y.ndim == 1
        if self.fitted_1d is not None and y_1d != self.fitted_1d:
            raise ValueError(f"y has {y.ndim} dimension(s) but the estimator was fitted with the other shape.")
        return y_1d
