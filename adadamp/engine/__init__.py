"""The training engine: what happens between ``fit`` and the workers, one concept per module.

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
``backends``
    the ways of training behind one interface (the abstract :class:`Backend`): the parameter
    server (one synchronous update at a time, the client steps) and all-reduce (replicas on the
    workers step in lockstep), and the registry of their names.
``loop``
    the fit loop: epochs, the callbacks' hooks, validation loss, checkpoints.

The batch size, learning-rate factor and momentum of each update come from the damper
(:mod:`adadamp.dampers`); how many workers a batch size calls for from the cluster policy
(:mod:`adadamp.cluster`); which examples each update uses, from the training clock
(:class:`LoopState`, :mod:`adadamp.dampers.clock`).  The records passed between these parts are in :mod:`adadamp.records`.
This package talks to Dask and PyTorch; it knows nothing about scikit-learn.
"""

from ..dampers.clock import LoopState, Sampler
from .backends import AllReduce, Backend, ParameterServer

__all__ = ["AllReduce", "Backend", "LoopState", "ParameterServer", "Sampler"]
