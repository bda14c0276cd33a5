"""Training-time simulator: predict wall-clock time from a batch-size schedule.

Growing the batch size cuts the number of model updates; it saves wall-clock
time only if the number of workers grows with the batch and an update costs
about the same at any batch size.  This module turns a per-update record of
``(batch size, workers)`` into a predicted training time under a network
model, so schedules and architectures can be compared without a cluster.

Per-update model (seconds), with ``B`` examples, ``P`` workers and
``M = n_params * bytes_per_param`` bytes of weights (= bytes of gradient)::

    compute      = time_per_example * ceil(B / P)   # workers run in parallel
    centralized  = latency + overhead_per_update
                   + P * (overhead_per_worker + 2 * M / bandwidth)
    ring         = 2 (P - 1) / P * M / bandwidth + 2 (P - 1) * latency
    update time  = compute + communication (centralized or ring)

A run adds ``time_per_epoch`` per epoch and ``time_per_rescale`` each time
the worker count changes (both zero unless calibrated or given).

Sources
-------
- Holt & Sievert, "Training machine learning models faster with Dask"
  (SciPy 2021; ``papers/adadamp-dask-holt-sievert2021.txt``):
  "Experiments" (WRN-16-4, about 2.75 M weights, one T4 GPU per worker,
  Table 1), "Future work / Architecture" (the five parts of a synchronous
  centralized update: broadcast the model, compute, gather gradients,
  overhead, model update) and "Simulations" (Table 2: ``centralized`` vs
  ``decentralized-moderate`` 54 Gb/s / 0.05 us and ``decentralized-high``
  800 Gb/s / 0.025 us).  The paper simulates training "by having the
  computer sleep for an appropriate and realistic amount of time" per
  worker; this module does the same arithmetic in closed form.
- ``notes/algorithms.md`` §5.1-5.2: GeoDamp schedule and the epoch
  accounting that reproduces Table 1 (``ceil(N / B)`` updates per epoch,
  the batch changes only at epoch boundaries).
- ``notes/dask-engine.md`` §2: cost of gathering gradients to the client
  (``P * M / B_c`` each way through the client link) vs a bandwidth-optimal
  all-reduce (``2 (P - 1) / P * M`` per worker).
- ``DESIGN.md`` §2: workers wanted = ``clip(ceil(B / grads_per_worker),
  min_workers, max_workers)``.

Examples
--------
>>> from adadamp.simulate import RingAllReduce, gbit_per_s, predict_time
>>> net = RingAllReduce(bandwidth=gbit_per_s(54), latency=0.05e-6)
>>> t = predict_time([128, 128, 256], [1, 1, 2], time_per_example=1e-3,
...                  n_params=0, network=net)
>>> round(t, 6)
0.384
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .cluster import ClusterPolicy
from .dampers import GeoDamp, simulate_schedule

__all__ = [
    "Calibration",
    "Centralized",
    "Network",
    "RingAllReduce",
    "UpdateTrace",
    "calibrate",
    "from_history",
    "gbit_per_s",
    "predict_time",
    "schedule_updates",
    "update_times",
]


def gbit_per_s(gbits: float) -> float:
    """Convert a link speed in gigabits per second to bytes per second.

    Parameters
    ----------
    gbits : float
        Link speed in Gb/s (10^9 bits per second), as network specs and the
        paper's "Simulations" section state it.

    Returns
    -------
    float
        Bytes per second, the unit every ``bandwidth`` in this module uses.

    Examples
    --------
    >>> gbit_per_s(54)
    6750000000.0
    """
    return float(gbits) * 1e9 / 8.0


def _check_nonneg(value: float, name: str) -> None:
    if not (isinstance(value, (int, float, np.integer, np.floating)) and value >= 0):
        raise ValueError(f"{name} must be a number >= 0; got {value!r}.")


def _check_bandwidth(value: float) -> None:
    if not (isinstance(value, (int, float, np.integer, np.floating)) and value > 0):
        raise ValueError(f"bandwidth must be > 0 bytes/s (math.inf allowed); got {value!r}.")


def _as_counts(x: ArrayLike, name: str) -> NDArray[np.int64]:
    arr = np.asarray(x)
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or 1-D; got shape {arr.shape}.")
    if arr.size and not np.all(np.equal(np.mod(arr, 1), 0)):
        raise ValueError(f"{name} must hold integers; got {arr!r}.")
    out = np.atleast_1d(arr).astype(np.int64)
    if out.size and out.min() < 1:
        raise ValueError(f"{name} must be >= 1 everywhere; got min {out.min()}.")
    return out


@dataclass(frozen=True)
class Centralized:
    """Synchronous centralized parameter server (what adadamp implements).

    Every update the client (the parameter server) sends the weights to each
    of the ``P`` workers and receives one gradient from each, all through its
    own link (point-to-point, ``notes/dask-engine.md`` §2 "Gather to client"
    plus the direct per-worker broadcast), then steps the optimizer.  The
    communication and overhead of one update is::

        latency + overhead_per_update + P * (overhead_per_worker + 2 * M / bandwidth)

    which covers items (1), (3), (4) and (5) of the paper's list of what a
    centralized update costs ("Future work / Architecture"); item (2), the
    gradient computation, is the compute term of :func:`update_times`.

    Parameters
    ----------
    bandwidth : float
        Bytes per second of the client's link (use :func:`gbit_per_s`;
        ``math.inf`` when transfers are folded into the overheads, as on a
        single-machine LocalCluster).
    latency : float, default 0
        Round-trip latency client <-> worker in seconds, paid once per update
        (all workers are contacted concurrently).
    overhead_per_update : float, default 0
        Fixed seconds per update: scheduling, the Dask round trip, the
        optimizer step (paper items 4-5).
    overhead_per_worker : float, default 0
        Seconds per worker per update beyond the bytes on the wire:
        per-task submission, (de)serialization, summing that worker's
        gradient on the client (paper item 4).

    Examples
    --------
    >>> net = Centralized(bandwidth=1e6, latency=0.01, overhead_per_update=0.02,
    ...                   overhead_per_worker=0.001)
    >>> round(float(net.comm_time(4, n_bytes=1000)[0]), 9)  # 0.03 + 4 * (0.001 + 0.002)
    0.042
    """

    bandwidth: float
    latency: float = 0.0
    overhead_per_update: float = 0.0
    overhead_per_worker: float = 0.0

    def __post_init__(self) -> None:
        _check_bandwidth(self.bandwidth)
        _check_nonneg(self.latency, "latency")
        _check_nonneg(self.overhead_per_update, "overhead_per_update")
        _check_nonneg(self.overhead_per_worker, "overhead_per_worker")

    def comm_time(self, n_workers: ArrayLike, n_bytes: float) -> NDArray[np.float64]:
        """Seconds of one update spent outside gradient computation.

        Parameters
        ----------
        n_workers : int or array of int
            Workers ``P`` taking part in each update.
        n_bytes : float
            Bytes of the weights (and of each gradient), ``M``.

        Returns
        -------
        ndarray of float
            One value per entry of ``n_workers``.

        Examples
        --------
        >>> Centralized(bandwidth=100.0).comm_time([1, 2], n_bytes=50).tolist()
        [1.0, 2.0]
        """
        p = _as_counts(n_workers, "n_workers").astype(np.float64)
        per_worker = self.overhead_per_worker + 2.0 * float(n_bytes) / self.bandwidth
        return self.latency + self.overhead_per_update + p * per_worker


@dataclass(frozen=True)
class RingAllReduce:
    """Decentralized synchronous training with a ring all-reduce.

    Every worker holds the model; gradients are summed with the
    bandwidth-optimal ring all-reduce (reduce-scatter then all-gather,
    ``2 (P - 1)`` steps, each moving ``M / P`` bytes per worker), as PyTorch
    distributed does (paper "Future work / Architecture";
    ``notes/dask-engine.md`` §2 "Collective all-reduce").  The paper's
    ``decentralized-*`` networks of Table 2.  Communication per update::

        2 (P - 1) / P * M / bandwidth + 2 (P - 1) * latency

    so a single worker communicates nothing.  There is no broadcast of the
    model and no central overhead (the paper: decentralized communication
    eliminates items 1 and 4 and mitigates 3).

    Parameters
    ----------
    bandwidth : float
        Bytes per second of each inter-worker link.
    latency : float, default 0
        One-way latency of one ring step, in seconds.

    Examples
    --------
    >>> net = RingAllReduce(bandwidth=1e6, latency=1e-3)
    >>> net.comm_time([1, 4], n_bytes=1000).round(6).tolist()  # 4: 1.5e-3 + 6e-3
    [0.0, 0.0075]
    """

    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        _check_bandwidth(self.bandwidth)
        _check_nonneg(self.latency, "latency")

    def comm_time(self, n_workers: ArrayLike, n_bytes: float) -> NDArray[np.float64]:
        """Seconds of one update spent in the all-reduce.

        Parameters
        ----------
        n_workers : int or array of int
            Workers ``P`` in the ring.
        n_bytes : float
            Bytes of the gradient, ``M``.

        Returns
        -------
        ndarray of float
            One value per entry of ``n_workers``.

        Examples
        --------
        >>> RingAllReduce(bandwidth=100.0).comm_time([1, 2], n_bytes=50).tolist()
        [0.0, 0.5]
        """
        p = _as_counts(n_workers, "n_workers").astype(np.float64)
        return 2.0 * (p - 1.0) / p * float(n_bytes) / self.bandwidth + 2.0 * (p - 1.0) * self.latency


Network = Centralized | RingAllReduce
"""Either network model; both expose ``comm_time(n_workers, n_bytes)``.

