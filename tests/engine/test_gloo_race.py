"""Gloo's formation race (security issue 50, item 2).

Gloo's listener pairs a connection by the sequence number it sends first (a small integer), so a
local process that connects to a member's new gloo port before the peer does is taken for the
peer: the group forms, and its first collective used to wait for the collective timeout (30 s)
with the member's traffic going to the stranger.  The members now check every pair right after
forming (:meth:`~adadamp.worker.generation.GroupMember._check_pairs`) and form the group again within
``PAIR_CHECK`` seconds.

The racer plays the race for real: it watches ``/proc/net/tcp`` for the workers' new listening
sockets and connects to each at once.  So that it is first every time, the workers look their
first generation's peers up ``DELAY`` seconds late (unwidened, the peer usually wins the race)."""

import logging
import os
import socket
import struct
import sys
import threading
import time

import dask
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.worker.generation import PAIR_CHECK

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the racer reads /proc/net/tcp")

DELAY = 0.5  # seconds the first generation's peer lookups wait: the racer's head start
FITS = 2


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=512, n_features=8, n_informative=6, n_classes=3, random_state=2)
    return X.astype(np.float32), y


def _widen(delay: float) -> None:
    """On a worker: every generation 1's peer lookup (gloo's ``get`` of a peer's address) waits ``delay`` s."""
    from adadamp.worker import rendezvous

    get = rendezvous.SchedulerStore.get

    def late(self, key):
        value = get(self, key)
        if self._keys[1] == "1":
            time.sleep(delay)
        return value

    rendezvous.SchedulerStore.get = late


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes whose first generation's peers connect ``DELAY`` s late; their pids."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
        dask.config.set({"adadamp.allreduce.keep-group": 0}),  # every fit forms its group: a new port to race for
    ):
        client.run(_widen, DELAY)
        yield client, list(client.run(os.getpid).values())


def _fit(client, X, y) -> tuple[float, np.ndarray]:
    params = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 32, "max_epochs": 2,
              "random_state": 0, "scale_cluster": False, "min_workers": 2}
    start = time.perf_counter()
    est = DaskClassifier(client=client, backend="allreduce", **params).fit(X, y)
    weights = torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()
    return time.perf_counter() - start, weights


@pytest.fixture(scope="module")
def calm(data, cluster):
    """The undisturbed fit's seconds (a second fit: the first pays the workers' warm-up) and weights."""
    _fit(cluster[0], *data)
    return _fit(cluster[0], *data)


def _listening() -> dict[str, int]:
    """The host's listening TCP sockets: inode -> port (what any local user can read)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    found[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def _sockets_of(pids: list[int]) -> set[str]:
    """The socket inodes the processes ``pids`` hold (so the racer connects to nothing else on the host)."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    return inodes


class Racer(threading.Thread):
    """Connects to every new listening socket of the workers as soon as it appears, once per
    sequence number a pair of a small group may wait for, and sends ``first(seq)``: what a gloo
    peer sends first, garbage, or nothing.  Keeps the connections and counts what each port sends it."""

    def __init__(self, pids: list[int], first):
        super().__init__(daemon=True)
        self.pids, self.first = pids, first
        self.known = set(_listening())
        self.received: dict[int, int] = {}  # port -> bytes its member sent the racer
        self.sockets: list[tuple[int, socket.socket]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.001):
            new = {inode: port for inode, port in _listening().items() if inode not in self.known}
            self.known.update(new)
            mine = _sockets_of(self.pids) if new else set()
            for port in (port for inode, port in new.items() if inode in mine):
                self.received[port] = 0
                for seq in range(4):
                    with_peer = socket.create_connection(("127.0.0.1", port), timeout=1.0)
                    with_peer.sendall(self.first(seq))
                    with_peer.setblocking(False)
                    self.sockets.append((port, with_peer))
            self.read()

    def read(self) -> None:
        for port, s in self.sockets:
            try:
                while chunk := s.recv(65536):
                    self.received[port] += len(chunk)
            except OSError:  # nothing more now (or closed)
                pass

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()
        self.read()
        for _, s in self.sockets:
            s.close()


def test_a_stranger_taken_for_a_peer_is_found_and_the_group_formed_again_within_seconds(data, cluster, calm, caplog):
    """The racer sends each new port the sequence numbers a peer would: it is taken for the peer of
    the first generation every fit.  The fit ends with the undisturbed fit's weights, each stolen
    formation costs at most ``PAIR_CHECK`` and a little (not the collective timeout: 30 s), and the
    stranger gets one tag per stolen pair (gloo's header and 8 bytes), none of the fit's traffic."""
    client, pids = cluster
    calm_s, calm_weights = calm
    for k in range(FITS):
        with Racer(pids, lambda seq: struct.pack("<Q", seq)) as racer, caplog.at_level(logging.WARNING, "adadamp"):
            seconds, weights = _fit(client, *data)
        stolen = [port for port, n in racer.received.items() if n]
        assert stolen, f"fit {k}: the racer was never taken for a peer ({racer.received})"
        np.testing.assert_array_equal(weights, calm_weights)
        assert seconds - calm_s < len(stolen) * (PAIR_CHECK + 2.0) + 3.0, (
            f"fit {k}: {seconds:.1f} s against {calm_s:.1f} s undisturbed, {len(stolen)} pairs stolen")
        assert max(racer.received.values()) <= 128, racer.received
    assert any("failed while forming" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("first", [lambda seq: b"", lambda seq: os.urandom(64)], ids=["silent", "garbage"])
def test_a_connector_that_sends_no_sequence_number_changes_nothing(data, cluster, calm, caplog, first):
    """A connector that stays silent, or sends garbage for a sequence number, is no peer's: every
    group forms at once, and the fit is the undisturbed one."""
    client, pids = cluster
    calm_s, calm_weights = calm
    with Racer(pids, first) as racer, caplog.at_level(logging.WARNING, "adadamp"):
        seconds, weights = _fit(client, *data)
    assert racer.received, "the racer found no new port"
    np.testing.assert_array_equal(weights, calm_weights)
    assert not [r.getMessage() for r in caplog.records if "fail" in r.getMessage()]
    assert seconds - calm_s < 3.0, f"{seconds:.1f} s against {calm_s:.1f} s undisturbed"
