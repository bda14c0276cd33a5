"""Where :class:`~adadamp.engine.AllReduce` was defined; it is :mod:`adadamp.engine.backends.allreduce`."""

from .backends.allreduce import ALLOW_PLAINTEXT, AllReduce, check_plaintext, collective_timeout

__all__ = ["ALLOW_PLAINTEXT", "AllReduce", "check_plaintext", "collective_timeout"]
