"""The all-reduce backend against a local attacker and on encrypted clusters (issue 34, items 1-2).

A group's rendezvous must give a stranger on the same host nothing to read, plant or join; a
broadcast may not make a member allocate more than the model's state; and on a cluster whose comm
is encrypted, plaintext collectives need the user's explicit consent."""

import datetime
import ipaddress
import logging
import threading

import dask
import numpy as np
import psutil
import pytest
import torch
import torch.distributed as dist
from distributed import Client, LocalCluster, Security
from distributed.utils import get_ip
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.callbacks import Callback
from adadamp.wire.parameters import flatten_parameters
from adadamp.worker.replica import Replica
from adadamp.worker.state import FitState

PS, AR = "parameter-server", "allreduce"
PLAINTEXT = "adadamp.allreduce.allow-plaintext"


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=512, n_features=8, n_informative=6, n_classes=3, random_state=2)
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def plain():
    """Two worker processes; the scheduler (in this process) on 127.0.0.1."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _params(**kw) -> dict:
    return {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 32, "max_epochs": 2,
            "random_state": 0, "scale_cluster": False, **kw}


def _listening() -> set[tuple[str, int]]:
    """The TCP addresses this process listens on."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


# ------------------------------------------------------------------ item 1: the rendezvous
class Attacker(threading.Thread):
    """Another local user during a fit: every port the client's process opens for it is tried as a
    ``torch.distributed.TCPStore`` (from the host's outward address when it listens on all
    interfaces); where one answers, it lists the keys, marks the coming generations aborted,
    plants a garbage address for the next generation and fills the store with 1 MiB values."""

    def __init__(self, known: set[tuple[str, int]]):
        super().__init__(daemon=True)
        self.known = set(known)
        self.reached: list[tuple[str, int]] = []
        self.keys: list[str] = []
        self.scans = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            self.scans += 1
            for ip, port in sorted(_listening() - self.known):
                self.known.add((ip, port))
                host = get_ip() if ipaddress.ip_address(ip).is_unspecified else ip
                prober = threading.Thread(target=self._attack, args=(host, port), daemon=True)
                prober.start()
                prober.join(5.0)  # what is not a store may never answer

    def _attack(self, host: str, port: int) -> None:
        try:
            store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=2))
            store.list_keys()
        except RuntimeError:
            return
        self.reached.append((host, port))
        for i in range(50):
            store.set(f"ballast/{i}", b"\x00" * 2**20)
        threading.Thread(target=self._plant, args=(store,), daemon=True).start()

    def _plant(self, store) -> None:
        """As generations form: abort the coming ones, and plant a garbage address for the next."""
        planted = set()
        while not self.stop.wait(0.005):
            try:
                self.keys = store.list_keys()
            except RuntimeError:  # the fit ended: its store is gone
                return
            for key in self.keys:
                if key.count("/") < 3 or key.startswith("ballast"):
                    continue
                fit, generation = key.split("/")[:2]  # <fit>/<generation>/0/<rank>
                if (fit, generation) in planted:
                    continue
                planted.add((fit, generation))
                for g in range(int(generation), int(generation) + 30):
                    store.set(f"{fit}/{g}/abort", b"1")
                store.set(f"{fit}/{int(generation) + 1}/0/0", b"\x00" * 64)


def test_a_local_attacker_finds_no_rendezvous_to_read_plant_or_join(data, plain, caplog):
    """The attacker finds nothing to connect to, and the fit is the undisturbed fit: the same
    weights, and no update failed and was recomputed."""
    X, y = data
    calm = DaskClassifier(client=plain, backend=AR, **_params()).fit(X, y)
    attacker = Attacker(_listening())
    attacker.start()
    try:
        with caplog.at_level(logging.WARNING, logger="adadamp"):
            attacked = DaskClassifier(client=plain, backend=AR, **_params()).fit(X, y)
    finally:
        attacker.stop.set()
        attacker.join()
    assert attacker.scans > 0
    assert attacker.reached == [], f"the attacker listed {attacker.keys[:4]}"
    assert not [r.getMessage() for r in caplog.records if "collective failed" in r.getMessage()]
    np.testing.assert_array_equal(_weights(attacked), _weights(calm))


_SEEN: dict[str, set] = {}


