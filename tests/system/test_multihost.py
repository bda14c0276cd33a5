"""Training across emulated hosts (issue 29, item 2): every worker on a host of its own.

The hosts are network namespaces of :mod:`netbed` (each with its own /dev/shm), the scheduler on
host 0, one worker on each other host, the client in this process on the bed's client link.  Both
backends must train what they train on one host, with no shared memory used; on TLS nothing may
carry weights or gradients outside Dask's encrypted comm; a host lost, a link cut and a host
joining mid-fit must be handled like a killed or added worker."""

import socket
import struct
import sys
import threading
import time

import cloudpickle
import dask
import numpy as np
import pytest
import torch
from conftest import back_to_two
from distributed import Client, Security
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.dampers import Constant
from adadamp.engine.membership import MEMBERSHIP_INTERVAL

pytestmark = pytest.mark.netbed
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the hosts' workers cannot import tests/

PS, AR = "parameter-server", "allreduce"
#: max |w - w_one_host|: the parameter server is bit for bit (every shard's gradient is computed
#: alike wherever it runs); the all-reduce backend up to float summation order (tests/system/stress).
TOLERANCE = {PS: 0.0, AR: 1e-5}
WORKER_HOSTS = 2
#: the scheduler notices a worker whose link is cut within seconds (Dask's default is 5 minutes)
SCHEDULER_ENV = {"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "6s"}


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=512, n_features=8, n_informative=6, n_classes=3, random_state=2)
    return X.astype(np.float32), y


def _params(backend, **kw) -> dict:
    return {"backend": backend, "optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 32,
            "max_epochs": 2, "random_state": 0, "scale_cluster": False,
            "grads_per_worker": 1, **kw}  # the batch on every worker (host) there is


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _workers_per_update(est) -> list[int]:
    return [u["n_workers"] for row in est.history_ for u in row["updates"]]


def _stats() -> dict:
    from adadamp.worker import plugin

    return dict(plugin.TRAINER.stats)


def _outside_dask(flows: set, bed) -> set:
    """The flows of which neither end is Dask's comm (the scheduler or a worker's address)."""
    ends = {(h, int(p)) for h, p in (a.split("://")[1].rsplit(":", 1)
                                     for a in [bed.address, *bed.client.scheduler_info()["workers"]])}
    return {f for f in flows if (f[0], f[1]) not in ends and (f[2], f[3]) not in ends}


def _stats_delta(client, before: dict) -> dict:
    """What the workers' set-ups used since ``before`` (all workers' counters summed)."""
    total: dict = {}
    for address, counts in client.run(_stats).items():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v - before.get(address, {}).get(k, 0)
    return total