Examples
--------
>>> isinstance(RingAllReduce(bandwidth=gbit_per_s(800)), Network)
True
"""


def update_times(
    batch_sizes: ArrayLike,
    n_workers: ArrayLike,
    *,
    time_per_example: float,
    n_params: int,
    network: Network,
    bytes_per_param: int = 4,
) -> NDArray[np.float64]:
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


def predict_time(
    batch_sizes: ArrayLike,
    n_workers: ArrayLike,
    *,
    time_per_example: float,
    n_params: int,
    network: Network,
    bytes_per_param: int = 4,
    n_epochs: int | None = None,
    time_per_epoch: float = 0.0,
    time_per_rescale: float = 0.0,
) -> float:
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
    >>> net = Centralized(bandwidth=math.inf, overhead_per_update=0.5)
    >>> predict_time([4, 4, 8], [1, 1, 2], time_per_example=1.0, n_params=0,
    ...              network=net, n_epochs=2, time_per_epoch=10.0,
    ...              time_per_rescale=3.0)
    36.5
    """
    t = update_times(
        batch_sizes,
        n_workers,
        time_per_example=time_per_example,
        n_params=n_params,
        network=network,
        bytes_per_param=bytes_per_param,
    )
    total = float(t.sum())
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


@dataclass(frozen=True, eq=False)
class UpdateTrace:
    """Per-update record of a run (real, from a history, or planned).

    Parameters
    ----------
    batch_sizes : array of int
        Examples in each update.
    n_workers : array of int
        Workers in each update.
    epochs : array of int
        Epoch index (0-based) of each update; non-decreasing.
    compute_times : array of float, optional
        Measured seconds of the slowest worker's gradient computation.
    update_times : array of float, optional
        Measured wall seconds of each whole update.
    epoch_times : array of float, optional
        Measured wall seconds of each epoch (index = epoch).

    Examples
    --------
    >>> tr = UpdateTrace([128, 128, 44], [1, 1, 1], [0, 0, 0])
    >>> tr.n_updates, tr.n_epochs, tr.n_examples
    (3, 1, 300)
    """

    batch_sizes: NDArray[np.int64]
    n_workers: NDArray[np.int64]
    epochs: NDArray[np.int64]
    compute_times: NDArray[np.float64] | None = None
    update_times: NDArray[np.float64] | None = None
    epoch_times: NDArray[np.float64] | None = None

    def __post_init__(self) -> None:
        b = _as_counts(self.batch_sizes, "batch_sizes")
        p = _as_counts(self.n_workers, "n_workers")
        e = np.atleast_1d(np.asarray(self.epochs)).astype(np.int64)
        if not (b.shape == p.shape == e.shape):
            raise ValueError("batch_sizes, n_workers and epochs must have the same length.")
        if e.size and (e.min() < 0 or np.any(np.diff(e) < 0)):
            raise ValueError("epochs must be >= 0 and non-decreasing.")
        object.__setattr__(self, "batch_sizes", b)
        object.__setattr__(self, "n_workers", p)
        object.__setattr__(self, "epochs", e)
        for name in ("compute_times", "update_times"):
            v = getattr(self, name)
            if v is not None:
                v = np.atleast_1d(np.asarray(v, dtype=np.float64))
                if v.shape != b.shape:
                    raise ValueError(f"{name} must have one entry per update.")
                object.__setattr__(self, name, v)
        if self.epoch_times is not None:
            v = np.atleast_1d(np.asarray(self.epoch_times, dtype=np.float64))
            if e.size and v.size < int(e.max()) + 1:
                raise ValueError("epoch_times must have one entry per epoch.")
            object.__setattr__(self, "epoch_times", v)

    @property
    def n_updates(self) -> int:
        """Number of model updates."""
        return int(self.batch_sizes.size)

    @property
    def n_epochs(self) -> int:
        """Number of epochs (``max(epochs) + 1``, or the epoch_times length)."""
        n = int(self.epochs.max()) + 1 if self.epochs.size else 0
        if self.epoch_times is not None:
            n = max(n, int(self.epoch_times.size))
        return n

    @property
    def n_examples(self) -> int:
        """Examples processed over the run."""
        return int(self.batch_sizes.sum())

    @property
    def n_rescales(self) -> int:
        """Updates whose worker count differs from the previous update's."""
        return _n_rescales(self.n_workers)

    @property
    def measured_time(self) -> float:
        """Measured seconds: the epoch times if known, else the update times.

        Raises
        ------
        ValueError
            If the trace holds no timings.
        """
        if self.epoch_times is not None:
            return float(self.epoch_times.sum())
        if self.update_times is not None:
            return float(self.update_times.sum())
        raise ValueError("this trace has no measured times.")


