"""Same seed, same worker count: bitwise the same weights, whatever the join order of the workers,
wherever the client runs (here or inside worker tasks, several fits at once) and whatever the
cluster went through before (killed and replaced workers, earlier fits)."""

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from distributed.comm.core import CommClosedError
from sklearn.datasets import make_regression
from torch import nn

from adadamp import DaskRegressor
from adadamp.estimators import fitting as building
from adadamp.wire.seeding import seeded


class DropoutNet(nn.Module):
    """Dropout draws from torch's process-wide generator on the workers at every update."""

    def __init__(self, n_features: int = 8, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


PARAMS = {
    "module": DropoutNet,
    "optimizer": torch.optim.SGD,
    "optimizer__lr": 0.01,
    "optimizer__momentum": 0.9,
    "batch_size": 32,
    "max_epochs": 3,
    "random_state": 7,
    "min_workers": 2,  # the batch on both workers of the clusters below
}


@pytest.fixture(scope="module")
def data():
    X, y = make_regression(n_samples=384, n_features=8, noise=1.0, random_state=0)
    return X.astype(np.float32), (y / y.std()).astype(np.float32)


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def _fit_here(X, y, **params) -> np.ndarray:
    """Fit with the client found where this runs (the test's, or a worker's inside a task)."""
    return _weights(DaskRegressor(**{**PARAMS, **params}).fit(X, y))


def test_seeded_draws_repeat_and_leave_the_callers_random_state(monkeypatch):
    import traceback

    # Seeding through torch.manual_seed would queue a CUDA seed with a captured stack on every update.
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: pytest.fail("a stack trace was captured"))
    drop = nn.Dropout(0.5)
    x = torch.ones(1000)
    torch.default_generator.manual_seed(0)
    before = torch.rand(3)
    torch.default_generator.manual_seed(0)
    with seeded(7):
        first = drop(x)
    after = torch.rand(3)
    with seeded(7):
        again = drop(x)
    with seeded(8):
        other = drop(x)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(before, after)  # the caller's stream went on as if nothing had been drawn


def test_module_weights_do_not_depend_on_other_threads_seeding():
    """A fit's client inside a worker task builds its module while the same process computes
    another fit's gradients (seeding dropout each update): the initial weights must not change."""

    def gradients_of_another_fit(stop):
        k = 0
        while not stop.is_set():
            with seeded(k):
                torch.rand(16)
            k += 1

    built = _modules_built_beside(gradients_of_another_fit)
    assert all(torch.equal(built[0], w) for w in built[1:])


def _modules_built_beside(other, n: int = 200) -> list[torch.Tensor]:
    """``n`` modules of ``PARAMS`` built from one seed (their flat weights) while a thread runs
    ``other(stop)`` until ``stop`` is set."""
    stop = threading.Event()
    thread = threading.Thread(target=other, args=(stop,), daemon=True)
    thread.start()
    try:
        params = DaskRegressor(**PARAMS).get_params(deep=False)
        return [torch.cat([p.detach().reshape(-1) for p in building.build_module(params, 8, 1, 123).parameters()])
                for _ in range(n)]
    finally:
        stop.set()
        thread.join()


def test_the_output_shape_check_neither_disturbs_nor_moves_torchs_generator():
    """Two fits on threads (a threaded search): one checks its module's output on two examples (a
    dropout forward pass) while the other draws its initial weights; the check must not move the
    other's draws, nor the caller's random stream."""
    module, criterion = DropoutNet(), nn.MSELoss()
    X, y = np.ones((2, 8), np.float32), np.ones((2, 1), np.float32)
    torch.default_generator.manual_seed(0)
    before = torch.default_generator.get_state()
    building.check_output_shape(module, criterion, X, y, (2, 1), {})
    assert torch.equal(before, torch.default_generator.get_state())

    def checks_of_another_fit(stop):
        while not stop.is_set():
            building.check_output_shape(module, criterion, X, y, (2, 1), {})

    built = _modules_built_beside(checks_of_another_fit)
    assert all(torch.equal(built[0], w) for w in built[1:])


def _free_ports(n: int) -> list[int]:
    """``n`` free TCP ports with the same number of digits, ascending (so address order = port order)."""
    ports: set[int] = set()
    with contextlib.ExitStack() as stack:
        while len(ports) < n:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port >= 10_000:
                ports.add(port)
    return sorted(ports)


@contextlib.contextmanager
def _workers_started(scheduler: str, ports: list[int], client: Client, delay: float):
    """Start one ``dask worker`` process per port, in the given order, each after the last has joined."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}  # as users' workers
    procs = []
    try:
        for k, port in enumerate(ports):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--nthreads", "1",
                 "--worker-port", str(port), "--name", f"w{port}", "--no-dashboard"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            ))
            client.wait_for_workers(k + 1, timeout=60)
            time.sleep(delay)
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_same_weights_whatever_the_join_order_the_client_and_the_clusters_past(client, data):
    X, y = data
    reference = _fit_here(X, y)  # the session's long-lived cluster, two workers

    low, high = _free_ports(2)
    with (
        LocalCluster(n_workers=0, dashboard_address=None, silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as own,
        # the worker that sorts last joins first, the other one a second later
        _workers_started(cluster.scheduler_address, [high, low], own, delay=1.0),
    ):
        assert sorted(own.scheduler_info(n_workers=-1)["workers"]) == [
            f"tcp://127.0.0.1:{low}", f"tcp://127.0.0.1:{high}"]
        with own.as_current():
            np.testing.assert_array_equal(_fit_here(X, y), reference)
        # two fits at once, each with its client inside a worker task
        tasks = [own.submit(_fit_here, X, y, pure=False) for _ in range(2)]
        for weights in own.gather(tasks):
            np.testing.assert_array_equal(weights, reference)
        # another fit ran; a worker is SIGKILLed and its nanny starts a new one
        with own.as_current():
            _fit_here(X, y, random_state=1, batch_size=16)
        pid = own.run(os.getpid, workers=[f"tcp://127.0.0.1:{low}"])[f"tcp://127.0.0.1:{low}"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError, CommClosedError):  # the dead worker may still be listed
                pids = list(own.run(os.getpid).values())
                if len(pids) == 2 and pid not in pids:
                    break
            assert time.monotonic() < deadline, "the nanny did not replace the killed worker"
            time.sleep(0.2)
        with own.as_current():
            np.testing.assert_array_equal(_fit_here(X, y), reference)
