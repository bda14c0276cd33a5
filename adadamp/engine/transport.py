"""How requests reach the workers and replies come back: one gradient round, RPC fan-out.

``round(requests)`` sends each worker its share of an update (a :class:`ShareRequest`, carried
with the round's weights in a :class:`~adadamp.records.GradientRequest`) and returns the replies
in request order.  Behind it: the fit's own TCP channel
(:mod:`adadamp.wire.channel`) for ``tcp://`` workers, with the weights read from shared memory
(:mod:`adadamp.wire.shm`) by workers on the client's host, else a Dask RPC.  The set-up, data and release calls are Dask RPCs too, sent concurrently by
:meth:`Transport.call_all`.  Lost workers come back as exceptions, never raised here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import selectors
import socket
import time

import dask
import numpy as np
from distributed import Client
from distributed.comm.core import CommClosedError

from ..exceptions import CollectiveError
from ..records import ChannelOffer, GradientReply, GradientRequest, ShareRequest
from ..wire.channel import Channel, WorkerError, channel_host
from ..wire.lost import LOST
from ..wire.rpc import failure_of, rpc_call
from ..wire.shm import SharedBuffers
from .speeds import lost_after

logger = logging.getLogger(__name__)

#: Weights bytes of a round from which the requests are written on a thread of their own while
#: the replies are read: the client's link carries the first workers' gradients in while the last
#: workers' weights still go out, instead of both directions taking turns (a worker's reply waits
#: in socket buffers that hold a few MB while the client writes).  Below it (shared memory, small
#: models) writing is quicker than handing it to a thread.
SEND_AHEAD_BYTES = 1 << 20



def channels_enabled() -> bool:
    """dask config ``adadamp.channels`` (default True); False sends every round as Dask RPCs
    (a cluster whose firewall lets only Dask's own connections through)."""
    return bool(dask.config.get("adadamp.channels", True))


class Transport:
    """The connections of one fit to its workers.

    ``shared`` (or None) holds the weights the workers on this host read in place and the
    gradients they write back; ``timeout`` bounds every round and RPC.
    """

    def __init__(
        self, client: Client, fit_id: str, shared: SharedBuffers | None, timeout: float, n_weights: int, n_buffers: int
    ):
        self.client = client
        self.fit_id = fit_id
        self.shared = shared
        self.timeout = timeout
        self.n_weights = n_weights  # floats in the weights and in a gradient
        self.n_buffers = n_buffers  # floats in the module's running statistics (BatchNorm)
        self.channels: dict[str, Channel] = {}
        self.round_bytes = (0, 0)  # bytes the last round sent and received (see UpdateRecord)
        self._send_thread: concurrent.futures.ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ RPCs
    def call_all(self, calls: list[tuple[str, str, dict]], timeout: float | None = None) -> list:
        """Run ``(address, op, kwargs)`` RPCs concurrently; exceptions are returned."""
        if not calls:
            return []
        if self.client.asynchronous:  # on the client's event loop, or after it stopped (a worker's client
            # at interpreter exit): client.sync would hand back the coroutine unawaited instead of running it
            raise RuntimeError("Transport.call_all needs the Dask client's event loop running in another thread")
        return self.client.sync(self.gather_calls, calls, timeout or self.timeout)

    def call_all_later(self, calls: list[tuple[str, str, dict]]):
        """Start :meth:`call_all` on the client's event loop; returns a concurrent future."""
        return asyncio.run_coroutine_threadsafe(self.gather_calls(calls, self.timeout), self.client.loop.asyncio_loop)

    async def gather_calls(self, calls, timeout):
        async def one(address, op, kwargs):
            try:
                rpc = self.client.rpc(address)
                reply = await asyncio.wait_for(getattr(rpc, op)(**kwargs), timeout)
            except RuntimeError as err:  # the client's connection pool closed under us
                # (not a replica's failed collective, whose gloo message may say "Connection closed by peer")
                if "closed" in str(err) and not isinstance(err, CollectiveError):
                    raise CommClosedError(str(err)) from err
                raise
            if reply is None:  # the worker closed while answering
                raise CommClosedError(f"{address} closed without answering {op}")
            failure = failure_of(reply)  # an expected failure, answered (not logged at ERROR by Dask)
            if failure is not None:
                raise failure
            return reply

        return await asyncio.gather(*(one(*c) for c in calls), return_exceptions=True)

    # ------------------------------------------------------------------ channels
    def connect(self, worker: str, offer: ChannelOffer) -> None:
        """Open the channel a worker offered at set-up (else its rounds go through Dask RPCs)."""
        try:
            self.channels[worker] = Channel(
                channel_host(worker),
                offer.port,
                offer.token,
                self.n_weights,
                timeout=self.timeout,
                n_buffers=self.n_buffers,
            )
        except OSError as err:  # e.g. a firewall between client and worker: Dask RPCs still work
            logger.warning("no direct channel to %s (%r); its gradients go through Dask RPCs", worker, err)

    def forget(self, worker: str) -> None:
        """Release what this fit holds for a worker that left (shared buffers, channel)."""
        if self.shared is not None:
            self.shared.drop(worker)
        channel = self.channels.pop(worker, None)
        if channel is not None:
            channel.close()

    def maps_weights(self, worker: str) -> bool:
        """Whether ``worker`` reads the weights from shared memory (nothing to send)."""
        return self.shared is not None and worker in self.shared.gradients

    # ------------------------------------------------------------------ one round
    def round(
        self, requests: list[ShareRequest], n_chunks: int, weights: np.ndarray | None, on_reply,
        buffers: np.ndarray | None = None, *, patient: set[str] | frozenset = frozenset(),
        expected: float | None = None, on_late=None, loss_scale: float = 1.0,
    ) -> tuple[list, float]:
        """Send every worker its share, then collect the replies as they come in.

        Returns the replies in request order (:class:`GradientReply`, or the exception a worker's
        share ended with) and the seconds spent writing the channel requests (with the weights,
        for workers that do not map them).  Channel requests go out first, so the workers compute
        while any Dask RPCs (workers without a channel) run; with weights of
        :data:`SEND_AHEAD_BYTES` or more they are written on a thread while the replies are read.
        A worker may have several requests (a channel serves them in order).  ``on_reply(request, reply)`` runs for each good reply
        as soon as it is in.  ``buffers``: the running statistics every share starts from
        (float32; None: each worker keeps its own).  ``loss_scale``: what the workers multiply
        the loss by before the backward pass (``precision="16-mixed"``).

        A channel worker that stops answering is given up (a ``TimeoutError`` reply) after
        ``update_timeout``, or sooner when it answered earlier updates (it is not in ``patient``,
        the workers still on their first update: a first pass may compile or warm a device up):
        after :func:`~adadamp.engine.speeds.lost_after` the others' time -- once at least half of
        the round's workers have answered, the latest of their answers; with ``expected`` (the
        all-reduce backend, whose members answer together) that many seconds.  ``on_late(workers)``
        runs once when that bound passes with workers still to answer; they then have
        :func:`lost_after` ``(0)`` more seconds (the all-reduce backend aborts the generation, so
        the members waiting in a collective for a hung peer answer at once).
        """
        replies: list = [None] * len(requests)
        before = self._bytes()
        rpc_sent = rpc_received = 0
        t0 = time.monotonic()
        rpc_calls, rpc_slots, to_send = [], [], []
        for i, r in enumerate(requests):
            payload = None if weights is None or self.maps_weights(r.worker) else weights
            request = GradientRequest(r, n_chunks, payload, buffers, self.fit_id, loss_scale=loss_scale)
            channel = self.channels.get(r.worker)
            if channel is None:
                rpc_sent += request.nbytes()
                rpc_calls.append(rpc_call(r.worker, "adadamp_gradient", request))
                rpc_slots.append(i)
                continue
            to_send.append((i, channel, request))
        failed: dict[int, OSError] = {}

        def send() -> float:
            start = time.perf_counter()
            for i, channel, request in to_send:
                try:
                    channel.send(request)
                except OSError as err:
                    failed[i] = err
                    with contextlib.suppress(OSError):  # its reply is then read as lost at once
                        channel.sock.shutdown(socket.SHUT_RDWR)
            return time.perf_counter() - start

        weights_out = sum(q.weights.nbytes for *_, q in to_send if q.weights is not None)
        sending = self._sender().submit(send) if weights_out >= SEND_AHEAD_BYTES and len(to_send) > 1 else None
        send_time = send() if sending is None else 0.0
        for i, r in zip(rpc_slots, self.call_all(rpc_calls)):
            replies[i] = GradientReply(**r) if isinstance(r, dict) else r
            if isinstance(r, dict):
                rpc_received += sum(np.asarray(r[k]).nbytes for k in ("grad", "buffers") if r[k] is not None)
                on_reply(requests[i], replies[i])
        # every request, while they are still being written (a failed write shuts its socket: read as lost)
        awaited = {i for i, *_ in to_send if sending is not None or i not in failed}
        self._receive(requests, replies, awaited, on_reply, t0, patient, expected, on_late)
        if sending is not None:
            send_time = sending.result()
        for i, err in failed.items():
            replies[i] = err
        after = self._bytes()
        self.round_bytes = (rpc_sent + after[0] - before[0], rpc_received + after[1] - before[1])
        return replies, send_time

    def _sender(self) -> concurrent.futures.ThreadPoolExecutor:
        """The thread that writes a round's requests while this one reads the replies (see :data:`SEND_AHEAD_BYTES`)."""
        if self._send_thread is None:
            self._send_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="adadamp-send")
        return self._send_thread

    def _receive(self, requests, replies, sent, on_reply, t0: float, patient, expected, on_late) -> None:
        """The channel replies of a round (:meth:`round`), as they come in, until each is in or its
        worker is given up."""
        hard = t0 + self.timeout
        queues: dict[str, list[int]] = {}
        for i in sorted(sent):
            queues.setdefault(requests[i].worker, []).append(i)
        n_workers = len({r.worker for r in requests})
        answered, last = n_workers - len(queues), time.monotonic() - t0  # RPC workers are in by now
        late, grace = False, hard
        with selectors.DefaultSelector() as selector:
            for w in queues:
                selector.register(self.channels[w].sock, selectors.EVENT_READ, w)
            while queues:
                if late:
                    bound = grace
                elif expected is not None:
                    bound = t0 + lost_after(expected)
                elif answered and 2 * answered >= n_workers:
                    bound = t0 + lost_after(last)
                else:
                    bound = hard
                give_up = {w: min(hard, bound) if w not in patient else hard for w in queues}
                events = selector.select(max(0.0, min(give_up.values()) - time.monotonic()))
                now = time.monotonic()
                if not events:
                    overdue = [w for w, t in give_up.items() if t <= now]
                    if overdue and on_late is not None and not late and bound < hard:
                        late, grace = True, min(hard, now + lost_after(0.0))
                        on_late(overdue)
                        continue
                    for w in overdue:
                        for i in queues.pop(w):
                            replies[i] = TimeoutError(
                                f"{w} did not answer within {now - t0:.1f} s (the others in {last:.2f} s)"
                            )
                        selector.unregister(self.channels[w].sock)
                    continue
                for key, _ in events:
                    w = key.data
                    i = queues[w].pop(0)
                    try:
                        replies[i] = self.channels[w].receive(hard)
                    except (WorkerError, CollectiveError, *LOST) as err:
                        replies[i] = err
                    if isinstance(replies[i], GradientReply):
                        on_reply(requests[i], replies[i])
                    if not queues[w]:
                        del queues[w]
                        selector.unregister(key.fileobj)
                        answered, last = answered + 1, time.monotonic() - t0

    def _bytes(self) -> tuple[int, int]:
        return sum(c.sent for c in self.channels.values()), sum(c.received for c in self.channels.values())

    def close(self) -> None:
        for w in list(self.channels):
            self.forget(w)
        if self._send_thread is not None:
            self._send_thread.shutdown(wait=False)
            self._send_thread = None