def from_history(
    history: Sequence[Mapping[str, Any]] | Any,
    *,
    compute_key: str = "compute_time",
    time_key: str = "update_time",
    epoch_time_key: str = "dur",
) -> UpdateTrace:
    """Read an estimator's ``history_`` into an :class:`UpdateTrace`.

    Parameters
    ----------
    history : list of dict, or an object with ``history_``
        One dict per epoch, each with an ``"updates"`` list of per-update
        dicts.  Every update needs ``"batch_size"`` (examples actually used)
        and ``"n_workers"``; ``compute_key`` (seconds of the slowest worker's
        gradient) and ``time_key`` (wall seconds of the whole update) are read
        when every update has them.  The epoch of an update is the position
        of its epoch dict in the list.
    compute_key, time_key : str
        Keys of the per-update timings.
    epoch_time_key : str, default "dur"
        Key of an epoch's wall seconds, read when every epoch has it.

    Returns
    -------
    UpdateTrace

    Raises
    ------
    ValueError
        If a required key is missing, or a timing key is present in only
        some of the updates.

    Examples
    --------
    >>> hist = [{"dur": 0.5, "updates": [
    ...     {"batch_size": 64, "n_workers": 2, "compute_time": 0.1, "update_time": 0.2},
    ...     {"batch_size": 36, "n_workers": 2, "compute_time": 0.06, "update_time": 0.15}]}]
    >>> tr = from_history(hist)
    >>> tr.batch_sizes.tolist(), tr.n_workers.tolist(), tr.measured_time
    ([64, 36], [2, 2], 0.5)
    """
    if hasattr(history, "history_"):
        history = history.history_
    b: list[int] = []
    p: list[int] = []
    e: list[int] = []
    comp: list[Any] = []
    wall: list[Any] = []
    durs: list[Any] = []
    for i, ep in enumerate(history):
        if "updates" not in ep:
            raise ValueError(f"epoch {i} of the history has no 'updates' list.")
        durs.append(ep.get(epoch_time_key))
        for j, u in enumerate(ep["updates"]):
            for key in ("batch_size", "n_workers"):
                if key not in u:
                    raise ValueError(f"update {j} of epoch {i} has no {key!r}.")
            b.append(u["batch_size"])
            p.append(u["n_workers"])
            e.append(i)
            comp.append(u.get(compute_key))
            wall.append(u.get(time_key))

    def _all_or_none(values: list[Any], key: str) -> NDArray[np.float64] | None:
        present = [v is not None for v in values]
        if not values or not any(present):
            return None
        if not all(present):
            raise ValueError(f"{key!r} is present in only some entries of the history.")
        return np.asarray(values, dtype=np.float64)

    return UpdateTrace(
        np.asarray(b, dtype=np.int64),
        np.asarray(p, dtype=np.int64),
        np.asarray(e, dtype=np.int64),
        compute_times=_all_or_none(comp, compute_key),
        update_times=_all_or_none(wall, time_key),
        epoch_times=_all_or_none(durs, epoch_time_key),
    )


