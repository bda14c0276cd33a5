"""The training engine: what happens between ``fit`` and the workers, one concept per module.

The estimators hand the engine a validated request (the training state, the data source, the
cluster policy); the engine runs it on the cluster.  It talks to Dask and PyTorch and knows nothing
about scikit-learn.

``session``
    where a fit's epochs run: :func:`~adadamp.engine.session.train` opens a backend on the
    cluster, or resumes the one a ``partial_fit`` call kept open
    (:class:`~adadamp.engine.session.KeptBackend`).
``loop``
    the fit loop (:class:`~adadamp.engine.loop.FitLoop`): epochs, the callbacks' hooks, the
    validation loss, checkpoints, the verbose table and the time-left estimate.
``interrupts``
    Ctrl-C and SIGTERM as a request to stop at the end of the running update, and a SLURM job's
    requeue (:func:`~adadamp.engine.interrupts.auto_requeue`).
``membership``
    which workers take part (:class:`~adadamp.engine.membership.Membership`): setting up joiners,
    leaving out failures, workers on standby, what the fit asks the cluster's allocator for.
``transport``
    how one round of requests reaches the workers and comes back (the fit's TCP channel, shared
    memory, Dask RPCs).
``aggregation``
    where the workers' gradient sums are added: in shard order, into the client's buffer.
``speeds``
    how fast each worker computes, measured every update: speed-based shares and stragglers.
``backends``
    the ways of training behind one interface (the abstract :class:`Backend`): ``base`` (the
    interface and the update loop both backends share), ``sizing`` (how many workers and shards,
    and where the data blocks go), ``parameter_server`` (the client holds the weights and steps),
    ``allreduce`` (replicas on the workers step in lockstep), ``rounds`` (recomputing what a lost
    worker owed a round), ``plaintext`` (whether the all-reduce may run on an encrypted cluster) and
    ``registry`` (the backends by name).

The batch size, learning-rate factor and momentum of each update come from the damper
(:mod:`adadamp.dampers`); which examples each update uses, from the training clock
(:class:`LoopState`, :class:`Sampler`: :mod:`adadamp.dampers.clock`); where the data blocks come
from and which worker holds which, from the data layer (:mod:`adadamp.data.sources`,
:mod:`adadamp.data.placement`); how many workers a batch size calls for, from the cluster policy.
The records passed between these parts are in :mod:`adadamp.records`.
"""

from ..dampers.clock import LoopState, Sampler
from .backends import AllReduce, Backend, ParameterServer

__all__ = ["AllReduce", "Backend", "LoopState", "ParameterServer", "Sampler"]
