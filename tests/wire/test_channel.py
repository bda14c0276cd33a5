"""The per-update data plane (adadamp.wire.channel): wire protocol, and the same training on every path."""

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import dask
import numpy as np
import pytest
import torch
from distributed import default_client
from sklearn.datasets import make_classification
from torch import nn

from adadamp import DaskClassifier
from adadamp.callbacks import Callback
from adadamp.records import GradientReply, GradientRequest, ShareRequest
from adadamp.wire.channel import (
    MAX_ERROR_BYTES,
    REQUEST,
    UPDATE,
    UPDATE_TAG,
    Channel,
    ChannelAuthError,
    ChannelServer,
    WorkerError,
    channel_host,
)
from adadamp.worker import plugin as _worker


@pytest.mark.parametrize(
    "address, host",
    [
        ("tcp://127.0.0.1:8786", "127.0.0.1"),
        ("tcp://[::1]:40000", "::1"),
        ("tcp://node-7.cluster:1234", "node-7.cluster"),
        ("tls://127.0.0.1:8786", "127.0.0.1"),  # the embedded cluster: loopback, no other reader
        ("tls://[::1]:8786", "::1"),
        ("tls://localhost:8786", "localhost"),
        ("tls://10.0.0.1:8786", None),
        ("tls://node-7.cluster:8786", None),
        ("inproc://10.0.0.1/123/1", None),
        ("ucx://10.0.0.1:1", None),
    ],
)
def test_channels_open_on_tcp_and_on_loopback_tls(address, host):
    assert channel_host(address) == host


def _server(compute, n_weights=5):
    return ChannelServer("127.0.0.1", compute, n_weights=n_weights, on_start=lambda: None)


def _request(indices, n_chunks=1, seed=0, weights=None, **share) -> GradientRequest:
    """A request for the gradient over ``indices`` (a channel carries no worker or fit id)."""
    return GradientRequest(ShareRequest("", seed, np.asarray(indices), **share), n_chunks, weights)


def test_round_trip_with_and_without_weights():
    seen = []

    def compute(request):
        weights, indices = request.weights, request.share.indices
        seen.append((None if weights is None else weights.copy(), indices.copy(), request.n_chunks, request.share.seed))
        grad = None if weights is None else weights * 2
        return GradientReply(n=len(indices), loss_sum=1.5, chunk_sq_norm_sum=0.25, n_chunks=request.n_chunks,
                             weight=len(indices),
                         compute_time=0.01, grad=grad, buffers=np.arange(3, dtype=np.float32))

    server = _server(compute)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=10, n_buffers=3)
    try:
        w = np.arange(5, dtype=np.float32)
        channel.send(_request([4, 2, 9], n_chunks=2, seed=123, weights=w))
        r = channel.receive(time.monotonic() + 10)
        np.testing.assert_array_equal(r.grad, 2 * w)
        np.testing.assert_array_equal(r.buffers, [0, 1, 2])
        assert (r.n, r.loss_sum, r.chunk_sq_norm_sum, r.n_chunks) == (3, 1.5, 0.25, 2)
        channel.send(_request(np.array([], dtype=np.int64), n_chunks=1, seed=2**62))
        r = channel.receive(time.monotonic() + 10)
        assert r.grad is None and r.n == 0
        np.testing.assert_array_equal(seen[0][0], w)
        np.testing.assert_array_equal(seen[0][1], [4, 2, 9])
        assert seen[0][2:] == (2, 123)
        assert seen[1][0] is None and seen[1][3] == 2**62
    finally:
        channel.close()
        server.close()


