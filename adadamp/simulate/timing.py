"""Predicted seconds per update and per run from batch sizes, workers and a network model."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .network import Network, _as_counts, _check_nonneg


def update_times(batch_sizes: ArrayLike, n_workers: ArrayLike, *, time_per_example: float, n_params: int,
                 network: Network, bytes_per_param: int = 4) -> NDArray[np.float64]:
    """Predicted seconds of each model update.

    ``time_per_example * ceil(B / P) + network.comm_time(P, n_params *
    bytes_per_param)``: the ``P`` workers compute their shares in parallel and
    the update waits for the largest share (``ceil(B / P)`` examples).

    Parameters
    ----------
    batch_sizes : array of int
        Examples ``B`` in each update (the last update of an epoch is
        usually smaller).
    n_workers : int or array of int
        Workers ``P`` in each update (a scalar applies to all).
    time_per_example : float
        Seconds one worker needs for the gradient of one example.
    n_params : int
        Model parameters (2.75 M for the paper's WRN-16-4).
    network : Centralized or RingAllReduce
        Communication model.
    bytes_per_param : int, default 4
        float32 weights and gradients.

    Returns
    -------
    ndarray of float
        Seconds per update, same length as ``batch_sizes``.

    Examples
    --------
    >>> import math
    >>> net = RingAllReduce(bandwidth=math.inf)
    >>> update_times([10, 7], [4, 1], time_per_example=0.1, n_params=0,
    ...              network=net).round(6).tolist()
    [0.3, 0.7]
    """
    b = _as_counts(batch_sizes, "batch_sizes")
    p = _as_counts(n_workers, "n_workers")
    if p.size == 1 and b.size != 1:
        p = np.full(b.shape, p[0])
    if p.shape != b.shape:
        raise ValueError(f"n_workers has {p.size} entries but batch_sizes has {b.size}.")
    _check_nonneg(time_per_example, "time_per_example")
    _check_nonneg(n_params, "n_params")
    _check_nonneg(bytes_per_param, "bytes_per_param")
    per_worker = -(-b // p)  # ceil(B / P) in integers
    compute = float(time_per_example) * per_worker
    return compute + network.comm_time(p, float(n_params) * float(bytes_per_param))


def _n_rescales(p: NDArray[np.int64]) -> int:
    return int(np.count_nonzero(p[1:] != p[:-1])) if p.size > 1 else 0


def predict_time(batch_sizes: ArrayLike, n_workers: ArrayLike, *, time_per_example: float, n_params: int,
                 network: Network, bytes_per_param: int = 4, n_epochs: int | None = None,
                 time_per_epoch: float = 0.0, time_per_rescale: float = 0.0) -> float:
    """Predicted wall-clock seconds of a training run.

    The sum of :func:`update_times`, plus ``time_per_epoch * n_epochs`` and
    ``time_per_rescale`` for every update whose worker count differs from the
    previous update's (starting or retiring workers).

    Parameters
    ----------
    batch_sizes : array of int
        Examples in each update.
    n_workers : int or array of int
        Workers in each update.
    time_per_example : float
        Seconds per example of gradient computation on one worker.
    n_params : int
        Model parameters.
    network : Centralized or RingAllReduce
        Communication model.
    bytes_per_param : int, default 4
        Bytes per parameter on the wire.
    n_epochs : int, optional
        Epochs in the run; required when ``time_per_epoch`` is not zero.
    time_per_epoch : float, default 0
        Seconds per epoch outside the updates (validation, bookkeeping).
    time_per_rescale : float, default 0
        Seconds per change of the worker count.

    Returns
    -------
    float
        Seconds.

    Examples
    --------
    >>> import math
    >>> net = Centralized(bandwidth=math.inf, overhead_per_update=0.5)
    >>> predict_time([4, 4, 8], [1, 1, 2], time_per_example=1.0, n_params=0,
    ...              network=net, n_epochs=2, time_per_epoch=10.0,
    ...              time_per_rescale=3.0)
    36.5
    """
    total = float(update_times(batch_sizes, n_workers, time_per_example=time_per_example, n_params=n_params,
                               network=network, bytes_per_param=bytes_per_param).sum())
    _check_nonneg(time_per_epoch, "time_per_epoch")
    _check_nonneg(time_per_rescale, "time_per_rescale")
    if time_per_epoch:
        if n_epochs is None:
            raise ValueError("time_per_epoch needs n_epochs.")
        total += time_per_epoch * int(n_epochs)
    if time_per_rescale:
        p = _as_counts(n_workers, "n_workers")
        total += time_per_rescale * _n_rescales(p)
    return total
