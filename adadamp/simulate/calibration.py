"""Fitting the simulator's compute and overhead terms to a real run (:func:`calibrate`), and
predicting other runs from their schedules alone (:class:`Calibration`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from ..dampers.least_squares import grouped_fit
from .network import Centralized, Network, RingAllReduce
from .timing import predict_time
from .trace import UpdateTrace, from_history


@dataclass(frozen=True)
class Calibration:
    """Fitted timing parameters of an engine (see :func:`calibrate`).

    Parameters
    ----------
    time_per_example : float
        Seconds of gradient computation per example on one worker.
    network : Centralized or RingAllReduce
        The network given to :func:`calibrate` with the fitted
        ``overhead_per_update`` and ``overhead_per_worker``.
    n_params : int, default 0
        Model parameters used for the communication term.
    bytes_per_param : int, default 4
        Bytes per parameter on the wire.
    time_per_epoch : float, default 0
        Seconds per epoch outside the updates.
    time_per_rescale : float, default 0
        Extra seconds each time the worker count changes.
    n_updates : int, default 0
        Updates the fit used.

    Examples
    --------
    >>> cal = Calibration(time_per_example=0.01,
    ...                   network=Centralized(math.inf, overhead_per_update=0.1))
    >>> tr = schedule_updates(n_data=100, epochs=2, initial=50)  # 4 updates
    >>> round(cal.predict(tr), 9)  # 4 * (0.01 * 50 + 0.1)
    2.4
    """

    time_per_example: float
    network: Network
    n_params: int = 0
    bytes_per_param: int = 4
    time_per_epoch: float = 0.0
    time_per_rescale: float = 0.0
    n_updates: int = 0

    def predict(self, trace: UpdateTrace, *, network: Network | None = None) -> float:
        """Predicted seconds of ``trace`` (optionally under another network).

        Parameters
        ----------
        trace : UpdateTrace
            Batch sizes and workers per update, e.g. from
            :func:`schedule_updates` or :func:`from_history`.
        network : Centralized or RingAllReduce, optional
            Replaces the calibrated network (e.g. to ask what a ring
            all-reduce would give with the same compute).

        Returns
        -------
        float
            Seconds the run of ``trace`` takes (on ``network`` when given).

        Examples
        --------
        >>> cal = Calibration(0.01, Centralized(math.inf, overhead_per_update=0.1))
        >>> cal.predict(UpdateTrace([10], [1], [0]), network=RingAllReduce(math.inf))
        0.1
        """
        return predict_time(
            trace.batch_sizes,
            trace.n_workers,
            time_per_example=self.time_per_example,
            n_params=self.n_params,
            network=self.network if network is None else network,
            bytes_per_param=self.bytes_per_param,
            n_epochs=trace.n_epochs,
            time_per_epoch=self.time_per_epoch,
            time_per_rescale=self.time_per_rescale,
        )


def calibrate(
    history: UpdateTrace | Sequence[Mapping[str, Any]] | Any,
    *,
    network: Network | None = None,
    n_params: int = 0,
    bytes_per_param: int = 4,
    method: Literal["mean", "median"] = "mean",
    per_worker: bool | None = None,
) -> Calibration:
    """Fit the compute rate and the network's overheads to a measured run.

    The parameter server's run is fitted with a :class:`Centralized` network (the default), the
    all-reduce backend's with a :class:`RingAllReduce` one (its per-update request and the part of
    the all-reduce the backward pass does not hide become the overheads).

    Steps (``k_i = ceil(B_i / P_i)``; ``c_i``, ``u_i`` = measured compute and
    update seconds):

    1. ``time_per_example``: ``sum(c) / sum(k)`` ("mean": the least-squares
       fit of ``c ~ t k`` with variance proportional to ``k``, which
       reproduces the measured total compute exactly) or ``median(c / k)``
       ("median").
    2. Overhead residual ``r_i = u_i - c_i - comm_i``, where ``comm_i`` is the
       given network's latency and bandwidth term with zero overheads.  Fit
       ``r ~ overhead_per_update + overhead_per_worker * P`` on the updates
       whose worker count did not just change: least squares ("mean", which
       reproduces their total), or least squares on the median residual per
       worker count ("median").  ``overhead_per_worker`` is fitted only when
       at least two worker counts occur (or ``per_worker=True``); otherwise
       it is zero and ``overhead_per_update`` is the mean / median residual.
       Coefficients are kept >= 0.
    3. ``time_per_rescale``: mean (median) excess residual of the updates
       right after a worker-count change (the engine scales the cluster
       inside the update), plus the per-rescale part of the epoch gaps below.
    4. If epoch durations are known: the gap ``epoch_time - sum(u)`` of each
       epoch, fitted as ``time_per_epoch + g * (rescales in that epoch)``.

    With ``method="mean"`` and the same ``network``, the calibrated model
    reproduces the calibration run's own total (up to clipping at zero);
    the useful check is predicting a *different* run.  ``compute_time`` is
    the slowest worker's, so when the engine splits a batch unevenly (shares
    follow data ownership rather than exactly ``ceil(B / P)``) the fitted
    ``time_per_example`` absorbs the average imbalance of the calibration
    run.  Time outside the recorded epochs (cluster start, data placement,
    scoring after ``fit``) is not modelled.

    Parameters
    ----------
    history : UpdateTrace, list of dict, or object with ``history_``
        A measured run (see :func:`from_history` for the keys).
    network : Centralized or RingAllReduce, optional
        Link bandwidth and latency to subtract before fitting the overheads.
        Default: ``Centralized(bandwidth=math.inf)``, i.e. all communication
        is folded into the fitted overheads (right for a single-machine
        LocalCluster, where "transfers" are memory copies).
    n_params : int, default 0
        Model parameters (only matters with a finite bandwidth).
    bytes_per_param : int, default 4
        Bytes per parameter.
    method : {"mean", "median"}, default "mean"
        "mean" preserves totals (what a wall-clock prediction needs);
        "median" ignores stragglers and warm-up updates.
    per_worker : bool, optional
        Force (True) or forbid (False) fitting ``overhead_per_worker``.

    Returns
    -------
    Calibration

    Raises
    ------
    ValueError
        If the history lacks compute or update times, or ``per_worker=True``
        with a single worker count.

    Examples
    --------
    >>> net = Centralized(math.inf, overhead_per_update=0.02, overhead_per_worker=0.005)
    >>> tr = schedule_updates(n_data=1000, epochs=4, initial=100, factor=2, delay=2,
    ...                       grads_per_worker=100)
    >>> comp = 1e-3 * -(-tr.batch_sizes // tr.n_workers)
    >>> wall = comp + net.comm_time(tr.n_workers, 0)
    >>> cal = calibrate(UpdateTrace(tr.batch_sizes, tr.n_workers, tr.epochs, comp, wall))
    >>> round(cal.time_per_example, 9), round(cal.network.overhead_per_update, 9)
    (0.001, 0.02)
    >>> round(cal.network.overhead_per_worker, 9)
    0.005
    """
    if method not in ("mean", "median"):
        raise ValueError(f"method must be 'mean' or 'median'; got {method!r}.")
    trace = history if isinstance(history, UpdateTrace) else from_history(history)
    if trace.compute_times is None or trace.update_times is None:
        raise ValueError("calibrate needs per-update compute and update times.")
    if trace.n_updates == 0:
        raise ValueError("calibrate needs at least one update.")
    base = Centralized(bandwidth=math.inf) if network is None else network
    if not isinstance(base, Centralized | RingAllReduce):
        raise TypeError("calibrate fits a network's overheads; pass a Centralized or RingAllReduce network.")
    bare = replace(base, overhead_per_update=0.0, overhead_per_worker=0.0)

    b, p = trace.batch_sizes, trace.n_workers
    k = (-(-b // p)).astype(np.float64)
    c, u = trace.compute_times, trace.update_times
    if method == "mean":
        tpe = float(c.sum() / k.sum())
    else:
        tpe = float(np.median(c / k))

    resid = u - c - bare.comm_time(p, float(n_params) * float(bytes_per_param))
    rescaled = np.zeros(p.size, dtype=bool)
    rescaled[1:] = p[1:] != p[:-1]
    steady = ~rescaled
    steady_p = p[steady].astype(np.float64)
    n_counts = np.unique(steady_p).size
    if per_worker and n_counts < 2:
        raise ValueError("per_worker=True needs updates at two or more worker counts.")
    fit_pw = n_counts >= 2 if per_worker is None else bool(per_worker)
    design = np.column_stack([np.ones(steady_p.size), steady_p]) if fit_pw else np.ones((steady_p.size, 1))
    coef = grouped_fit(resid[steady], design, method)
    c0 = float(coef[0])
    c1 = float(coef[1]) if fit_pw else 0.0

    center = np.mean if method == "mean" else np.median
    rescale = 0.0
    if rescaled.any():
        excess = resid[rescaled] - (c0 + c1 * p[rescaled])
        rescale = max(float(center(excess)), 0.0)

    per_epoch = 0.0
    if trace.epoch_times is not None and trace.n_epochs:
        n_ep = trace.n_epochs
        in_updates = np.bincount(trace.epochs, weights=u, minlength=n_ep)
        gaps = trace.epoch_times[:n_ep] - in_updates
        rescales = np.bincount(trace.epochs, weights=rescaled.astype(np.float64), minlength=n_ep)
        if np.unique(rescales).size >= 2:
            g = grouped_fit(gaps, np.column_stack([np.ones(n_ep), rescales]), method)
            per_epoch, rescale = float(g[0]), rescale + float(g[1])
        else:  # rescales cannot be told apart from the per-epoch gap
            per_epoch = max(float(center(gaps)), 0.0)

    return Calibration(
        time_per_example=tpe,
        network=replace(base, overhead_per_update=c0, overhead_per_worker=c1),
        n_params=int(n_params),
        bytes_per_param=int(bytes_per_param),
        time_per_epoch=per_epoch,
        time_per_rescale=rescale,
        n_updates=trace.n_updates,
    )
