"""Network cost models of one update's communication: the parameter server's gather/scatter
(:class:`Centralized`) and a ring all-reduce (:class:`RingAllReduce`) (Holt & Sievert 2021,
"Simulations"; docs/guide/backends.rst)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray


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
class _Links:
    """The four numbers both models are made of, checked once (their meaning: each model's
    docstring), and what both do with the two overheads; a model adds its own ``_transfer``."""

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

        The model's transfer time (with its latency) plus ``overhead_per_update + P *
        overhead_per_worker``.

        Parameters
        ----------
        n_workers : int or array of int
            Workers ``P`` taking part in each update.
        n_bytes : float
            Bytes of the weights and of each gradient, ``M``.

        Returns
        -------
        ndarray of float
            One value per entry of ``n_workers``.

        Examples
        --------
        >>> Centralized(bandwidth=100.0).comm_time([1, 2], n_bytes=50).tolist()
        [1.0, 2.0]
        >>> RingAllReduce(bandwidth=100.0).comm_time([1, 2], n_bytes=50).tolist()
        [0.0, 0.5]
        """
        p = _as_counts(n_workers, "n_workers").astype(np.float64)
        return self._transfer(p, float(n_bytes)) + self.overhead_per_update + p * self.overhead_per_worker

    def _transfer(self, p: NDArray[np.float64], n_bytes: float) -> NDArray[np.float64]:
        raise NotImplementedError


@dataclass(frozen=True)
class Centralized(_Links):
    """Synchronous centralized parameter server (what adadamp implements).

    Every update the client (the parameter server) sends the weights to each
    of the ``P`` workers and receives one gradient from each, all through its
    own link (point-to-point: a gather to the client
    plus the direct per-worker broadcast), then steps the optimizer.  The
    communication and overhead of one update is::

        latency + overhead_per_update + P * (overhead_per_worker + 2 * M / bandwidth)

    which covers items (1), (3), (4) and (5) of the paper's list of what a
    centralized update costs ("Future work / Architecture"); item (2), the
    gradient computation, is the compute term of :func:`update_times`.

    The paper's model sends all the weights before the first gradient comes
    back.  adadamp's client reads the first workers' gradients while it still
    writes the last workers' weights; on a full-duplex link the two
    directions then share the time, and only the last worker's gradient
    waits for its weights (``full_duplex=True``)::

        latency + overhead_per_update + P * overhead_per_worker + (P + 1) * M / bandwidth

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
    full_duplex : bool, default False
        Weights out and gradients in at once (what adadamp's engine does);
        the default is the paper's model, which sends before it receives.

    Examples
    --------
    >>> net = Centralized(bandwidth=1e6, latency=0.01, overhead_per_update=0.02,
    ...                   overhead_per_worker=0.001)
    >>> round(float(net.comm_time(4, n_bytes=1000)[0]), 9)  # 0.03 + 4 * (0.001 + 0.002)
    0.042
    >>> duplex = Centralized(bandwidth=1e6, full_duplex=True)
    >>> round(float(duplex.comm_time(4, n_bytes=1000)[0]), 9)  # (4 + 1) * 0.001
    0.005
    """

    full_duplex: bool = False

    def _transfer(self, p: NDArray[np.float64], n_bytes: float) -> NDArray[np.float64]:
        messages = p + 1.0 if self.full_duplex else 2.0 * p
        return self.latency + messages * n_bytes / self.bandwidth


@dataclass(frozen=True)
class RingAllReduce(_Links):
    """Decentralized synchronous training with a ring all-reduce.

    Every worker holds the model; gradients are summed with the
    bandwidth-optimal ring all-reduce (reduce-scatter then all-gather,
    ``2 (P - 1)`` steps, each moving ``M / P`` bytes per worker), as PyTorch
    distributed does (paper "Future work / Architecture").  The paper's
    ``decentralized-*`` networks of Table 2.  Communication per update::

        2 (P - 1) / P * M / bandwidth + 2 (P - 1) * latency

    so a single worker communicates nothing.  There is no broadcast of the
    model and no central overhead in the paper's model (decentralized
    communication eliminates items 1 and 4 and mitigates 3).  A real
    implementation still pays a little per update: adadamp's all-reduce
    backend sends every worker a request and waits for its scalars (the
    plan of the next step), and what the backward pass does not hide of the
    all-reduce; ``overhead_per_update`` and ``overhead_per_worker`` hold that
    (fitted by :func:`~adadamp.simulate.calibrate` to a real run of it)::

        ... + overhead_per_update + P * overhead_per_worker

    Parameters
    ----------
    bandwidth : float
        Bytes per second of each inter-worker link.
    latency : float, default 0
        One-way latency of one ring step, in seconds.
    overhead_per_update : float, default 0
        Fixed seconds per update outside the ring (the client's round trip).
    overhead_per_worker : float, default 0
        Seconds per worker per update beyond the ring's terms.

    Examples
    --------
    >>> net = RingAllReduce(bandwidth=1e6, latency=1e-3)
    >>> net.comm_time([1, 4], n_bytes=1000).round(6).tolist()  # 4: 1.5e-3 + 6e-3
    [0.0, 0.0075]
    """

    def _transfer(self, p: NDArray[np.float64], n_bytes: float) -> NDArray[np.float64]:
        return 2.0 * (p - 1.0) / p * n_bytes / self.bandwidth + 2.0 * (p - 1.0) * self.latency


Network = Centralized | RingAllReduce
"""Either network model; both expose ``comm_time(n_workers, n_bytes)``.

Examples
--------
>>> isinstance(RingAllReduce(bandwidth=gbit_per_s(800)), Network)
True
"""
