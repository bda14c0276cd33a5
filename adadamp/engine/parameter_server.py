"""Where :class:`~adadamp.engine.ParameterServer` was defined; it is :mod:`adadamp.engine.backends.parameter_server`."""

from .backends.parameter_server import ParameterServer

__all__ = ["ParameterServer"]