def schedule_updates(
    *,
    n_data: int,
    epochs: int,
    initial: int,
    factor: float = 5.0,
    delay: int = 60,
    max_batch_size: int | None = None,
    grads_per_worker: int = 128,
    min_workers: int = 1,
    max_workers: int | None = None,
) -> UpdateTrace:
    """Expand a GeoDamp schedule into per-update batch sizes and workers.

    The real :class:`~adadamp.dampers.GeoDamp` is run through the engine's
    epoch loop (:func:`~adadamp.dampers.simulate_schedule`): at epoch ``e``
    the damping is ``D = initial * factor ** (e // delay)`` and the batch
    ``B = min(ceil(D), cap)`` (``notes/algorithms.md`` §5.1; once the cap is
    hit GeoDamp decays the learning rate instead, which does not change the
    timing).  Each epoch runs ``ceil(n_data / B)`` updates, all of ``B``
    examples except the last, which takes the remainder (§5.1 epoch
    accounting; it reproduces the paper's Table 1, e.g. max batch 640:
    ``391 * 60 + 79 * 140 = 34,520``).  Workers per update: the real
    :class:`~adadamp.cluster.ClusterPolicy`, ``clip(ceil(B / grads_per_worker),
    min_workers, max_workers)`` (``DESIGN.md`` §2).

    Parameters
    ----------
    n_data : int
        Training examples (50,000 for CIFAR-10).
    epochs : int
        Epochs to run.
    initial : int
        Batch size at epoch 0.
    factor : float, default 5
        Growth factor of the damping every ``delay`` epochs (1 = constant).
    delay : int, default 60
        Epochs between growths.
    max_batch_size : int, optional
        Cap on the batch size (default: none besides ``n_data``).
    grads_per_worker : int, default 128
        Examples per worker the cluster policy aims for.
    min_workers : int, default 1
        Fewest workers.
    max_workers : int, optional
        Most workers (default: no limit).

    Returns
    -------
    UpdateTrace
        Without timings.

    Examples
    --------
    >>> tr = schedule_updates(n_data=50_000, epochs=200, initial=128,
    ...                       max_batch_size=640)
    >>> tr.n_updates, int(tr.n_workers.max())
    (34520, 5)
    >>> tr.batch_sizes[389:391].tolist()  # end of epoch 0: 390 * 128 + 80
    [128, 80]
    """
    for value, name, low in (
        (n_data, "n_data", 1),
        (epochs, "epochs", 0),
        (initial, "initial", 1),
        (delay, "delay", 1),
        (grads_per_worker, "grads_per_worker", 1),
        (min_workers, "min_workers", 1),
    ):
        if int(value) != value or value < low:
            raise ValueError(f"{name} must be an integer >= {low}; got {value!r}.")
    if not factor >= 1:
        raise ValueError(f"factor must be >= 1; got {factor!r}.")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1; got {max_batch_size!r}.")
    if max_workers is not None and max_workers < min_workers:
        raise ValueError("max_workers must be >= min_workers.")
    damper = GeoDamp(initial=int(initial), delay=int(delay), factor=factor, max_batch_size=max_batch_size)
    policy = ClusterPolicy(
        grads_per_worker=int(grads_per_worker),
        min_workers=int(min_workers),
        max_workers=sys.maxsize if max_workers is None else int(max_workers),
    )
    trace = simulate_schedule(damper, n_data=int(n_data), max_epochs=int(epochs))  # the engine's own loop
    batches = np.array([r["batch_size"] for r in trace], dtype=np.int64)
    workers = np.array([policy.wanted(r["requested"]) for r in trace], dtype=np.int64)
    epochs_of = np.array([math.floor(r["epoch"] + 1e-9) for r in trace], dtype=np.int64)
    return UpdateTrace(batches, workers, epochs_of)


