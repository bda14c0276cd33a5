"""The per-update data plane: one plain TCP connection per worker and fit.

Dask stays the control plane (membership, set-up, data placement, scaling,
failure detection through the scheduler).  The gradient round itself goes
over a socket the worker opens for the fit and a thread that serves it: the
client writes a fixed-size header plus the example indices (and the weights
when the worker cannot map them from shared memory), the worker thread
computes and answers with a header plus the gradient sum.  An all-reduce member's request
is packed tighter (:func:`pack_update`: the update, the step owed and the batch's place, about
60 bytes plus the step's float64 values), so eight members cost the client under 1 KB per
update both ways.  Neither side's
event loop is involved, so a round costs two socket hops instead of Dask's
message framing and thread hand-offs (about 0.03 ms instead of 1 ms for an
empty round on a 2-core machine; ``benchmarks/README.md``).

The worker hands a per-fit secret key to the client over Dask's own comm
(trusted: docs/guide/security.rst); on the socket each side proves it holds the key
with an HMAC over the other side's random challenge, so neither a local
process that connects first nor one that answers in the worker's place can
take part.  The listener runs the handshakes of all who connect side by side,
each with ``AUTH_TIMEOUT`` to answer, so connections that stay silent cannot
keep the client out; it closes once a peer authenticates, or after
``ACCEPT_TIMEOUT``.  A channel nobody authenticated on costs only itself: the
client then sends that worker's gradients as Dask RPCs, and the fit stays on
the worker.  Every size in a message is checked against what the fit
can need before anything is allocated, and a worker's error travels as
length-capped UTF-8 text: nothing received is unpickled.  Channels are used
for ``tcp://`` workers and for ``tls://`` workers on loopback (the embedded
cluster: no other user can read loopback traffic); other TLS clusters and
transports keep every message on Dask's comm.

This module runs on both sides and imports neither the client side nor
scikit-learn.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

import numpy as np

from ..exceptions import ChannelAuthError, CollectiveError, ShareTooSmallError, WorkerError
from ..records import GradientReply, GradientRequest, ShareRequest

# Request: number of indices (-1 closes), chunks, seed, number of weights sent (0: shared memory),
# the data epoch of the indices, number of examples to load ahead (keys: epoch * n + index),
# number of float64 "step" values (an all-reduce fit's update number and pending step, else 0),
# 1 to have the gradient in the reply even where it would go to shared memory (else 0), number of
# float32 running statistics (BatchNorm buffers) the share starts from (0: keep the worker's),
# number of int64 "plan" values (an all-reduce request: its batches.BatchPlan as a vector), number
# of int64 "parts" values (a request of several shards: (dropout seed, example count) per shard),
# then the loss scale (float64; 1.0 but with precision="16-mixed").
REQUEST = struct.Struct("<qqqqqqqqqqqd")
# An all-reduce request whose numbers fit is packed tighter (the same step and plan vectors, about 60
# bytes instead of 88 plus 8 per value): its first int64 is UPDATE_TAG where a request has its index
# count, then UPDATE: the update, the update whose step to take first, the batch's start (int64);
# the generation, the data epoch, chunks, the batch's length, the ahead size, the number of float64
# values after the header (the step's momentum-buffer scale and settings; 0: none, the scale 1.0),
# the number of layout values after those (the BatchPlan's layout: int32 each, or int64 each when
# the number is negative; 0: the member keeps the last one).
UPDATE_TAG = -2
UPDATE = struct.Struct("<qqqiiiiiii")
_INT32 = np.iinfo(np.int32)
# Reply: status (0 ok, 1 error), n, n_chunks, gradient floats, buffer floats, error bytes,
# loss sum, chunk squared-norm sum, compute seconds, the loss's normalizer (weighted count),
# the squared norm of the all-reduced mean gradient (NaN: not computed; the parameter server's),
# the examples' digest (records.examples_digest), the worker's peak memory since its last reply (bytes).
REPLY = struct.Struct("<qqqqqqdddddQq")
MAX_STEP = 4096  # step values an all-reduce request may carry (two per optimizer param group)
MAX_PLAN = 8 + 65536  # plan values a request may carry (8, then one per shard)
MAX_PARTS = 2 * 65536  # parts values a request may carry (two per shard)
TOKEN_BYTES = 32  # the per-fit key
NONCE_BYTES = 16
MAC = hashlib.sha256
ACCEPT_TIMEOUT = 120.0  # a listener nobody authenticates on is closed after this long (not the fit)
AUTH_TIMEOUT = 5.0  # seconds a connecting peer has to prove it holds the key
MAX_PENDING = 64  # handshakes under way at once; a new connection beyond them replaces the oldest
IDLE_TIMEOUT = 3600.0  # a channel with no request for this long is closed (its fit dropped)
MAX_ERROR_BYTES = 65536
MAX_CHUNKS = 1 << 16


def _mac(key: bytes, role: bytes, *nonces: bytes) -> bytes:
    return hmac.new(key, role + b"".join(nonces), MAC).digest()


def channel_host(address: str) -> str | None:
    """Where a worker at Dask ``address`` may open a channel: the host of a ``tcp://`` address, or
    of a ``tls://`` one on loopback (the embedded cluster), whose traffic no other user can read;
    None for other transports (their messages stay on Dask's comm)."""
    scheme, _, rest = address.partition("://")
    host = rest.rsplit(":", 1)[0].strip("[]")
    if scheme == "tcp" or (scheme == "tls" and is_loopback(host)):
        return host
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a Dask address's host) is this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ``EOFError`` if the peer closes first."""
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise EOFError("the peer closed the channel")
        view = view[n:]


def send_all(sock: socket.socket, parts: list) -> None:
    """Send ``parts`` in order: small messages as one segment, large ones without copying."""
    if sum(len(p) for p in parts) <= 65536:
        sock.sendall(b"".join(parts))
    else:
        for part in parts:
            sock.sendall(part)


def _recv_header(sock: socket.socket, header: struct.Struct) -> tuple:
    buf = bytearray(header.size)
    recv_exactly(sock, memoryview(buf))
    return header.unpack(buf)


def _as_bytes(array: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(array)).cast("B")


# --------------------------------------------------------------------------- worker side
class _Handshake:
    """A connection's progress through the worker's challenge: its answer so far, and until when."""

    def __init__(self, challenge: bytes, deadline: float):
        self.challenge = challenge
        self.deadline = deadline
        self.answer = bytearray(NONCE_BYTES + MAC().digest_size)
        self.got = 0


def _give_up(selector: selectors.BaseSelector, pending: dict, conn: socket.socket, close: bool = True) -> None:
    """Stop watching a connection's handshake (and hang up on it)."""
    del pending[conn]
    with contextlib.suppress(KeyError, ValueError):
        selector.unregister(conn)
    if close:
        conn.close()


class ChannelServer:
    """Serves one fit's gradient requests on a worker, in a thread of its own.

    ``compute(request)`` answers a :class:`~adadamp.records.GradientRequest` with a
    :class:`~adadamp.records.GradientReply`; it runs in this thread, so the worker's event
    loop (heartbeats, Dask RPCs) keeps running while a gradient is computed.
    ``after_reply()`` runs in this thread after each reply went out (an
    all-reduce member's step, while the client reads the round's replies).
    ``on_close()`` runs once when a channel the client sent requests on ends
    (the client closed it or died, it sat idle for ``idle_timeout``): the
    worker then drops the fit.  A channel that was never used (nobody
    authenticated, or the client gave up on it) closes without it: the
    client sends that worker's gradients as Dask RPCs then.  Requests for more
    than ``max_indices`` examples are refused.
    """

    def __init__(
        self,
        host: str,
        compute: Callable[[GradientRequest], GradientReply],
        n_weights: int,
        on_start: Callable[[], None],
        n_buffers: int = 0,
        max_indices: int = 1 << 40,
        on_close: Callable[[], None] | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        after_reply: Callable[[], None] | None = None,
    ):
        self.token = secrets.token_bytes(TOKEN_BYTES)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.bind((host, 0))
        self._listener.listen(8)
        self.port = self._listener.getsockname()[1]
        self._compute = compute
        self._weights = np.empty(n_weights, dtype=np.float32)
        self._buffers = np.empty(n_buffers, dtype=np.float32)
        self._max_indices = max_indices
        self._on_start = on_start
        self._on_close = on_close
        self._after_reply = after_reply
        self._idle_timeout = idle_timeout
        self._conn: socket.socket | None = None
        self._used = False  # a request came in: the client uses this channel
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="adadamp-channel", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        for sock in (self._listener, self._conn):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def _serve(self) -> None:
        try:
            conn = self._accept()
            if conn is None:  # nobody proved the key in time: only the listener closes
                return
            self._on_start()
            conn.settimeout(self._idle_timeout)
            while self._serve_one(conn):
                pass
        except (OSError, EOFError, ValueError):
            pass
        finally:
            self.close()
            if self._used and self._on_close is not None:
                self._on_close()

    def _accept(self) -> socket.socket | None:
        """The first connection that proves it holds the key; others are closed and forgotten.

        All handshakes run at once on one selector, each with ``AUTH_TIMEOUT`` to answer, so a
        silent connection delays nobody; None when no peer proves the key within ``ACCEPT_TIMEOUT``.
        """
        deadline = time.monotonic() + ACCEPT_TIMEOUT
        pending: dict[socket.socket, _Handshake] = {}  # oldest first
        with selectors.DefaultSelector() as selector:
            try:
                self._listener.setblocking(False)
                selector.register(self._listener, selectors.EVENT_READ)
                while not self._closed.is_set():
                    now = time.monotonic()
                    for conn in [c for c, h in pending.items() if h.deadline <= now]:
                        _give_up(selector, pending, conn)
                    if now >= deadline:
                        return None
                    wait = min(deadline, now + 1.0, *(h.deadline for h in pending.values())) - now
                    for key, _ in selector.select(wait):
                        if key.fileobj is self._listener:
                            self._start_handshake(selector, pending)
                        elif key.fileobj in pending and self._handshake(selector, pending, key.fileobj):
                            self._conn = key.fileobj
                            return self._conn
            except OSError:  # the listener was closed, or the client proved its key but could not be answered
                return None
            finally:
                for conn in pending:
                    conn.close()
        return None

    def _start_handshake(self, selector: selectors.BaseSelector, pending: dict) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):  # the peer left the queue meanwhile
            return
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setblocking(False)
            challenge = secrets.token_bytes(NONCE_BYTES)
            if conn.send(challenge) != NONCE_BYTES:  # a fresh socket's buffer takes 16 bytes
                raise ConnectionError("challenge not sent")
            selector.register(conn, selectors.EVENT_READ)
        except OSError:
            conn.close()
            return
        pending[conn] = _Handshake(challenge, time.monotonic() + AUTH_TIMEOUT)
        if len(pending) > MAX_PENDING:
            _give_up(selector, pending, next(iter(pending)))

    def _handshake(self, selector: selectors.BaseSelector, pending: dict, conn: socket.socket) -> bool:
        """Read what ``conn`` sent; True once it proved the key and was answered (it is the client's)."""
        h = pending[conn]
        try:
            n = conn.recv_into(memoryview(h.answer)[h.got :])
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            n = 0
        if n == 0:  # hung up
            _give_up(selector, pending, conn)
            return False
        h.got += n
        if h.got < len(h.answer):
            return False
        _give_up(selector, pending, conn, close=False)
        theirs, mac = bytes(h.answer[:NONCE_BYTES]), bytes(h.answer[NONCE_BYTES:])
        if not hmac.compare_digest(mac, _mac(self.token, b"client", h.challenge, theirs)):
            conn.close()
            return False
        # Close the listener before the client learns it is in: once its Channel() returns,
        # nobody else can connect (closing after the proof left a window for a third party).
        self._listener.close()
        try:
            conn.settimeout(AUTH_TIMEOUT)
            conn.sendall(_mac(self.token, b"worker", theirs, h.challenge))
        except OSError:
            conn.close()
            raise
        return True

    def _serve_one(self, conn: socket.socket) -> bool:
        first = bytearray(8)
        recv_exactly(conn, memoryview(first))
        self._used = True
        (n_idx,) = struct.unpack("<q", first)
        if n_idx == UPDATE_TAG:
            return self._serve_update(conn)
        if n_idx < 0:
            return False
        rest = bytearray(REQUEST.size - 8)
        recv_exactly(conn, memoryview(rest))
        n_idx, n_chunks, seed, n_weights, epoch, n_ahead, n_step, in_reply, n_buffers, n_plan, n_parts, loss_scale = (
            REQUEST.unpack(first + rest)
        )
        if (
            n_idx > self._max_indices
            or not 0 <= n_ahead <= self._max_indices
            or not 0 <= n_chunks <= MAX_CHUNKS
            or n_weights not in (0, self._weights.size)
            or not 0 <= n_step <= MAX_STEP
            or n_buffers not in (0, self._buffers.size)
            or not 0 <= n_plan <= MAX_PLAN
            or not 0 <= n_parts <= MAX_PARTS
            or n_parts % 2
            or not 0.0 < loss_scale < float("inf")
        ):
            raise ValueError(f"malformed request ({n_idx}+{n_ahead} indices, {n_chunks} chunks, {n_weights} weights)")
        indices = np.empty(n_idx + n_ahead, dtype=np.int64)
        recv_exactly(conn, _as_bytes(indices))
        indices, ahead = indices[:n_idx], indices[n_idx:]
        step = None
        if n_step:
            step = np.empty(n_step, dtype=np.float64)
            recv_exactly(conn, _as_bytes(step))
        plan = None
        if n_plan:
            plan = np.empty(n_plan, dtype=np.int64)
            recv_exactly(conn, _as_bytes(plan))
        parts = None
        if n_parts:
            parts = np.empty(n_parts, dtype=np.int64)
            recv_exactly(conn, _as_bytes(parts))
            parts = parts.reshape(-1, 2)
        buffers = None
        if n_buffers:
            recv_exactly(conn, _as_bytes(self._buffers))
            buffers = self._buffers
        weights = None
        if n_weights:
            recv_exactly(conn, _as_bytes(self._weights))
            weights = self._weights
        share = ShareRequest("", seed, indices, epoch, ahead, step, in_reply=bool(in_reply), plan=plan, parts=parts)
        return self._answer(conn, GradientRequest(share, n_chunks, weights, buffers, loss_scale=loss_scale))

    def _serve_update(self, conn: socket.socket) -> bool:
        """An all-reduce request packed by :func:`pack_update`: computed as the step and plan vectors it stands for."""
        update, step_of, start, generation, epoch, n_chunks, length, ahead_size, n_floats, n_layout = (
            _recv_header(conn, UPDATE)
        )
        if (
            not 0 <= length <= self._max_indices
            or not 0 <= ahead_size <= self._max_indices
            or not 0 <= n_chunks <= MAX_CHUNKS
            or not 0 <= n_floats <= MAX_STEP
            or not -MAX_PLAN <= n_layout <= MAX_PLAN
        ):
            raise ValueError(f"malformed all-reduce request ({length} examples, {n_floats} step values, "
                             f"{n_layout} layout values)")
        floats = np.ones(1)  # no step owed: the scale 1.0 and no settings
        if n_floats:
            floats = np.empty(n_floats, dtype=np.float64)
            recv_exactly(conn, _as_bytes(floats))
        layout = np.empty(abs(n_layout), dtype=np.int32 if n_layout > 0 else np.int64)
        recv_exactly(conn, _as_bytes(layout))
        step = np.concatenate([np.array([generation, update, step_of], dtype=np.float64), floats])
        plan = np.concatenate([np.array([start, start + length, ahead_size], dtype=np.int64), layout.astype(np.int64)])
        none = np.zeros(0, dtype=np.int64)
        return self._answer(conn, GradientRequest(ShareRequest("", 0, none, epoch, none, step, plan=plan), n_chunks))

    def _answer(self, conn: socket.socket, request: GradientRequest) -> bool:
        """Compute a request and send the reply (or the error)."""
        try:
            r = self._compute(request)
        except Exception as err:  # noqa: BLE001 -- any error is the client's to raise
            message = f"{type(err).__name__}: {err}".encode(errors="replace")[:MAX_ERROR_BYTES]
            conn.sendall(REPLY.pack(1, 0, 0, 0, 0, len(message), 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0) + message)
            return True
        grad, buffers = r.grad, r.buffers
        header = REPLY.pack(
            0,
            r.n,
            r.n_chunks,
            0 if grad is None else grad.size,
            0 if buffers is None else buffers.size,
            0,
            r.loss_sum,
            r.chunk_sq_norm_sum,
            r.compute_time,
            r.weight,
            r.grad_sq_norm,
            r.digest,
            r.peak_memory,
        )
        send_all(conn, [header] + [_as_bytes(a) for a in (grad, buffers) if a is not None])
        if self._after_reply is not None:
            self._after_reply()
        return True


