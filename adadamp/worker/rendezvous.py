"""One generation's rendezvous, held in the Dask scheduler (runs on the workers).

An all-reduce group is formed per membership *generation* with its own rendezvous keys (the
pattern of torchft's Manager).  This module is where those keys live and how they are waited for:
the ``torch.distributed`` store the members (and gloo, while it forms the group) read and write,
and the ``abort`` key by which a generation is given up.  The store is the only part of a group
that talks to the scheduler; forming the group on it is :mod:`adadamp.worker.generation`.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING

import torch.distributed as dist
from distributed.utils import sync

if TYPE_CHECKING:
    from distributed import Worker


#: The store key that marks a generation given up (by a member whose collective failed, or by the
#: client when a member is lost while the group forms).
ABORT = "abort"
#: The longest pause between two looks at the rendezvous for a peer's keys.  Members reach the
#: rendezvous up to tens of milliseconds apart (a busy core); looks double from 1 ms up to this, so
#: a peer's keys are seen at most this late.  Each look is one small scheduler call.
RENDEZVOUS_POLL = 0.01


class SchedulerStore(dist.Store):
    """One generation's rendezvous: ``torch.distributed`` store keys in the Dask scheduler's metadata
    (``set_metadata``: "small amounts of data ... for administrative purposes"), reached over the
    worker's own connection to the scheduler.

    So nothing listens for it: only who can talk to the scheduler (whom Dask trusts with running
    code on the workers anyway) can read a member's address, plant a key or join the group, and on
    a TLS cluster the rendezvous is encrypted with the rest of Dask's comm.  Gloo calls ``set``,
    ``get`` and ``wait`` while it forms the group (from the thread that builds it, never the
    worker's event loop); the members use ``set`` and ``check`` for ``abort``.  A wait polls: a
    generation's keys are a few hundred bytes per member, written once.
    """

    def __init__(self, worker: Worker, keys: tuple[str, ...], timeout: float):
        super().__init__()
        self._worker, self._keys, self._timeout = worker, list(keys), timeout
        self._seen: dict = {}  # the entries read so far: a generation's keys are written once

    def _call(self, op: str, **kwargs):
        try:
            return sync(self._worker.loop, getattr(self._worker.scheduler, op), callback_timeout=self._timeout,
                        **kwargs)
        except OSError as err:  # the scheduler is gone (or slow): as a store that stopped answering
            raise dist.DistStoreError(f"rendezvous {'/'.join(self._keys)}: {op} failed: {err!r}") from err

    def _entries(self) -> dict:
        entries = self._call("get_metadata", keys=self._keys, default=None) or {}
        self._seen.update(entries)
        return entries

    def set(self, key: str, value) -> None:
        self._call("set_metadata", keys=[*self._keys, key], value=bytes(value))

    def check(self, keys: list[str]) -> bool:
        entries = self._entries()
        return all(k in entries for k in keys)

    def get(self, key: str) -> bytes:
        return self._wait_for([key])[key]

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._wait_for(keys, None if timeout is None else timeout.total_seconds())

    def _wait_for(self, keys: list[str], timeout: float | None = None) -> dict:
        if all(k in self._seen for k in keys):  # gloo asks for each peer's address in turn: one look for all
            return self._seen
        start = time.monotonic()
        deadline = start + (self._timeout if timeout is None else timeout)
        delay = 0.001
        while True:
            entries = self._entries()
            if all(k in entries for k in keys):
                return entries
            if ABORT in entries:  # a member (or the client) gave this generation up: so does its rendezvous
                raise dist.DistStoreError(f"rendezvous {'/'.join(self._keys)}: aborted while waiting for {keys}")
            if time.monotonic() > deadline:
                missing = [k for k in keys if k not in entries]
                raise dist.DistStoreError(f"rendezvous {'/'.join(self._keys)}: no {missing} in {deadline - start:.0f} s")
            time.sleep(delay)
            delay = min(2 * delay, RENDEZVOUS_POLL)
