"""The training engine: what happens between ``fit`` and the workers, one concept per module.

``sampler``
    which examples each update uses: the training clock (:class:`LoopState`) and one seeded
    permutation per data epoch.
``placement``, ``data``
    names kept for :mod:`adadamp.data.placement` (which worker holds which block of examples)
    and :mod:`adadamp.data.sources` (where the blocks come from: the client's arrays, a dask
    array's partitions, or a torch Dataset the workers read); the data layer below the engine
    makes both, and each source says what the workers need.
``membership``
    which workers take part: setting up joiners, leaving out failures, asking the cluster for
    more or fewer workers.
``transport``
    how one round of requests reaches the workers and comes back (the fit's TCP channel,
    shared memory, Dask RPCs).
``aggregation``
    where the workers' gradients are summed (rank order, in place).
``backend``
    what the fit loop needs from a way of training (the :class:`Backend` protocol).
``parameter_server``
    the first backend: one synchronous update at a time, the client steps.
``allreduce``
    the decentralized backend: replicas on the workers all-reduce and step in lockstep
    (:mod:`adadamp.worker.replica` is their side).
``loop``
    the fit loop: epochs, the callbacks' hooks, validation loss, checkpoints.

The batch size, learning-rate factor and momentum of each update come from the damper
(:mod:`adadamp.dampers`); how many workers a batch size calls for from the cluster policy
(:mod:`adadamp.cluster`).  The records passed between these parts are in :mod:`adadamp.records`.
This package talks to Dask and PyTorch; it knows nothing about scikit-learn.
"""

from ..dampers.clock import LoopState, Sampler
from .allreduce import AllReduce
from .backend import Backend
from .parameter_server import ParameterServer

__all__ = ["AllReduce", "Backend", "LoopState", "ParameterServer", "Sampler"]