# --------------------------------------------------------------------------- client side
def pack_update(n_chunks: int, epoch: int, step: np.ndarray, plan: np.ndarray) -> bytes | None:
    """An all-reduce request as ``UPDATE_TAG`` and ``UPDATE`` (``step``: its StepVector, encoded;
    ``plan``: its BatchPlan vector): the integers as int32 where they fit, the step's float64
    values exact; None when a number does not fit (the request then goes as a plain one).

    The server rebuilds the very vectors (:meth:`ChannelServer._serve_update`).

    Examples
    --------
    >>> owed = np.array([3.0, 41.0, 40.0, 1.0, 0.1, 0.9])  # generation, update, step of, scale, lr, momentum
    >>> none = np.array([3.0, 41.0, -1.0, 1.0])  # no step owed
    >>> batch = np.array([96, 160, 64])  # start, stop, ahead size; the layout left out
    >>> len(pack_update(1, 0, owed, batch)), len(pack_update(1, 0, none, batch))
    (84, 60)
    """
    step = np.asarray(step, dtype=np.float64)
    plan = np.asarray(plan, dtype=np.int64)
    if len(step) < 4 or len(plan) < 3:
        return None
    head = step[:3]
    start, stop, ahead_size = plan[:3].tolist()
    small = [epoch, n_chunks, stop - start, ahead_size, *head[:1]]
    if (not np.array_equal(head, np.round(head)) or not np.all(np.abs(head) < 2**62)
            or not all(_INT32.min <= v <= _INT32.max for v in small)):
        return None
    generation, update, step_of = (int(v) for v in head)
    floats = step[3:]
    if len(floats) == 1 and floats[0] == 1.0:  # no step owed (the server puts the scale back)
        floats = floats[:0]
    layout = plan[3:]
    fits = layout.size == 0 or (_INT32.min <= layout.min() and layout.max() <= _INT32.max)
    layout = layout.astype(np.int32) if fits else layout
    header = UPDATE.pack(update, step_of, start, generation, epoch, n_chunks, stop - start, ahead_size, len(floats),
                         layout.size if fits else -layout.size)
    return struct.pack("<q", UPDATE_TAG) + header + floats.tobytes() + layout.tobytes()


