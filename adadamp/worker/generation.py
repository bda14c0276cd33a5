"""A replica's membership of one generation's all-reduce group: forming it, and leaving it after a
failure (runs on the workers).

A group is one *generation* with its own rendezvous keys in the scheduler
(:class:`~adadamp.worker.rendezvous.SchedulerStore`).  Forming one, the members first take the step
they may still owe, then rank 0 (a member of the last generation, or the client's committed copy)
broadcasts weights, running statistics and optimizer state, so a joiner starts from them (no more
bytes than the model's state can hold: gloo authenticates no peer).  Before that, every pair of a
new gloo group proves itself with a tag keyed by a secret from the rendezvous
(:meth:`GroupMember._check_pairs`): a stranger taken for a peer fails the group within
``PAIR_CHECK`` seconds, and it is formed again.  A group kept from an earlier fit on the same
workers (:mod:`adadamp.worker.groups`) is taken over after a handshake instead.

Every collective of the group is waited for here (:meth:`GroupMember._wait`): a member whose
collective fails says so in the rendezvous (``abort``), and the others give up their own at once
instead of at the collective timeout; the group is then dropped, kept aside (its threads may still
wait on a peer).  What a replica does with the group each update is
:mod:`adadamp.worker.replica`.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import threading
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from distributed.comm import get_address_host

from ..exceptions import CollectiveError
from ..records import GroupReply, StepVector
from . import groups
from .rendezvous import ABORT, SchedulerStore

if TYPE_CHECKING:
    from distributed import Worker


#: Seconds a collective runs before its members start looking for a failed peer every as often.
ABORT_POLL = 0.2
_FAILED_GROUPS: list = []  # groups left after a failure (never destroyed: their threads may still wait)

#: Seconds a new gloo group's members have to prove every pair a member's (:meth:`GroupMember._check_pairs`),
#: instead of the collective timeout: a stranger that took a pair is found this soon and the group is
#: formed again.  The check is one message each way per pair once every pair is connected: 0.4 ms
#: median on two local workers of the idle 2-core machine, 23 ms at most with four busy processes.
PAIR_CHECK = 5.0
#: The store key prefix of the members' per-generation secrets (one per member: ``secret/<rank>``).
SECRET = "secret"

#: The most a replica's state can hold: its weights and running statistics, and per parameter at
#: most this many more copies of them in the optimizer's state (momentum 1, Adam 2, AMSGrad 3)...
STATE_COPIES = 8
#: ... plus this many bytes of ``torch.save`` records per tensor, and 1 MiB.
STATE_RECORD_BYTES = 4096


def collective_backend(device: torch.device | str) -> str:
    """The ``torch.distributed`` backend for replicas on ``device``: NCCL for CUDA, else gloo.

    Examples
    --------
    >>> collective_backend("cpu"), collective_backend("cuda:1")
    ('gloo', 'nccl')
    """
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def gloo_group(store: dist.Store, rank: int, size: int, host: str, timeout: datetime.timedelta):
    """A gloo group whose sockets listen on ``host`` (the worker's Dask address: the interface its
    peers reach it on), or on the interfaces ``GLOO_SOCKET_IFNAME`` names where it is set.

    Gloo's own default is the interface of the machine's host name, whatever the cluster uses;
    binding a device to an address goes through ``_Options``, as torch's own gloo tests do.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, size, options)


