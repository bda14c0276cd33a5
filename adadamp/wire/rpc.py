"""A typed message as one Dask RPC call: the client's side of the workers' handlers.

The handlers (:class:`adadamp.worker.plugin.Trainer`) take a record's fields as keyword arguments
and rebuild it (``Record(**message)``); this makes the ``(address, op, kwargs)`` triple the
engine's ``Transport.call_all`` sends.

A handler's expected failure (:data:`EXPECTED`: a lost peer, a fit the worker no longer holds) is
answered, not raised: Dask logs every exception a handler raises at ERROR with a traceback
("Exception while handling op ..."), which reads as a crash for a fault the client recovers from.
:func:`failure_reply` is that answer, and :func:`failure_of` the error it stands for, raised on the
client where the handler's exception used to arrive.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from distributed.protocol import to_serialize

from ..exceptions import CollectiveError, UnknownFitError
from ..records import to_message

__all__ = ["EXPECTED", "failure_of", "failure_reply", "rpc_call"]

#: The errors a handler answers instead of raising: the failures a fit recovers from.
EXPECTED = (CollectiveError, UnknownFitError)
_BY_NAME = {cls.__name__: cls for cls in EXPECTED}
#: The key of a handler's reply that stands for an expected failure (no record has a field so named).
FAILED = "adadamp_failed"


def rpc_call(worker: str, op: str, record, serialized: tuple[str, ...] = ()) -> tuple[str, str, dict]:
    """The RPC ``op`` on ``worker`` with ``record`` (:func:`~adadamp.records.to_message`) as its
    arguments.  Its arrays, those of the records in its fields included, go through Dask's
    serialization (msgpack takes none), as do the fields named in ``serialized`` (lists of
    records, sent pickled); fields that are None stay None.

    Examples
    --------
    >>> from adadamp.records import ReleaseRequest
    >>> rpc_call("tcp://10.0.0.2:4000", "adadamp_release", ReleaseRequest("fit-1"))
    ('tcp://10.0.0.2:4000', 'adadamp_release', {'fit_id': 'fit-1'})
    """
    message = to_message(record)
    _serialize_arrays(record, message)
    for key in serialized:
        value = getattr(record, key)
        if value is not None:
            message[key] = to_serialize(value)
    return worker, op, message


def _serialize_arrays(record, message: dict) -> None:
    """Wrap ``record``'s arrays in ``message`` (its :func:`to_message`), and those of its records."""
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, np.ndarray):
            message[f.name] = to_serialize(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            _serialize_arrays(value, message[f.name])


def failure_reply(err: BaseException) -> dict:
    """A handler's reply for its expected failure ``err`` (one of :data:`EXPECTED`).

    Examples
    --------
    >>> failure_reply(UnknownFitError("fit-1 is not set up on this worker"))
    {'adadamp_failed': 'UnknownFitError', 'message': 'fit-1 is not set up on this worker'}
    """
    message = str(err.args[0]) if len(err.args) == 1 else str(err)  # a KeyError's str() quotes its one argument
    return {FAILED: type(err).__name__, "message": message}


def failure_of(reply) -> BaseException | None:
    """The error a handler's ``reply`` stands for (:func:`failure_reply`), else None.

    Examples
    --------
    >>> failure_of(failure_reply(CollectiveError("rank 1: a peer was lost")))
    CollectiveError('rank 1: a peer was lost')
    >>> failure_of({"released": True}) is None
    True
    """
    if not isinstance(reply, dict) or FAILED not in reply:
        return None
    cls = _BY_NAME.get(reply[FAILED], RuntimeError)
    return cls(f"{reply[FAILED]}: {reply.get('message')}" if cls is RuntimeError else reply.get("message"))