#: Errors a worker raises that reach the client with their own type (they name a user's fix).
_RAISED_AS = {cls.__name__: cls for cls in (ShareTooSmallError, CollectiveError)}


class Channel:
    """The client's end of one worker's :class:`ChannelServer`."""

    def __init__(self, host: str, port: int, token: bytes, n_weights: int, timeout: float, n_buffers: int = 0):
        self.sock = socket.create_connection((host, port), timeout=min(timeout, AUTH_TIMEOUT))
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            challenge = bytearray(NONCE_BYTES)
            recv_exactly(self.sock, memoryview(challenge))
            mine = secrets.token_bytes(NONCE_BYTES)
            self.sock.sendall(mine + _mac(token, b"client", bytes(challenge), mine))
            proof = bytearray(MAC().digest_size)
            recv_exactly(self.sock, memoryview(proof))
            if not hmac.compare_digest(bytes(proof), _mac(token, b"worker", mine, bytes(challenge))):
                raise ChannelAuthError(f"{host}:{port} did not prove that it holds the fit's key")
        except EOFError as err:
            self.sock.close()
            raise ChannelAuthError(f"{host}:{port} hung up during the handshake (a wrong key?)") from err
        except BaseException:
            self.sock.close()
            raise
        self.sock.settimeout(timeout)
        self.n_weights, self.n_buffers = n_weights, n_buffers
        self.sent = self.received = 0  # bytes of the requests and replies so far
        self._grad = np.empty(n_weights, dtype=np.float32)

    def send(self, request: GradientRequest) -> None:
        """Ask for the gradient of ``request``'s share (:class:`~adadamp.records.GradientRequest`:
        its weights are sent unless the worker maps them); an all-reduce member's request, its step
        and batch plan with no indices, weights or statistics, goes packed (:func:`pack_update`)."""
        r = request.share
        packed = None
        if r.plan is not None and r.step is not None and not (
                len(r.indices) or request.weights is not None or request.buffers is not None or r.seed or r.in_reply
                or r.parts is not None or (r.ahead is not None and len(r.ahead))):
            packed = pack_update(request.n_chunks, r.epoch, r.step, r.plan)
        if packed is not None:  # an all-reduce request: the numbers only
            send_all(self.sock, [packed])
            self.sent += len(packed)
            return
        weights, buffers = request.weights, request.buffers
        ahead = np.zeros(0, dtype=np.int64) if r.ahead is None else r.ahead
        both = np.concatenate([np.asarray(r.indices, dtype=np.int64), np.asarray(ahead, dtype=np.int64)])
        step = np.zeros(0) if r.step is None else np.asarray(r.step, dtype=np.float64)
        plan = np.zeros(0, dtype=np.int64) if r.plan is None else np.ascontiguousarray(r.plan, dtype=np.int64)
        parts = np.zeros(0, dtype=np.int64) if r.parts is None else np.ascontiguousarray(r.parts, dtype=np.int64).ravel()
        header = REQUEST.pack(
            len(r.indices), request.n_chunks, r.seed, 0 if weights is None else weights.size, r.epoch, len(ahead),
            len(step), int(r.in_reply), 0 if buffers is None else buffers.size, plan.size, parts.size,
            float(request.loss_scale),
        )
        chunks = [header, _as_bytes(both)] + [_as_bytes(a) for a in (step, plan, parts) if a.size]
        chunks += [] if buffers is None else [_as_bytes(np.ascontiguousarray(buffers, dtype=np.float32))]
        chunks += [] if weights is None else [_as_bytes(weights)]
        send_all(self.sock, chunks)
        self.sent += sum(len(c) for c in chunks)

    def receive(self, deadline: float) -> GradientReply:
        """The reply to the last :meth:`send`; ``TimeoutError`` after ``deadline`` (monotonic)."""
        self.sock.settimeout(max(1e-3, deadline - time.monotonic()))
        status, n, n_chunks, n_grad, n_buffers, n_error, loss_sum, sq_sum, compute, weight, grad_sq, digest, peak = (
            _recv_header(self.sock, REPLY)
        )
        if not (0 <= n_error <= MAX_ERROR_BYTES and n_grad in (0, self.n_weights) and 0 <= n_buffers <= self.n_buffers):
            raise ConnectionError(f"malformed reply ({n_grad} gradient, {n_buffers} buffer floats, {n_error} bytes)")
        self.received += REPLY.size + n_error + 4 * (n_grad + n_buffers)
        if status:
            message = bytearray(n_error)
            recv_exactly(self.sock, memoryview(message))
            text = message.decode(errors="replace")
            kind, _, detail = text.partition(": ")  # the server writes "TypeName: message"
            if kind in _RAISED_AS:  # adadamp's own errors keep their type, as over a Dask RPC
                raise _RAISED_AS[kind](detail)
            raise WorkerError(text)
        grad = None
        if n_grad:
            recv_exactly(self.sock, _as_bytes(self._grad))
            grad = self._grad
        buffers = None
        if n_buffers:
            buffers = np.empty(n_buffers, dtype=np.float32)
            recv_exactly(self.sock, _as_bytes(buffers))
        return GradientReply(
            n, loss_sum, sq_sum, n_chunks, compute, grad, buffers, weight=weight, grad_sq_norm=grad_sq, digest=digest,
            peak_memory=peak,
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(REQUEST.pack(-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0))
        with contextlib.suppress(OSError):
            self.sock.close()
