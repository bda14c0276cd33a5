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
- Holt & Sievert 2021, "Increasing the batch size": GeoDamp schedule and the epoch
  accounting that reproduces Table 1 (``ceil(N / B)`` updates per epoch,
  the batch changes only at epoch boundaries).
- The Backends guide (docs/guide/backends.rst): cost of gathering gradients to the client
  (``P * M / B_c`` each way through the client link) vs a bandwidth-optimal
  all-reduce (``2 (P - 1) / P * M`` per worker).
- Holt & Sievert 2021, "Architecture": workers wanted = ``clip(ceil(B / grads_per_worker),
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

from . import network as _network
from .calibration import Calibration, calibrate
from .network import Centralized, RingAllReduce, gbit_per_s
from .timing import predict_time, update_times
from .trace import UpdateTrace, from_history, schedule_updates

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

Network = _network.Network
"""Either network model; both expose ``comm_time(n_workers, n_bytes)``.

Examples
--------
>>> isinstance(RingAllReduce(bandwidth=gbit_per_s(800)), Network)
True
"""