@dataclass(frozen=True)
class Calibration:
    """Fitted timing parameters of an engine (see :func:`calibrate`).

    Parameters
    ----------
    time_per_example : float
        Seconds of gradient computation per example on one worker.
    network : Centralized
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
    network: Centralized
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
            Seconds.

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


def _grouped_fit(y: NDArray[np.float64], x: NDArray[np.float64], method: str) -> NDArray[np.float64]:
    """Fit ``y ~ x @ coef`` (x has an intercept column) with ``coef >= 0``.

    Rows are grouped by identical ``x``; each group is summarised by its mean
    ("mean": identical to ordinary least squares on the raw rows) or median
    ("median": robust to stragglers), then fitted by least squares weighted by
    group size.  A negative coefficient is set to zero and the rest refitted.
    """
    rows, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    center = np.array([(np.mean if method == "mean" else np.median)(y[inverse == g]) for g in range(len(rows))])
    w = np.sqrt(counts.astype(np.float64))
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(rows[:, active] * w[:, None], center * w, rcond=None)
        if np.all(sol >= 0):
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


def calibrate(
    history: UpdateTrace | Sequence[Mapping[str, Any]] | Any,
    *,
    network: Centralized | None = None,
    n_params: int = 0,
    bytes_per_param: int = 4,
    method: Literal["mean", "median"] = "mean",
    per_worker: bool | None = None,
) -> Calibration:
    """Fit the compute rate and the centralized overheads to a measured run.

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
    network : Centralized, optional
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
    if not isinstance(base, Centralized):
        raise TypeError("calibrate fits the centralized overheads; pass a Centralized network.")
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
    coef = _grouped_fit(resid[steady], design, method)
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
            g = _grouped_fit(gaps, np.column_stack([np.ones(n_ep), rescales]), method)
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
