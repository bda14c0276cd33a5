"""The ways of training, one per module, behind one interface.

``base``
    what the fit loop and the estimator need from a backend (the abstract :class:`Backend`), and
    what both backends share: set-up, placement, each update's batch and steps, the epoch loop.
``sizing``
    how many workers and shards a fit trains on, and which data blocks each worker holds (a base
    of :class:`Backend`).
``parameter_server``
    one synchronous update at a time: the client holds the weights and steps.
``allreduce``
    decentralized: replicas on the workers all-reduce and step in lockstep
    (:mod:`adadamp.worker.replica` is their side).
``rounds``
    recomputing on the survivors what a lost worker owed a round (both backends).
``plaintext``
    whether an all-reduce fit may run on a cluster whose comm is encrypted (its collectives are not).
``registry``
    the backends by the estimators' ``backend`` names (:func:`register_backend`, :func:`get_backend`).
"""

from .allreduce import AllReduce
from .base import Backend
from .parameter_server import ParameterServer
from .registry import backend_names, get_backend, register_backend

__all__ = ["AllReduce", "Backend", "ParameterServer", "backend_names", "get_backend", "register_backend"]
