"""User inputs become arrays, dask arrays or a Dataset to train on, each check written once.

``fit``, ``predict`` and ``score`` accept NumPy arrays, pandas objects, lists, torch tensors,
dask arrays and DataFrames, and map-style torch Datasets of ``(x, y)`` pairs (read on the
workers when there is a cluster, else on the client); see the data guide (``docs/guide/data.rst``).
"""

from __future__ import annotations

import copy
import sys

import dask
import dask.array as da
import numpy as np
import torch
from sklearn.utils.validation import validate_data

from ..worker.loading import read_examples

#: More partitions than this are merged (each partition is a block a share is gathered from).
MAX_PARTITIONS = 1024


# ------------------------------------------------------------------ checks
def check_samples(n: int) -> None:
    """Refuse fewer than 2 examples (a batch and its variance need two)."""
    if n < 2:
        raise ValueError(f"Found {n} sample(s); adadamp needs at least 2 samples to train.")


def check_no_targets(y) -> None:
    """A torch Dataset yields its own targets: refuse a ``y`` beside it."""
    if y is not None:
        raise ValueError("With a torch Dataset as X, y must be None: the Dataset yields (x, y) pairs.")


def check_features(n_features: int, estimator) -> None:
    """Refuse ``X`` whose examples are not as wide as those ``estimator`` was fitted with."""
    if n_features != estimator.n_features_in_:
        raise ValueError(f"X has {n_features} features, but {type(estimator).__name__} was fitted with "
                         f"{estimator.n_features_in_}.")


def is_dask(X) -> bool:
    """Whether ``X`` is a dask collection (array or DataFrame): it is trained on where it lives."""
    return dask.is_dask_collection(X)


def is_dataset(X) -> bool:
    """Whether ``X`` is a map-style torch Dataset of ``(x, y)`` pairs."""
    return isinstance(X, torch.utils.data.Dataset)


# ------------------------------------------------------------------ in memory
def as_numpy(X):
    """A torch tensor or a dask collection as a NumPy array (other inputs unchanged)."""
    if isinstance(X, torch.Tensor):
        return X.detach().cpu().numpy()
    if is_dataset(X):
        raise TypeError("A torch Dataset goes to fit as X with y=None; see BaseDaskEstimator.fit.")
    if is_dask(X):
        return np.asarray(X.compute())
    return X


def to_arrays(estimator, X, y, *, reset: bool, y_numeric: bool):
    """Validated float32 ``X`` and ``y`` (scikit-learn's ``validate_data`` against ``estimator``),
    and (``reset``: fresh fits) the feature attributes to commit when the fit succeeds."""
    X = as_numpy(X)
    y = as_numpy(y) if y is not None else None
    checked = copy.copy(estimator) if reset else estimator  # a fresh fit sets n_features_in_ only when it succeeds
    X, y = validate_data(checked, X, y, reset=reset, dtype=np.float32, allow_nd=True, multi_output=True,
                         y_numeric=y_numeric)
    check_samples(X.shape[0])
    names = ("n_features_in_", "feature_names_in_")
    features = {k: getattr(checked, k) for k in names if reset and hasattr(checked, k) and k in vars(checked)}
    return np.ascontiguousarray(X), y, features


def features(estimator, X) -> np.ndarray:
    """In-memory ``X`` to predict on, checked against what ``estimator`` was fitted with."""
    return validate_data(estimator, as_numpy(X), reset=False, dtype=np.float32, allow_nd=True)


# ------------------------------------------------------------------ torch Datasets
def from_dataset(dataset, y):
    """Materialise a map-style torch Dataset of ``(x, y)`` pairs (placed on the workers once)."""
    check_no_targets(y)
    pairs = [dataset[i] for i in range(len(dataset))]
    X = np.stack([np.asarray(p[0]) for p in pairs])
    y = np.asarray([np.asarray(p[1]) for p in pairs])
    return X, y


def scoring_data(X, y):
    """``score`` takes arrays, or a map-style torch Dataset of ``(x, y)`` pairs with y=None (as fit)."""
    if isinstance(X, torch.utils.data.DataLoader):
        raise TypeError(
            "score takes arrays or a map-style torch Dataset, not a DataLoader: pass score(loader.dataset) "
            "(the original adadamp's score(X, y) also took a Dataset)."
        )
    if is_dataset(X):
        return from_dataset(X, y)
    return X, y


def dataset_arrays(client, dataset, rows: int = 4096):
    """A map-style torch Dataset of ``(x, y)`` pairs as dask arrays ``X, y`` whose chunks the
    workers of ``client`` read (``rows`` examples each); the client reads nothing."""
    head_X, head_y = client.submit(read_examples, dataset, 0, 1, pure=False).result()
    shipped = dask.delayed(dataset, pure=False)  # one key: the Dataset is pickled into the graph once
    n = len(dataset)
    Xs, ys = [], []
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        pair = dask.delayed(read_examples, nout=2, pure=False)(shipped, start, stop)
        Xs.append(da.from_delayed(pair[0], shape=(stop - start, *head_X.shape[1:]), dtype=np.float32))
        ys.append(da.from_delayed(pair[1], shape=(stop - start, *head_y.shape[1:]), dtype=head_y.dtype))
    return da.concatenate(Xs), da.concatenate(ys)