def test_an_all_reduce_request_is_packed_tight_and_the_worker_gets_the_same_vectors():
    """The step (float64, bit for bit: the replicas' weights depend on it) and the batch plan arrive
    as the Dask RPC would carry them, in 60 bytes plus 8 per step value owed and 4 per layout value
    (8 where one does not fit int32); numbers too large for the packing go as a plain request."""
    seen = []

    def compute(request):
        r = request.share
        seen.append((request.weights, r.indices.size, r.ahead.size, request.n_chunks, r.seed, r.epoch, r.step.copy(),
                     r.in_reply, request.buffers, r.plan.copy(), r.parts))
        return GradientReply(n=0, loss_sum=0.0, chunk_sq_norm_sum=0.0, n_chunks=request.n_chunks, weight=0.0,
                             compute_time=0.0, grad=None, buffers=None)

    none = np.zeros(0, dtype=np.int64)
    cases = [  # (epoch, step, plan, bytes on the wire)
        (0, [1.0, 0.0, -1.0, 1.0], [0, 64, 64], 60),  # no step owed, the layout kept
        (3, [2.0, 41.0, 40.0, 0.5, 0.1 + 2**-40, float("nan")], [96, 160, 0], 60 + 3 * 8),  # lr, no momentum
        (3, [2.0, 42.0, 41.0, 1.0, 0.1, 0.9, 1e-300, 0.0], [160, 224, 64, 7, 4, 8, 16, 2, 1, 3], 60 + 5 * 8 + 7 * 4),
        (3, [2.0, 43.0, -1.0, 1.0], [224, 256, 64, 2**40, 4, 8, 16, 2, 1], 60 + 6 * 8),  # a seed past int32
        (2**40, [2.0, 44.0, -1.0, 1.0], [0, 32, 0], REQUEST.size + 4 * 8 + 3 * 8),  # an epoch past int32: plain
    ]
    server = _server(compute)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=10)
    try:
        for epoch, step, plan, n_bytes in cases:
            before = channel.sent
            channel.send(_request(none, 2, epoch=epoch, step=np.array(step), plan=np.array(plan, dtype=np.int64)))
            channel.receive(time.monotonic() + 10)
            assert channel.sent - before == n_bytes
            weights, n_idx, n_ahead, n_chunks, seed, got_epoch, got_step, in_reply, buffers, got_plan, parts = seen[-1]
            assert (weights, n_idx, n_ahead, n_chunks, seed, got_epoch, in_reply, buffers, parts) == (
                None, 0, 0, 2, 0, epoch, False, None, None)
            assert got_step.dtype == np.float64 and got_step.tobytes() == np.array(step).tobytes()
            assert got_plan.dtype == np.int64 and got_plan.tolist() == plan
    finally:
        channel.close()
        server.close()


def test_worker_errors_are_raised_on_the_client_and_the_channel_goes_on():
    calls = []

    def compute(request):
        seed = request.share.seed
        calls.append(seed)
        if seed == 1:
            raise KeyError("examples [3] are not resident on this worker")
        return GradientReply(n=1, loss_sum=0.0, chunk_sq_norm_sum=0.0, n_chunks=0, weight=1,
                         compute_time=0.0, grad=None, buffers=None)

    server = _server(compute)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=10)
    try:
        channel.send(_request([3], 1, seed=1))
        with pytest.raises(WorkerError, match="not resident"):
            channel.receive(time.monotonic() + 10)
        channel.send(_request([3], 1, seed=2))
        assert channel.receive(time.monotonic() + 10).n == 1
        assert calls == [1, 2]
    finally:
        channel.close()
        server.close()


def test_a_wrong_key_is_refused_and_the_real_client_still_gets_in():
    """A local process that connects first, without the key, neither computes anything nor
    blocks the client: the listener stays open until a peer authenticates."""
    server = _server(lambda *a: pytest.fail("computed for a stranger"))
    with pytest.raises(ChannelAuthError):  # the worker's proof does not verify under a wrong key
        Channel("127.0.0.1", server.port, b"x" * len(server.token), n_weights=5, timeout=5)
    squatter = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    squatter.recv(16)
    squatter.sendall(b"\0" * 48)  # a nonce and a made-up MAC
    assert squatter.recv(1) == b""  # hung up on
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=5)  # the real client
    channel.close()
    server.close()


def test_the_client_refuses_a_stand_in_for_the_worker():
    """Someone listening where the client expects the worker cannot answer the key's challenge."""
    impostor = socket.socket()
    impostor.bind(("127.0.0.1", 0))
    impostor.listen(1)

    def serve():
        conn, _ = impostor.accept()
        conn.sendall(b"\1" * 16)
        conn.recv(48)
        conn.sendall(b"\2" * 32)  # cannot compute the worker's MAC without the key
        time.sleep(1)
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with pytest.raises(ChannelAuthError, match="did not prove"):
        Channel("127.0.0.1", impostor.getsockname()[1], b"k" * 32, n_weights=5, timeout=5)
    thread.join()
    impostor.close()


