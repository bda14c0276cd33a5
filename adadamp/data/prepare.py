"""The one call a fit makes to turn its ``X, y`` into what it trains on (:func:`make_source`).

In-memory inputs are validated and placed on the workers from the client; a dask ``X`` is checked
in one pass on its cluster and persisted there; a torch Dataset is checked through the workers,
which read it.  The data guide (``docs/guide/data.rst``) describes each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

import dask
import dask.array as da
import numpy as np
from dask.utils import format_bytes
from sklearn.model_selection import train_test_split

from ..sample_weight import check_sample_weight, normalized, pack
from ..worker.loading import read_examples
from . import convert, memory, streaming
from .sources import ArrayData, DaskArrayData, DatasetData, DataSource
from .streaming import StreamedDaskData
from .targets import Targets

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class FitData:
    """What a fit trains on, made by :func:`make_source`."""

    source: DataSource
    #: The first examples' inputs and encoded targets (the module's shape check on the client).
    head: tuple[np.ndarray, np.ndarray]
    #: The estimator attributes the data fixes (``classes_`` or ``_y_1d``; fresh: ``n_features_in_``...).
    attrs: dict
    n_outputs: int
    seed: int
    #: The held-out ``(X, y)`` (``y`` packed with the weights when weighted), or None.
    valid: tuple | None = None
    #: Whether the source's targets carry sample weights (:mod:`adadamp.sample_weight`).
    weighted: bool = False
    #: How the workers get the examples: "sent" (from the client), "persisted" or "streamed"
    #: (a dask collection), "read" (a torch Dataset, read on the workers).
    path: str = "sent"


def make_source(
    X, y, targets: Targets, *, estimator, fresh: bool, client, seed: Callable[[], int], sample_weight=None,
    validation_fraction: float | None = None, loading: dict | None = None, dask_data: str = "auto",
) -> FitData:
    """``X, y`` of any accepted kind as a data source, checked once.

    Parameters
    ----------
    X, y
        What ``fit`` got: arrays, tensors, pandas or lists; a dask array or DataFrame with its
        targets; or a map-style torch Dataset of ``(x, y)`` pairs with ``y=None``.
    targets : Targets
        How ``y`` is encoded (:class:`~adadamp.data.targets.Labels` or ``Values``).
    estimator : BaseDaskEstimator
        The estimator being fitted: its fitted features are checked (warm starts) and scikit-learn
        validates in-memory inputs against it.
    fresh : bool
        Whether the fit starts afresh (then the feature attributes are returned to commit).
    client : distributed.Client or None
        The cluster a dask ``X`` lives on, or whose workers read a Dataset.
    seed : callable
        Draws the fit's seed, after the data is checked (it also splits ``validation_fraction``).
    sample_weight : array-like, optional
        One weight per example (a dask array when ``X`` is one; not with a Dataset).
    validation_fraction : float, optional
        The share of in-memory examples held out.
    loading : dict, optional
        How workers read a Dataset (:class:`~adadamp.worker.loading.ExampleLoader`'s ``threads``, ``cache``).
    dask_data : {"auto", "persist", "stream"}
        Whether a dask ``X`` is persisted on the workers or streamed through them
        (:mod:`adadamp.data.streaming`); "auto": streamed when persisting would not fit.

    Returns
    -------
    FitData
    """
    if convert.is_dataset(X):
        made = _dataset_source(X, y, targets, estimator, fresh, client, validation_fraction, loading or {})
        path = "read"
    elif convert.is_dask(X):
        made = _dask_source(X, y, targets, estimator, fresh, client, sample_weight, validation_fraction, dask_data)
        path = "streamed" if isinstance(made[0], StreamedDaskData) else "persisted"
    else:
        return _array_source(X, y, targets, estimator, fresh, seed, sample_weight, validation_fraction)
    source, head, attrs, weighted = made
    return FitData(source, head, attrs, targets.n_outputs(attrs, head[1]), seed(), weighted=weighted, path=path)


def _array_source(X, y, targets, estimator, fresh, seed, sample_weight, validation_fraction) -> FitData:
    """In-memory ``X, y`` validated, encoded and (``validation_fraction``) split."""
    X, y, features = convert.to_arrays(estimator, X, y, reset=fresh, y_numeric=targets.y_numeric)
    sample_weight = check_sample_weight(sample_weight, len(X))
    y, attrs = targets.encode(y)
    attrs.update(features)
    n_outputs = targets.n_outputs(attrs, y)
    seed = seed()
    valid = None
    if validation_fraction:
        split = (X, y) if sample_weight is None else (X, y, sample_weight)
        X, X_valid, y, y_valid, *w = train_test_split(*split, test_size=validation_fraction, random_state=seed)
        sample_weight = w[0] if w else None
        valid = (X_valid, y_valid) if not w else (X_valid, pack(y_valid, w[1]))
    source = ArrayData(X, y if sample_weight is None else pack(y, sample_weight))
    return FitData(source, (X, y), attrs, n_outputs, seed, valid, weighted=sample_weight is not None)


def _no_holdout(validation_fraction, split_with: str) -> None:
    """Data not on the client cannot be split here: say how to hold out a validation set instead."""
    if validation_fraction:
        raise ValueError(f"validation_fraction needs the data on the client; with {split_with} and score it, "
                         "or leave validation_fraction=None.")


def _dask_source(X, y, targets, estimator, fresh, client, sample_weight, validation_fraction, dask_data="auto"):
    """A dask ``X, y`` checked and encoded on the cluster, persisted there or streamed (``dask_data``);
    returns the data source, the first two examples, the target attributes and whether it is weighted."""
    _refuse_dask_call(X, client, validation_fraction)
    start = time.perf_counter()
    X, y, names = convert.dask_arrays(X, y)
    parts = len(X.chunks[0])
    workers = memory.look(client)  # what each worker holds with torch imported
    weights = []
    if sample_weight is not None:
        with contextlib.suppress(ValueError):  # a misaligned one is refused below, with its message
            weights = [convert.aligned(sample_weight, X).astype(np.float64)]
    stream = dask_data == "stream" or (dask_data == "auto" and not memory.fits([X, y, *weights], workers))
    if stream:  # blocks small enough for a worker to hold the windows it needs; no matter how many workers
        window = streaming.window()
        rows = memory.stream_rows([X, y, *weights], workers, window, streaming.WINDOWS_HELD)  # refused here at once
    else:
        X, y = convert.engine_blocks(X, y, n_workers=max(1, len(workers)))
    if len(X.chunks[0]) != parts:
        logger.info("dask data: %d partitions rechunked along axis 0 into %d", parts, len(X.chunks[0]))
    if not fresh:
        convert.check_features(X.shape[1], estimator)
    checks = {"finite": da.isfinite(X).all(), **targets.dask_checks(y)}
    if sample_weight is not None:
        w = _dask_weights(sample_weight, X)
        checks.update(w_finite=da.isfinite(w).all(), w_negative=(w < 0).any(), w_total=w.sum())
    if not stream:  # before any task runs: persisting more than the workers hold stalls the fit for minutes
        memory.check_fits([X, y] if sample_weight is None else [X, y, w], workers)
    with client.as_current():
        (checked,) = dask.compute(checks)  # one pass on the cluster; only these scalars come back
    if stream and rows is not None:  # what the workers hold now that they have read the data once (pyarrow...)
        X, y = _rechunk_to_hold(client, X, y, weights, window)
    logger.info("dask data: %d examples in %d partitions, checked on the cluster in %.2f s",
                X.shape[0], len(X.chunks[0]), time.perf_counter() - start)
    if not checked["finite"]:
        raise ValueError("Input X contains NaN or infinity (checked on the cluster).")
    if sample_weight is not None:
        w = normalized(w, finite=bool(checked["w_finite"]), negative=bool(checked["w_negative"]),
                       total=float(checked["w_total"]))
    y, attrs = targets.encode_dask(y, checked)
    if fresh:
        attrs["n_features_in_"] = X.shape[1]
        if names is not None:
            attrs["feature_names_in_"] = names
    with client.as_current():
        head = dask.compute(X[:2], y[:2])  # two examples, for the module's shape check
        y = y if sample_weight is None else pack(y, w)
        if stream:
            logger.info("dask data: %s in %d blocks does not fit in the workers' memory (or dask_data='stream'): "
                        "streamed, %d blocks per window", format_bytes(memory.row_bytes([X, y]) * X.shape[0]),
                        len(X.chunks[0]), window)
            return StreamedDaskData(client, X, y, window), head, attrs, sample_weight is not None
        X, y = client.persist([X, y])
    return DaskArrayData(client, X, y), head, attrs, sample_weight is not None


def _refuse_dask_call(X, client, validation_fraction) -> None:
    """Refuse, before anything runs on a cluster, a dask ``X`` that cannot train: a frame with
    columns that are not numeric (from its metadata), no client, or a validation set to hold out."""
    if convert.dask_frame_types() and isinstance(X, convert.dask_frame_types()):
        convert.check_numeric_frame(X)
    if client is None:
        raise ValueError(
            "A dask X trains on the cluster it lives on: create a distributed.Client first "
            "(or pass client=...)."
        )
    _no_holdout(validation_fraction, "a dask X hold out a validation set with dask_ml.model_selection.train_test_split")


def _dask_weights(sample_weight, X):
    """``sample_weight`` as a dask array of float64 chunked like ``X``; one weight per example, or ValueError."""
    try:
        w = convert.aligned(sample_weight, X).astype(np.float64)
    except ValueError as err:
        raise ValueError(f"sample_weight: {err} One weight per example of X.") from err
    if w.ndim != 1:
        raise ValueError(f"sample_weight.shape == {w.shape}, expected ({X.shape[0]},): one weight per example.")
    return w


def _rechunk_to_hold(client, X, y, weights: list, window: int):
    """``X, y`` cut into blocks small enough for a worker to hold the ``window`` it streams, by
    what each worker's process held when a streamed fit first sized blocks there (after reading
    the data once: its readers imported): every fit on those workers cuts the same blocks, so
    follows the same order.  By what they hold now, with a warning, where those blocks would
    bring a worker to Dask's pause fraction beside what came since (other fits' data)."""
    collections = [X, y, *weights]
    rows = memory.stream_rows(collections, memory.look(client, first=True), window, streaming.WINDOWS_HELD)
    if rows is None:
        return X, y
    now = memory.look(client)
    if memory.reaches_pause(collections, now, rows, window, streaming.WINDOWS_HELD):
        rows = memory.stream_rows(collections, now, window, streaming.WINDOWS_HELD)
        logger.warning("dask data: the workers hold more than when streamed blocks were first sized there: blocks "
                       "of at most %d rows by what they hold now, so the streamed order differs from earlier fits' "
                       "on these workers", rows)
    if max(X.chunks[0]) > rows:
        pieces = memory.split(X.chunks[0], rows)
        X, y = X.rechunk({0: pieces}), y.rechunk({0: pieces})
    return X, y


def _dataset_source(dataset, y, targets, estimator, fresh, client, validation_fraction, loading):
    """A lazy torch Dataset checked through the workers: the source, two examples read on a
    worker, the target attributes and False (no weights).  The client reads none."""
    convert.check_no_targets(y)
    _no_holdout(validation_fraction, "a torch Dataset hold out a validation set with torch.utils.data.random_split")
    convert.check_samples(len(dataset))
    head_X, head_y = client.submit(read_examples, dataset, 0, 2, pure=False).result()
    if not fresh:
        convert.check_features(head_X.shape[1], estimator)
    _, attrs = targets.encode(targets.dataset_values(client, dataset, head_y))
    encode = targets.example_encoder(attrs)
    if fresh:
        attrs["n_features_in_"] = head_X.shape[1]
    source = DatasetData(dataset, encode=encode, **loading)
    return source, (head_X, np.stack([encode(v) for v in head_y])), attrs, False