# ------------------------------------------------------------------ dask collections
def dask_frame_types() -> tuple[type, ...]:
    """dask's DataFrame and Series classes, or ``()`` when ``dask.dataframe`` was never imported.

    Whoever made a dask DataFrame imported ``dask.dataframe``; a dask array needs neither it nor
    pandas and pyarrow, which ``dask[array]`` (adadamp's requirement) does not install.
    """
    dd = sys.modules.get("dask.dataframe")
    return (dd.DataFrame, dd.Series) if dd is not None else ()


def _is_frame(X) -> bool:
    frames = dask_frame_types()
    return bool(frames) and isinstance(X, frames)


def as_dask_array(values):
    """A dask DataFrame or Series as a dask array with known chunk sizes (others unchanged)."""
    return values.to_dask_array(lengths=True) if _is_frame(values) else values


def aligned(values, like):
    """``values`` (array-like, dask array or Series) as a dask array chunked like ``like`` on axis 0."""
    values = as_dask_array(values)
    if not isinstance(values, da.Array):
        values = np.asarray(values)
    if values.shape[:1] != like.shape[:1]:
        raise ValueError(f"{values.shape[0] if values.ndim else 'a scalar'} values for {like.shape[0]} examples.")
    if isinstance(values, np.ndarray):
        return da.from_array(values, chunks=(like.chunks[0], *((-1,) * (values.ndim - 1))))
    return values.rechunk({0: like.chunks[0]})


NOT_NUMBERS = (
    "X has columns that are not numbers: {columns}. adadamp trains on float32 features and does not "
    "encode categories itself: encode them first, for example with dask-ml's Categorizer and DummyEncoder "
    "(make_pipeline(Categorizer(), DummyEncoder(), DaskClassifier(...))) or dd.get_dummies(X.categorize())."
)


def check_numeric_frame(X) -> None:
    """Refuse a dask DataFrame with columns that are not numbers or booleans (category, object,
    string, datetime), from its metadata alone: before any cluster work, not as a worker's
    ``could not convert string to float``.

    Examples
    --------
    >>> import dask.dataframe as dd, pandas as pd
    >>> frame = pd.DataFrame({"x": [1.0, 2.0], "colour": pd.Categorical(["red", "blue"])})
    >>> check_numeric_frame(dd.from_pandas(frame, npartitions=1))
    Traceback (most recent call last):
    ...
    TypeError: X has columns that are not numbers: 'colour' (category). adadamp trains on ...
    """
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    dtypes = X.dtypes.items() if hasattr(X, "columns") else [(X.name, X.dtype)]
    bad = [f"{name!r} ({dtype})" for name, dtype in dtypes if not (is_numeric_dtype(dtype) or is_bool_dtype(dtype))]
    if bad:
        raise TypeError(NOT_NUMBERS.format(columns=", ".join(bad)))


def dask_features(X):
    """A dask ``X`` (array or DataFrame) as a float32 dask array chunked along axis 0 only."""
    if _is_frame(X):
        check_numeric_frame(X)
        X = X.to_dask_array(lengths=True)
    if any(np.isnan(c) for c in X.chunks[0]):
        X = X.compute_chunk_sizes()
    if X.ndim < 2:
        raise ValueError(f"X must have at least 2 dimensions (examples x features); got shape {X.shape}.")
    return X.astype(np.float32).rechunk({i: -1 for i in range(1, X.ndim)})


def dask_arrays(X, y):
    """``X, y`` as dask arrays chunked along axis 0 only, with the same chunks, float32 ``X``.

    DataFrames and Series become arrays; unknown chunk sizes are computed (on the cluster), not
    rejected.  Returns ``(X, y, feature_names)`` (the DataFrame's string column names, or None).
    """
    if y is None:
        raise ValueError("A dask X needs its targets y (a dask array or Series with the same partitions).")
    names = None
    if _is_frame(X) and hasattr(X, "columns"):
        columns = list(X.columns)
        names = np.asarray(columns, dtype=object) if all(isinstance(c, str) for c in columns) else None
    elif not isinstance(X, da.Array):
        raise TypeError(f"X must be a dask array or DataFrame; got {type(X).__name__}.")
    X = dask_features(X)
    y = as_dask_array(y)
    if not isinstance(y, da.Array):
        y = da.from_array(np.asarray(y), chunks=(X.chunks[0],))
    if any(np.isnan(c) for c in y.chunks[0]):
        y = y.compute_chunk_sizes()
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X and y have different numbers of examples: {X.shape[0]} and {y.shape[0]}.")
    check_samples(X.shape[0])
    y = y.rechunk({0: X.chunks[0], **{i: -1 for i in range(1, y.ndim)}})
    return X, y, names


def engine_blocks(X, y, n_workers: int):
    """``X, y`` rechunked along axis 0 only when their partitions are far from what the engine
    shares well among ``n_workers``: fewer than 4 per worker (the work could not be balanced)
    or more than ``MAX_PARTITIONS``.  Returns ``(X, y)``, the same arrays when they fit.

    Examples
    --------
    >>> X, y = engine_blocks(da.zeros((100, 3), chunks=50), da.zeros(100, chunks=50), n_workers=2)
    >>> len(X.chunks[0]), X.chunks[0] == y.chunks[0]
    (15, True)
    """
    n_parts = len(X.chunks[0])
    if 4 * n_workers <= n_parts <= MAX_PARTITIONS:
        return X, y
    target = 8 * n_workers if n_parts < 4 * n_workers else 256
    rows = max(1, -(-X.shape[0] // target))
    return X.rechunk({0: rows}), y.rechunk({0: rows})