def test_sizes_are_checked_before_anything_is_allocated():
    closed = threading.Event()
    server = ChannelServer("127.0.0.1", lambda *a: pytest.fail("computed a malformed request"), n_weights=5,
                           on_start=lambda: None, max_indices=100, on_close=closed.set)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=5)
    channel.sock.sendall(REQUEST.pack(10**12, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0))  # a trillion indices
    with pytest.raises((EOFError, OSError)):
        channel.receive(time.monotonic() + 5)
    assert closed.wait(5)  # the worker dropped the channel (and with it, in a fit, the fit's state)
    channel.close()

    closed.clear()  # a packed all-reduce request for a trillion examples
    server = ChannelServer("127.0.0.1", lambda *a: pytest.fail("computed a malformed request"), n_weights=5,
                           on_start=lambda: None, max_indices=100, on_close=closed.set)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=5)
    channel.sock.sendall(struct.pack("<q", UPDATE_TAG) + UPDATE.pack(1, 0, 0, 1, 0, 1, 10**9, 0, 0, -(10**9)))
    with pytest.raises((EOFError, OSError)):
        channel.receive(time.monotonic() + 5)
    assert closed.wait(5)
    channel.close()

    for scale in (0.0, float("inf"), float("nan")):  # a loss scale no float16 fit sends
        closed.clear()
        server = ChannelServer("127.0.0.1", lambda *a: pytest.fail("computed a malformed request"), n_weights=5,
                               on_start=lambda: None, max_indices=100, on_close=closed.set)
        channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=5)
        channel.sock.sendall(REQUEST.pack(1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, scale))
        with pytest.raises((EOFError, OSError)):
            channel.receive(time.monotonic() + 5)
        assert closed.wait(5)
        channel.close()

    closed.clear()  # running statistics of another size than the fit's: refused before reading them
    server = ChannelServer("127.0.0.1", lambda *a: pytest.fail("computed a malformed request"), n_weights=5,
                           on_start=lambda: None, max_indices=100, on_close=closed.set, n_buffers=4)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=5)
    channel.sock.sendall(REQUEST.pack(1, 1, 0, 0, 0, 0, 0, 0, 10**12, 0, 0, 1.0))
    with pytest.raises((EOFError, OSError)):
        channel.receive(time.monotonic() + 5)
    assert closed.wait(5)
    channel.close()

    def huge_error(*a):
        raise ValueError("x" * 10**6)

    server = _server(huge_error)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=5)
    channel.send(_request([1]))
    with pytest.raises(WorkerError) as err:
        channel.receive(time.monotonic() + 5)
    assert str(err.value).startswith("ValueError: xxx") and len(str(err.value)) <= MAX_ERROR_BYTES
    channel.close()
    server.close()


KILLED_CLIENT = """
import os, signal, sys
import numpy as np
from distributed import Client
from adadamp import DaskClassifier
from adadamp.callbacks import Callback

class Die(Callback):
    def on_update_end(self, estimator, record=None, **info):
        print("training", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(300, 8)).astype(np.float32), rng.integers(0, 3, 300)
    with Client(sys.argv[1]) as client:
        DaskClassifier(max_epochs=5, callbacks=[("die", Die())], client=client).fit(X, y)
"""


def test_a_killed_clients_fit_is_dropped_by_the_workers_and_its_files_swept(client, new_fits, tmp_path):
    """A client SIGKILLed mid-fit releases nothing: the workers drop its model and data as soon as
    its channels close, and the next fit of this user removes its shared-memory directory."""
    script = tmp_path / "client.py"
    script.write_text(KILLED_CLIENT)
    env = {**os.environ, "DASK_ADADAMP__SHM_DIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, str(script), client.scheduler.address], env=env,
                            check=False, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL and "training" in killed.stdout, killed.stderr[-2000:]
    deadline = time.monotonic() + 10
    while new_fits():
        assert time.monotonic() < deadline, "the workers kept the killed client's fit"
        time.sleep(0.1)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("adadamp-")]  # left behind ...
    X, y = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32), np.arange(64) % 2
    with dask.config.set({"adadamp.shm-dir": str(tmp_path), "adadamp.shm-keep-data": 0}):
        DaskClassifier(max_epochs=1).fit(X, y)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("adadamp-")]  # ... and swept


def test_a_silent_worker_times_out():
    def compute(*args):
        time.sleep(1)
        raise ValueError("too late")

    server = _server(compute)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=10)
    try:
        channel.send(_request([1]))
        with pytest.raises(TimeoutError):
            channel.receive(time.monotonic() + 0.2)
    finally:
        channel.close()
        server.close()


def test_nobody_else_can_connect_after_the_client():
    server = _server(lambda *a: None)
    channel = Channel("127.0.0.1", server.port, server.token, n_weights=5, timeout=5)
    try:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2)
    finally:
        channel.close()
        server.close()


# ----------------------------------------------------------------------- in a fit


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=300, n_features=8, n_informative=5, n_classes=3, random_state=1)
    return X, y


def _fit(X, y):
    est = DaskClassifier(module__hidden=(16,), max_epochs=3, batch_size=24, random_state=3, min_workers=2)
    return est.fit(X, y)


def _weights(est):
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()])


def test_every_data_path_trains_the_same_weights(client, data, monkeypatch):
    """Channel + shared memory, channel + weights on the socket, Dask RPC: bitwise the same model."""
    X, y = data
    sends = []
    original_send = Channel.send
    monkeypatch.setattr(Channel, "send", lambda self, r: sends.append(r.weights is None) or original_send(self, r))
    shared = _weights(_fit(X, y))
    assert sends and all(sends)  # every request went over a channel, weights in shared memory

    sends.clear()
    monkeypatch.setitem(dask.config.config, "adadamp", {"shm-dir": None})  # shared memory off
    over_socket = _weights(_fit(X, y))
    assert sends and not any(sends)  # the weights travelled with every request

    sends.clear()
    monkeypatch.setitem(dask.config.config, "adadamp", {"shm-dir": None, "channels": False})
    rpc = _weights(_fit(X, y))
    assert not sends
    assert torch.equal(shared, over_socket)
    assert torch.equal(shared, rpc)