class Bed:
    """A started test bed with a scheduler and a worker per host, and its client."""

    def __init__(self, tls: bool = False):
        import netbed

        self.net = netbed.Netbed(hosts=1 + WORKER_HOSTS).start()
        try:
            self.security = Security.temporary() if tls else None
            self.tls = self.net.tls_files(self.security) if tls else None
            self.address = self.net.start_scheduler(self.net.hosts[0], tls=self.tls, env=SCHEDULER_ENV)
            for host in self.net.hosts[1:]:
                self.net.start_worker(host, self.address, tls=self.tls)
            self.client = Client(self.address, security=self.security, set_as_default=False, timeout=60)
            self.client.wait_for_workers(WORKER_HOSTS, timeout=120)
        except BaseException:
            self.net.stop()
            raise

    def add_worker_host(self):
        host = self.net.add_host()
        self.net.start_worker(host, self.address, tls=self.tls)
        return host

    def remove_host(self, host) -> None:
        """Remove a host, and wait until the scheduler has dropped its worker (a cut host's only
        after the worker TTL): until then a fit would count it and broadcast to it."""
        self.net.remove_host(host)
        prefix = f"{self.address.split('://')[0]}://{host.address}:"
        self._wait(lambda workers: not any(w.startswith(prefix) for w in workers), f"{prefix}* still listed")

    def restore(self, lost) -> None:
        """Replace a lost host by a fresh one: wait until the lost host's worker is gone and the
        fresh one's has registered (counting workers alone would take the lost one for it)."""
        self.remove_host(lost)
        self.add_worker_host()
        self._wait(lambda workers: len(workers) == WORKER_HOSTS, f"not {WORKER_HOSTS} workers")

    def _wait(self, done, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done(workers := set(self.client.scheduler_info(n_workers=-1)["workers"])):
            assert time.monotonic() < deadline, f"{what}: {sorted(workers)}"
            time.sleep(0.2)

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.net.stop()


@pytest.fixture(scope="module")
def bed(netbed_ready):
    b = Bed()
    yield b
    b.close()


@pytest.fixture(scope="module")
def one_host(session_client, data):
    """Each backend's weights on one host (the session's LocalCluster of two workers), and what its
    workers' set-ups used: shared memory there, so that 'none on the bed' means something."""
    back_to_two(session_client)
    results = {}
    for backend in (PS, AR):
        before = session_client.run(_stats)
        est = DaskClassifier(client=session_client, **_params(backend)).fit(*data)
        results[backend] = (_weights(est), _stats_delta(session_client, before))
    return results


@pytest.fixture(scope="module")
def undisturbed(bed, data):
    """Each backend's fit on the bed, nothing disturbed: the estimator, the workers' counters and the
    TCP flows on the links outside Dask's comm."""
    results = {}
    for backend in (PS, AR):
        before = bed.client.run(_stats)
        sniffer = Sniffer(bed.net)
        try:
            est = DaskClassifier(client=bed.client, **_params(backend)).fit(*data)
        finally:
            flows = sniffer.stop()
        results[backend] = (est, _stats_delta(bed.client, before), _outside_dask(flows, bed))
    return results


@pytest.mark.parametrize("backend", [PS, AR])
def test_every_worker_remote_trains_as_on_one_host(backend, bed, one_host, undisturbed):
    est, used, outside = undisturbed[backend]
    weights, used_locally = one_host[backend]
    assert used_locally["shared_data"] == 2  # on one host the workers map the client's memory ...
    assert used["setups"] == WORKER_HOSTS and used["shared_data"] == 0 and used["shared_weights"] == 0  # ... here not
    assert float(np.abs(_weights(est) - weights).max()) <= TOLERANCE[backend]
    assert set(_workers_per_update(est)) == {WORKER_HOSTS}
    if backend == PS:
        assert used_locally["shared_weights"] == 2
        # the weights travel on the channel to each remote worker, every update
        assert used["channels"] == WORKER_HOSTS
        assert {frozenset((f[0], f[2])) for f in outside} == {frozenset((bed.net.client_address, h.address)) for h in bed.net.hosts[1:]}
        n_weights = weights.size * 4
        assert all(u["sent_bytes"] >= WORKER_HOSTS * n_weights for row in est.history_ for u in row["updates"])
    else:  # the requests' channels (client - worker), and gloo between the workers' hosts
        pairs = {frozenset((f[0], f[2])) for f in outside}
        hosts = [h.address for h in bed.net.hosts[1:]]
        assert pairs == {frozenset(hosts), *(frozenset((bed.net.client_address, h)) for h in hosts)}


# ------------------------------------------------------------------ TLS
class Sniffer:
    """Every TCP flow with a payload on the bed's links (an AF_PACKET socket in the root namespace,
    which sees the frames of every bridge port): a set of (address, port, address, port)."""

    def __init__(self, net):
        self.prefix, self.flows, self._stop = net.bridge[:-2], set(), threading.Event()
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                frame, where = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            if not where[0].startswith(self.prefix) or len(frame) < 34 or frame[12:14] != b"\x08\x00":
                continue
            ip = frame[14:]
            ihl, total, proto = (ip[0] & 15) * 4, struct.unpack("!H", ip[2:4])[0], ip[9]
            if proto != 6:
                continue
            tcp = ip[ihl:]
            offset = (tcp[12] >> 4) * 4
            if total - ihl - offset > 0:
                src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
                sport, dport = struct.unpack("!HH", tcp[:4])
                self.flows.add((src, sport, dst, dport))

    def stop(self) -> set:
        self._stop.set()
        self.thread.join()
        self.sock.close()
        return self.flows


@pytest.fixture(scope="module")
def tls_bed(netbed_ready):
    b = Bed(tls=True)
    assert b.address.startswith("tls://")
    yield b
    b.close()


def test_tls_keeps_weights_and_gradients_on_dasks_encrypted_comm(tls_bed, data, one_host):
    """The parameter server opens no channel on TLS (docs/guide/security.rst): every TCP flow on the
    links has a Dask TLS endpoint (the scheduler or a worker) at one end, and it trains the same.
    (On plain TCP the same sniffer sees the channels: test_every_worker_remote_trains_as_on_one_host.)"""

    client = tls_bed.client
    before = client.run(_stats)
    sniffer = Sniffer(tls_bed.net)
    try:
        est = DaskClassifier(client=client, **_params(PS)).fit(*data)
    finally:
        flows = sniffer.stop()
    used = _stats_delta(client, before)
    assert used["setups"] == WORKER_HOSTS and used.get("channels", 0) == 0 and used["shared_weights"] == 0
    assert float(np.abs(_weights(est) - one_host[PS][0]).max()) == TOLERANCE[PS]
    assert flows, "the sniffer saw nothing"
    outside = _outside_dask(flows, tls_bed)
    assert not outside, f"TCP flows outside Dask's TLS comm: {outside}"


def test_tls_refuses_plaintext_collectives_across_hosts(tls_bed, data):
    with pytest.raises(ValueError, match=r"(?s)tls://.*plaintext.*adadamp\.allreduce\.allow-plaintext"):
        DaskClassifier(client=tls_bed.client, **_params(AR)).fit(*data)


def test_tls_with_the_plaintext_opt_in_trains_as_on_one_host(tls_bed, data, one_host):
    """What the opt-in lets through in clear: gloo between the workers' hosts, never the client."""
    sniffer = Sniffer(tls_bed.net)
    try:
        with dask.config.set({"adadamp.allreduce.allow-plaintext": True}):
            est = DaskClassifier(client=tls_bed.client, **_params(AR)).fit(*data)
    finally:
        outside = _outside_dask(sniffer.stop(), tls_bed)
    assert float(np.abs(_weights(est) - one_host[AR][0]).max()) <= TOLERANCE[AR]
    assert outside and all(tls_bed.net.client_address not in (f[0], f[2]) for f in outside)


# ------------------------------------------------------------------ hosts lost, links cut, hosts joining
_ACTIONS: dict = {}  # what the test damper does at an update (dampers must stay clonable)


class ActAt(Constant):
    """Constant batch that runs ``_ACTIONS[n_updates]`` before that update (test only)."""

    def next_batch_size(self, state):
        action = _ACTIONS.pop(state.n_updates, None)
        if action is not None:
            action()
        return super().next_batch_size(state)


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("how", ["host-killed", "link-cut"])
def test_a_host_lost_mid_fit_is_survived(how, backend, bed, data, undisturbed):
    """Kill every process of a worker's host, or take its link down: the fit completes on the
    other host, within the backend's tolerance of the undisturbed fit."""
    calm = undisturbed[backend][0]
    victim = bed.net.hosts[-1]
    _ACTIONS.clear()
    _ACTIONS[5] = victim.kill if how == "host-killed" else (lambda: victim.link(up=False))
    try:
        est = DaskClassifier(client=bed.client, **_params(backend, batch_size=ActAt(batch_size=32),
                                                         update_timeout=10)).fit(*data)
    finally:
        _ACTIONS.clear()
        bed.restore(victim)
    assert float(np.abs(_weights(est) - _weights(calm)).max()) <= TOLERANCE[backend]
    assert est.history_[-1]["n_samples_seen"] == calm.history_[-1]["n_samples_seen"]
    workers = _workers_per_update(est)
    assert workers[0] == WORKER_HOSTS and min(workers) == WORKER_HOSTS - 1  # the loss was seen


@pytest.mark.parametrize("backend", [PS, AR])
def test_a_host_lost_as_a_fit_starts_is_survived(backend, bed, data, undisturbed):
    """A worker's link cut just before a fit: its set-up call fails, and where the fit registers the
    worker plugin (a client's first fit on the scheduler) the registration is broadcast to it too:
    when the scheduler drops it (worker TTL) mid-broadcast, Dask closes the client's connection that
    asked (the scheduler takes the broadcast's CommClosedError for its caller's), and the fit
    registers again.  Either way it trains on the other host."""
    calm = undisturbed[backend][0]
    victim = bed.net.hosts[-1]
    victim.link(up=False)
    try:
        est = DaskClassifier(client=bed.client, **_params(backend, update_timeout=10)).fit(*data)
    finally:
        bed.restore(victim)
    assert set(_workers_per_update(est)) == {WORKER_HOSTS - 1}
    assert est.history_[-1]["n_samples_seen"] == calm.history_[-1]["n_samples_seen"]
    # one worker from the start: one shard an update, not two (the same sum in another order)
    assert float(np.abs(_weights(est) - _weights(calm)).max()) <= TOLERANCE[AR]


@pytest.mark.parametrize("backend", [PS, AR])
def test_a_host_joining_mid_fit_is_used(backend, bed, data, undisturbed):
    """A machine added mid-fit takes part from an update soon after, and changes the result only by
    float summation order."""
    joined = []

    def join():
        joined.append(bed.add_worker_host())
        bed.client.wait_for_workers(WORKER_HOSTS + 1, timeout=120)
        time.sleep(2 * MEMBERSHIP_INTERVAL)  # the engine notices it by itself ...

    def settle():  # ... and sets it up off the training path (a fresh process imports torch first)
        address = f"{bed.address.split('://')[0]}://{joined[0].address}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = [s for w, s in bed.client.run(_stats).items() if w.startswith(address + ":")]
            if ready and ready[0].get("setups"):
                break
            time.sleep(0.2)
        time.sleep(2 * MEMBERSHIP_INTERVAL)

    _ACTIONS.clear()
    _ACTIONS.update({3: join, 5: settle})
    try:
        est = DaskClassifier(client=bed.client, **_params(backend, batch_size=ActAt(batch_size=32))).fit(*data)
    finally:
        _ACTIONS.clear()
        for host in joined:
            bed.remove_host(host)
    workers = _workers_per_update(est)
    assert workers[0] == WORKER_HOSTS and workers[-1] == WORKER_HOSTS + 1
    assert est.history_[-1]["n_samples_seen"] == 2 * len(data[0])
    # a third worker cuts an update into three shards: the same sum in another order, on either backend
    assert float(np.abs(_weights(est) - _weights(undisturbed[backend][0])).max()) <= TOLERANCE[AR]
