"""The backends by name: the estimator's ``backend`` parameter names one of these.

A new way of training subclasses :class:`~adadamp.engine.backends.base.Backend` and is registered
once under its name; the estimator then accepts that name.
"""

from __future__ import annotations

from .allreduce import AllReduce
from .base import Backend
from .parameter_server import ParameterServer

_BACKENDS: dict[str, type[Backend]] = {}


def register_backend(name: str, cls: type[Backend]) -> None:
    """Make ``cls`` the backend of ``backend=name``.

    Parameters
    ----------
    name : str
        The value of the estimators' ``backend`` parameter that selects ``cls``.
    cls : type
        A subclass of :class:`~adadamp.engine.backends.base.Backend` that implements its hooks
        (listed in the class's Notes: ``module_payload``, ``bind``, ``gradient_round``, ``finite``,
        ``keep_last_finite``, ``grad_sq_norm``, ``step`` and ``sync``; the others optional).

    Examples
    --------
    >>> class Mine(ParameterServer): ...
    >>> register_backend("mine", Mine)
    >>> get_backend("mine") is Mine
    True
    >>> _ = _BACKENDS.pop("mine")
    """
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"a backend must be a subclass of adadamp.engine.backends.Backend; got {cls!r}.")
    _BACKENDS[name] = cls


def backend_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(_BACKENDS)


def get_backend(name: str) -> type[Backend]:
    """The backend class registered as ``name``.

    Raises
    ------
    ValueError
        If no backend is registered under ``name``; the message names the valid values.

    Examples
    --------
    >>> get_backend("allreduce").__name__
    'AllReduce'
    """
    try:
        return _BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"backend must be one of {backend_names()}; got {name!r}. Use 'allreduce' for large "
            "models on many workers, 'parameter-server' (the default) otherwise."
        ) from None


register_backend("parameter-server", ParameterServer)
register_backend("allreduce", AllReduce)