class RecordListeners(Callback):
    """After update ``at``: the TCP addresses the client's and the workers' processes listen on."""

    def __init__(self, at=3):
        self.at = at

    def on_update_end(self, estimator, record=None, loop=None, **info):
        if loop.n_updates == self.at:
            _SEEN["client"] = _listening()
            _SEEN["workers"] = set().union(*estimator.client.run(_listening).values())


def test_nothing_listens_beyond_the_schedulers_interface(data, plain):
    """With the scheduler on 127.0.0.1, nothing a fit opens -- on the client or on a worker, the
    rendezvous, gloo's sockets or the gradient channels -- listens on another address."""
    X, y = data
    before = _listening() | set().union(*plain.run(_listening).values())
    est = DaskClassifier(client=plain, backend=AR, callbacks=[RecordListeners(at=3)], **_params(max_epochs=1))
    with dask.config.set({"adadamp.allreduce.keep-group": 0}):  # a group formed, not one an earlier fit kept
        est.fit(X, y)
    opened = (_SEEN["client"] | _SEEN["workers"]) - before
    assert opened, "the fit's sockets were not seen"  # gloo's and the channels' at least
    assert {ip for ip, _ in opened} == {"127.0.0.1"}, sorted(opened)


def _replica(timeout: float) -> Replica:
    module = torch.nn.Linear(8, 3)
    flat, grads = flatten_parameters(module)
    state = FitState(module, torch.nn.CrossEntropyLoss(), torch.device("cpu"), flat, grads, n_total=8)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    return Replica(state, optimizer, fit_id="adadamp-test", worker=None, timeout=timeout, bucket_mb=1.0, applied=0)


def test_a_broadcast_longer_than_the_models_state_is_refused_before_allocating():
    """A peer that announces 64 GiB of state for a 27-weight model: the member refuses at once,
    naming both sizes, instead of allocating it and waiting for the bytes."""
    store = dist.HashStore()
    member = _replica(timeout=5.0)
    peer = {}

    def liar():
        group = dist.ProcessGroupGloo(dist.PrefixStore("g", store), 0, 2, datetime.timedelta(seconds=5))
        group.broadcast(torch.tensor([64 * 2**30], dtype=torch.int64), 0).wait()
        peer["group"] = group  # kept open: the member must not wait for the bytes

    thread = threading.Thread(target=liar, daemon=True)
    thread.start()
    member.group = dist.ProcessGroupGloo(dist.PrefixStore("g", store), 1, 2, datetime.timedelta(seconds=5))
    member.rank, member.size, member.generation = 1, 2, 1
    member._prefix = dist.PrefixStore("g", store)
    with pytest.raises(RuntimeError, match=r"68719476736 bytes of state.* at most \d+"):
        member._broadcast_state()
    thread.join()


# ------------------------------------------------------------------ item 2: encrypted clusters
@pytest.fixture(scope="module")
def tls():
    """Two worker processes whose comm is TLS (temporary self-signed credentials)."""
    security = Security.temporary()
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, security=security,
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster, security=security) as client,
    ):
        assert client.scheduler.address.startswith("tls://")
        yield client


def _fits_on_workers() -> int:
    from adadamp.worker import plugin as _worker

    return len(_worker.TRAINER.fits)


def test_tls_cluster_refuses_plaintext_collectives(data, tls):
    """The error says why, names the opt-in and comes before any work on the cluster."""
    with pytest.raises(ValueError, match=r"(?s)tls://.*plaintext.*adadamp\.allreduce\.allow-plaintext"):
        DaskClassifier(client=tls, backend=AR, **_params(max_epochs=1)).fit(*data)
    assert sum(tls.run(_fits_on_workers).values()) == 0


def test_required_encryption_refuses_plaintext_collectives_on_tcp(data, plain):
    with (
        dask.config.set({"distributed.comm.require-encryption": True}),
        pytest.raises(ValueError, match=r"require-encryption.*adadamp\.allreduce\.allow-plaintext"),
    ):
        DaskClassifier(client=plain, backend=AR, **_params(max_epochs=1)).fit(*data)


def test_tls_cluster_trains_with_the_opt_in(data, tls):
    """With the opt-in the replicas train (their rendezvous on Dask's TLS comm): the parameter
    server's weights."""
    X, y = data
    ps = DaskClassifier(client=tls, backend=PS, **_params()).fit(X, y)
    with dask.config.set({PLAINTEXT: True}):
        ar = DaskClassifier(client=tls, backend=AR, **_params()).fit(X, y)
    np.testing.assert_allclose(_weights(ar), _weights(ps), rtol=1e-5, atol=1e-6)
