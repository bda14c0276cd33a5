"""A typed message as one Dask RPC call: the client's side of the workers' handlers.

The handlers (:class:`adadamp.worker.plugin.Trainer`) take a record's fields as keyword arguments
and rebuild it (``Record(**message)``); this makes the ``(address, op, kwargs)`` triple the
engine's ``Transport.call_all`` sends.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from distributed.protocol import to_serialize

from ..records import to_message

__all__ = ["rpc_call"]


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