class GroupMember:
    """This worker's membership of a fit's all-reduce group: the generation it is in, its rank and
    the group's size, and the group itself (None between a failure and the next generation).

    A base of :class:`~adadamp.worker.replica.Replica`, whose state it broadcasts and whose owed
    step it takes before a group forms: it reads the replica's ``state``, ``buckets``, ``applied``,
    ``pending``, :meth:`dump`, :meth:`load`, :meth:`take_step` and :meth:`take_announced`.
    """

    def __init__(self, *, fit_id: str, worker: Worker | None, timeout: float, device: torch.device):
        self.fit_id = fit_id
        self.worker = worker
        self.timeout = datetime.timedelta(seconds=timeout)
        self.backend = collective_backend(device)
        self.group = None
        self.generation: int | None = None
        self.rank, self.size = 0, 1
        self._prefix: dist.Store | None = None  # the current generation's rendezvous
        self._group_store: dist.Store | None = None  # the store the group was formed with (a kept one's: older)
        self._members: tuple[str, ...] = ()  # the group's workers in rank order
        self._keep = 0.0  # seconds to keep the group after the fit (set by a commit, cleared by an update)

    def join(self, generation: int, rank: int, size: int, step: StepVector | None, restore: bytes | None,
             members: tuple[str, ...] = (), reuse: str | None = None, broadcast: bool = True) -> GroupReply:
        """Form generation ``generation``'s group as ``rank`` of ``size`` and take rank 0's state.

        ``step`` is the step this replica may still owe (taken first, if it was not); ``restore``
        (rank 0 only) is the client's committed state, used when no member of the last
        generation remains.  ``members``: the group's workers in rank order.  ``reuse``: the key
        of a group kept from an earlier fit (:mod:`adadamp.worker.groups`) that every member
        offered: taken instead of forming one.  ``broadcast`` False: every member was set up from
        the same state (the client knows), so rank 0 sends none.
        """
        with self.state.lock:
            return self._join(generation, rank, size, step, restore, tuple(members), reuse, broadcast)

    def _join(self, generation, rank, size, step, restore, members, reuse, broadcast) -> GroupReply:
        start = time.perf_counter()
        self.take_announced()
        self.take_step(step, strict=False)  # a joiner owes nothing: it takes rank 0's state below
        self._keep = 0.0
        held = [self.group, self._group_store]  # the last generation's group: its peers may be gone
        self.group = self._group_store = self.buckets.group = None
        groups.release(held)
        try:
            store = self._prefix = SchedulerStore(self.worker, (self.fit_id, str(generation)),
                                                  self.timeout.total_seconds())
            if reuse is not None:
                kept = groups.take(reuse, members, self.timeout.total_seconds())
                if kept is None or kept.rank != rank:
                    raise RuntimeError(f"the group {reuse} kept from an earlier fit is gone")
                self._group_store = kept.store
                self.group, self.generation, self.rank, self.size = kept.group, generation, rank, size
                self._handshake()
            else:
                groups.drop()  # the members changed: another group forms on this worker
                self._group_store = store
                if self.backend == "nccl":  # untested here (no GPU on the development machine)
                    group = self._abortable(lambda: dist.ProcessGroupNCCL(store, rank, size))
                else:
                    store.set(f"{SECRET}/{rank}", os.urandom(16))  # before its address: peers see both at once
                    host = get_address_host(self.worker.address)
                    group = self._abortable(lambda: gloo_group(store, rank, size, host, self.timeout))
                self.group, self.generation, self.rank, self.size = group, generation, rank, size
                if self.backend == "gloo":
                    self._check_pairs(store)
            self._members = members
            if restore is not None:
                self.load(restore)
            if broadcast or restore is not None:
                self._broadcast_state()
        except RuntimeError as err:
            failure = str(err)
        else:
            return GroupReply(self.applied, time.perf_counter() - start, reused=reuse is not None,
                              broadcast=bool(broadcast or restore is not None))
        self._drop_group(abort=True)  # also when no group was built: the peers still wait in the rendezvous
        raise CollectiveError(f"forming generation {generation} failed on rank {rank}: {failure}")

    def _handshake(self) -> None:
        """Check, over a group kept from an earlier fit, that every member took it for this fit and
        generation (two fits that both found it kept could each have taken it on some members):
        the largest and the smallest of the members' tags must be this member's."""
        digest = hashlib.blake2b(f"{self.fit_id}/{self.generation}".encode(), digest_size=8).digest()
        tag = int.from_bytes(digest, "little") >> 2  # 62 bits: its negation fits too
        both = torch.tensor([tag, -tag], dtype=torch.int64, device=self._comm_device())
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._wait(self.group.allreduce([both], options))
        if both.tolist() != [tag, -tag]:
            raise RuntimeError("the kept group was taken by another fit on some members")

    def _check_pairs(self, store: SchedulerStore) -> None:
        """Check, before anything else is sent over a gloo group just formed, that each pair's peer
        is the member the rendezvous named, within ``PAIR_CHECK`` seconds.

        Gloo's listener takes the first connection that sends a pair's sequence number (a small
        integer) for that pair, so a local process that connects to a member's new port before the
        peer does is taken for it, and the first collective waits for the collective timeout.  Each
        member sends each peer (an all-to-all: one message per pair) a tag keyed by its own secret,
        written to the scheduler-held rendezvous that no stranger reads, and checks the tag each
        peer sent it: a stranger cannot make one, and the tag it receives is worth nothing for
        another pair or generation.
        """
        secrets = store._wait_for([f"{SECRET}/{r}" for r in range(self.size)])  # seen with the peers' addresses
        mine = secrets[f"{SECRET}/{self.rank}"]
        sent = torch.tensor([_pair_tag(mine, p) for p in range(self.size)], dtype=torch.int64)
        received = torch.zeros(self.size, dtype=torch.int64)
        self._wait(self.group.alltoall_base(received, sent, [], []), PAIR_CHECK, "checking its pairs")
        strangers = [p for p in range(self.size)
                     if p != self.rank and received[p].item() != _pair_tag(secrets[f"{SECRET}/{p}"], self.rank)]
        if strangers:
            raise RuntimeError(f"the peers of ranks {strangers} are not the members the rendezvous named")

    def _abortable(self, build):
        """``build()`` the group in a thread of its own, and give it up when the generation is
        aborted (a peer died in the rendezvous: the client or a peer set ``abort``) or the
        collective timeout passed.

        A peer that dies before writing its rendezvous keys is noticed by the store's waits
        (:class:`SchedulerStore` looks for ``abort`` too); one that dies after, while the group's
        sockets connect, only from here.  The abandoned thread ends with its own timeout at the
        latest; a group it still builds is kept aside, never used.
        """
        done, box = threading.Event(), {}

        def run():
            try:
                box["group"] = build()
            except BaseException as err:  # noqa: BLE001 -- handed to the waiting thread
                box["error"] = err
            finally:
                done.set()

        threading.Thread(target=run, name=f"adadamp-rendezvous-{self.fit_id}", daemon=True).start()
        try:
            self._until_done(done, "forming its group")
        except RuntimeError:
            _FAILED_GROUPS.append((box, self._prefix))  # whatever the thread still builds stays aside
            raise
        if "error" in box:
            raise box["error"]
        return box["group"]

    def _broadcast_state(self) -> None:
        """Rank 0's weights, running statistics and optimizer state to every member."""
        device = self._comm_device()
        blob = self.dump() if self.rank == 0 else b""
        length = torch.tensor([len(blob)], dtype=torch.int64, device=device)
        self._wait(self.group.broadcast(length, 0))
        if self.rank == 0:
            data = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
        else:
            n, most = int(length.item()), self.max_state_bytes()
            if not 0 < n <= most:  # checked before allocating: gloo's peers are not authenticated
                raise RuntimeError(f"rank 0 announced {n} bytes of state; this model's state holds at most {most}")
            data = torch.empty(n, dtype=torch.uint8, device=device)
        self._wait(self.group.broadcast(data, 0))
        if self.rank != 0:
            self.load(data.cpu().numpy().tobytes())

    def max_state_bytes(self) -> int:
        """The most bytes :meth:`dump` can write for this model (``STATE_COPIES``)."""
        tensors = [*self.state.module.parameters(), *self.state.buffers]
        weights = sum(t.numel() * t.element_size() for t in tensors)
        return STATE_COPIES * (weights + STATE_RECORD_BYTES * len(tensors)) + 2**20

    def _comm_device(self) -> torch.device:
        return self.state.device if self.backend == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------ every collective, and a failure
    def _wait(self, work, timeout: float | None = None, what: str = "a collective") -> None:
        """Wait for a collective (at most ``timeout`` seconds, the collective timeout by default),
        and give it up when another member's failed.

        A peer that dies is noticed at once only by the members it talks to directly; the others
        would wait for the collective timeout.  So a member whose collective fails says so in the
        generation's store (``abort``), and a member still waiting after ``ABORT_POLL`` looks there
        every ``ABORT_POLL`` seconds.  A normal collective never looks.
        """
        done = threading.Event()
        work.get_future().add_done_callback(lambda _: done.set())
        self._until_done(done, f"generation {self.generation}: {what}", timeout)
        work.wait()  # done: raises the collective's error, if it failed

    def _until_done(self, done: threading.Event, what: str, timeout: float | None = None) -> None:
        """Wait for ``done``, looking every ``ABORT_POLL`` for the generation's ``abort``; raise
        when it is there (a peer failed or was lost) or ``timeout`` (the collective timeout) passed."""
        limit = self.timeout.total_seconds() if timeout is None else min(timeout, self.timeout.total_seconds())
        deadline = time.monotonic() + limit
        while not done.wait(ABORT_POLL):
            if self._prefix.check([ABORT]):
                raise RuntimeError(f"{what}: given up, a peer failed or was lost")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not done within {limit:g} s")

    def _drop_group(self, abort: bool = False) -> None:
        """Leave a group after a failure: tell the other members (``abort`` in the generation's
        store) and keep the group object alive, aside: its threads may still wait on a peer until
        the timeout, and destroying it would wait for them.  ``abort``: say so also when no group
        was formed (a failed rendezvous)."""
        self.buckets.disarm()
        group, self.group, self.pending = self.group, None, None
        if group is not None:  # the stores too: the group's C++ side uses the one it was formed with
            _FAILED_GROUPS.append((group, self._group_store, self._prefix))
        if (group is not None or abort) and self._prefix is not None:
            with contextlib.suppress(Exception):  # the scheduler may be gone
                self._prefix.set(ABORT, b"1")


def _pair_tag(secret: bytes, peer: int) -> int:
    """What a member keyed by ``secret`` sends rank ``peer`` to prove itself (:meth:`GroupMember._check_pairs`)."""
    return int.from_bytes(hashlib.blake2b(str(peer).encode(), key=secret, digest_size=8).digest(), "little", signed=True)