class FailsOnWorkers(nn.Module):
    """Trains on the client's process only: any other process raises."""

    def __init__(self, features: int = 8, pid: int | None = None):
        super().__init__()
        self.pid = os.getpid() if pid is None else pid
        self.linear = nn.Linear(features, 3)

    def forward(self, x):
        if os.getpid() != self.pid:
            raise RuntimeError("forward refused on a worker")
        return self.linear(x)


def test_an_error_in_the_workers_forward_reaches_the_user(client, data):
    X, y = data
    est = DaskClassifier(module=FailsOnWorkers, max_epochs=1, random_state=0)
    with pytest.raises(WorkerError, match="forward refused on a worker"):
        est.fit(X, y)


# ----------------------------------------------------------------------- worker threads

POLICIES: dict[str, list[int]] = {}


def _channel_thread_policies():
    import threading

    return [os.sched_getscheduler(t.native_id) for t in threading.enumerate() if t.name == "adadamp-channel"]


class RecordPolicies(Callback):
    def on_update_end(self, estimator, record=None, **info):
        if "channel" not in POLICIES:
            runs = default_client().run(_channel_thread_policies)
            POLICIES["channel"] = [p for ps in runs.values() for p in ps]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="scheduling policies are Linux-only")
def test_gradient_threads_do_not_preempt_the_client(client, data):
    """Every worker's channel thread computes under SCHED_BATCH (no wake-up preemption of the client)."""
    X, y = data
    POLICIES.clear()
    est = DaskClassifier(
        module__hidden=(16,), max_epochs=1, batch_size=48, random_state=0, callbacks=[("p", RecordPolicies())],
        min_workers=2,  # on both workers
    )
    est.fit(X, y)
    n_workers = len(client.scheduler_info()["workers"])
    # One channel thread per worker at least (a previous fit's may still be winding down).
    assert len(POLICIES["channel"]) >= n_workers and set(POLICIES["channel"]) == {os.SCHED_BATCH}
    assert set(client.run(lambda: _worker.TRAINER.executor.submit(os.sched_getscheduler, 0).result()).values()) == {
        os.SCHED_BATCH
    }
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the client's own thread is left alone


def test_a_round_reads_the_first_replies_while_it_still_writes_the_last_requests():
    """A parameter-server round with large weights (workers without shared memory): worker ``b``
    is busy for a second with its first request, so writing its second (64 MB that its socket
    cannot take) blocks; worker ``a``'s reply is read meanwhile, not after every request is written.
    Writing every request before reading any reply deadlocked here until the channel's timeout:
    ``b`` could not read its second request while its first reply, unread, filled the sockets (a
    worker computing two shards of a round: a lost worker's shard, with large weights)."""
    from adadamp.engine.transport import SEND_AHEAD_BYTES, Transport
    n = 16 << 20  # floats: 64 MB of weights per request, more than a loopback socket buffers (32 + 4 MB here)
    assert 4 * n >= SEND_AHEAD_BYTES

    def compute(request):
        if request.share.seed == 1:  # b's first request: busy while the client writes its second
            time.sleep(1.0)
        n = len(request.share.indices)
        return GradientReply(n=n, loss_sum=0.0, chunk_sq_norm_sum=0.0, n_chunks=request.n_chunks,
                             weight=n, compute_time=0.0, grad=request.weights, buffers=None)

    servers = {w: _server(compute, n_weights=n) for w in ("a", "b")}
    transport = Transport(None, "fit", None, timeout=30.0, n_weights=n, n_buffers=0)
    for w, server in servers.items():
        transport.channels[w] = Channel("127.0.0.1", server.port, server.token, n_weights=n, timeout=30)
    read_at = {}
    try:
        weights = np.ones(n, dtype=np.float32)
        requests = [ShareRequest(w, seed, np.arange(2)) for w, seed in (("a", 0), ("b", 1), ("b", 2))]
        start = time.monotonic()
        replies, send_s = transport.round(requests, 1, weights,
                                          on_reply=lambda q, r: read_at.setdefault(q.seed, time.monotonic()))
    finally:
        transport.close()
        for server in servers.values():
            server.close()
    assert all(isinstance(r, GradientReply) for r in replies), replies
    assert send_s >= 0.5  # writing b's second request waited for b
    assert read_at[0] - start < send_s, (read_at, send_s)  # a's reply was read in the meantime
