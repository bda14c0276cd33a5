"""Shared fixtures: one real LocalCluster of worker processes for the session, the single-node
SLURM of ``tests/system/slurm`` (``slurm``), the dask-gateway server of ``tests/system/gateway``
(``gateway``), the emulated hosts of ``tests/system/netbed`` (``netbed_ready``), and a check for processes a test left behind."""

import contextlib
import fcntl
import gc
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import dask
import psutil
import pytest
import torch
from distributed import Client, LocalCluster

SLURM_DIR = Path(__file__).resolve().parent / "system" / "slurm"
SLURM_START_TIMEOUT = 420  # seconds; the first start may install packages with apt-get
GATEWAY_DIR = Path(__file__).resolve().parent / "system" / "gateway"
BROWSER_INSTALL = Path(__file__).resolve().parent / "system" / "browser" / "install.sh"
#: Held by the test that uses the machine's one SLURM or its emulated hosts (and by SLURM's start):
#: under pytest-xdist (CI's ``-n 2``) such tests of different processes run one at a time.
SYSTEM_LOCK = Path(tempfile.gettempdir()) / "adadamp-tests-system.lock"
# The test folders mirror adadamp's packages; their modules import each other's fault injectors by
# module name (``from test_elastic import StopAt``), here and on the workers that unpickle them, and
# the emulated hosts of tests/system/netbed are ``netbed``: every folder is on the path, in a fixed order.
for _folder in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir() and p.name != "__pycache__"):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

torch.set_num_threads(1)


def _start_workers_from_a_fork_server() -> None:
    """The suite's Dask worker processes start from a fork server that imported torch, Dask and
    adadamp once (Dask's own suite does the same, with Dask alone), instead of a new interpreter
    importing them for every worker of every cluster the suite starts.  Scripts the tests run
    in subprocesses, and users, keep Dask's default (spawn)."""
    import multiprocessing

    import distributed.utils

    if os.environ.get("ADADAMP_TEST_SPAWN", "") not in ("", "0"):
        return
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    distributed.utils.get_mp_context()  # Dask's preload, set once; then ours
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["distributed", "dask", "msgpack", "cloudpickle", "tornado", "toolz", "numpy", "torch", "adadamp",
         "adadamp.worker.plugin", "adadamp.engine"])


_start_workers_from_a_fork_server()


@contextlib.contextmanager
def two_worker_cluster():
    """Two single-threaded worker processes; the dashboard serves adadamp's training page, as a
    user's cluster does once ``adadamp.dashboard`` is in ``distributed.scheduler.http.routes``."""
    routes = [*dask.config.get("distributed.scheduler.http.routes"), "adadamp.dashboard"]
    with (
        dask.config.set({"distributed.scheduler.http.routes": routes}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
    ):
        yield cluster


@pytest.fixture(scope="session")
def cluster():
    """The session's :func:`two_worker_cluster`."""
    with two_worker_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def session_client(cluster):
    with Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def client(session_client):
    """The shared client, made current so estimators with client=None use it, on the cluster's two
    workers (an earlier test's growing fit leaves it more, kept warm for the idle timeout)."""
    back_to_two(session_client)
    with session_client.as_current():
        yield session_client


def back_to_two(client, timeout: float = 60.0) -> None:
    """Shrink the session's cluster to its two workers through adadamp's own adaptive (graceful
    retirement of the workers no fit holds), then let it grow again for the tests that want it."""
    import math
    import time

    from adadamp.cluster import adaptive as allocator

    if len(client.scheduler_info()["workers"]) <= 2:
        return
    allocator.ensure_allocator(client)  # the adaptive asks the scheduler's allocator what to keep
    adaptive = allocator.adapt(client.cluster, minimum=2, maximum=2, idle=0)
    adaptive.minimum = 2  # an adaptive made earlier keeps the minimum it was made with
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) > 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    adaptive.maximum, adaptive.idle = math.inf, None


def fits_on_workers(client) -> set[str]:
    """The ids of the fits the workers of ``client`` hold."""
    from adadamp.worker import plugin

    return {f for fits in client.run(lambda: list(plugin.TRAINER.fits)).values() for f in fits}


@pytest.fixture
def new_fits(client):
    """The fits on the shared cluster's workers that this test made (a callable).

    An earlier test's estimator that is not yet collected may still keep its call on the workers
    (until its owner goes, or ``KEEP_SECONDS``): tests count only their own.
    """
    gc.collect()
    earlier = fits_on_workers(client)
    return lambda: fits_on_workers(client) - earlier


@pytest.fixture(scope="module")
def small_client():
    """2 single-threaded workers of memory_limit 1 GiB (~450 MB of each held by torch and Dask)."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB", dashboard_address=":0",
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client


@pytest.fixture(scope="session")
def regression_data():
    """256 x 8 float32 regression data with standardized targets."""
    import numpy as np
    from sklearn.datasets import make_regression

    X, y = make_regression(n_samples=256, n_features=8, noise=1.0, random_state=0)
    return X.astype(np.float32), (y / y.std()).astype(np.float32)


@pytest.fixture(autouse=True)
def _no_embedded_cluster_between_tests():
    """Each test starts without an embedded cluster, as a fresh process does (fits share it within a test)."""
    yield
    from adadamp import close_embedded_cluster

    close_embedded_cluster()


@pytest.fixture
def new_processes():
    """``new_processes()`` lists the child processes started during the test that are still
    alive after a grace period (``timeout`` seconds): what a test left running."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}

    def alive(timeout: float = 10.0) -> list[psutil.Process]:
        started = [p for p in me.children(recursive=True) if p.pid not in before and not _resource_tracker(p)]
        return psutil.wait_procs(started, timeout=timeout)[1]

    return alive


def _resource_tracker(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker: one per process, started by the first spawned child, kept until exit."""
    try:
        return "multiprocessing.resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@contextlib.contextmanager
def _system_lock():
    with open(SYSTEM_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _one_system_test_at_a_time(request):
    """A test on the single SLURM or the emulated hosts runs alone among the suite's processes
    (pytest-xdist): their jobs would queue behind each other's, their namespaces share addresses."""
    if {"slurm", "netbed_ready"} & set(request.fixturenames):
        with _system_lock():
            yield
    else:
        yield


def _controller_pid(config) -> int:
    """The process that runs the session: pytest-xdist's controller (a worker's parent), or this one."""
    return os.getppid() if hasattr(config, "workerinput") else os.getpid()


def _slurm_marker(config) -> Path:
    return Path(tempfile.gettempdir()) / f"adadamp-tests-slurm-started-{_controller_pid(config)}"


def pytest_sessionfinish(session, exitstatus):
    """Stop the SLURM this session started, once all its processes are done with it (under
    pytest-xdist only the controller knows that), unless ``ADADAMP_SLURM_KEEP=1``."""
    if hasattr(session.config, "workerinput"):
        return
    marker = _slurm_marker(session.config)
    if marker.exists():
        marker.unlink()
        if os.environ.get("ADADAMP_SLURM_KEEP", "") in ("", "0"):
            subprocess.run(["bash", str(SLURM_DIR / "stop.sh")], check=False, capture_output=True, text=True,
                           timeout=120)


@pytest.fixture(scope="session")
def slurm(pytestconfig):
    """A single-node SLURM (munged, slurmctld, slurmd on localhost) for the session.

    ``tests/system/slurm/start.sh`` installs and starts it as root; where it cannot, the test skips with
    the reason, or fails when the environment variable ``CI`` is set (CI must run the SLURM tests).
    Yields start.sh's last line ("SLURM ready (started: ...)"); at the end of the session
    ``tests/system/slurm/stop.sh`` stops what this start started (:func:`pytest_sessionfinish`).
    """
    reason = None
    start = SLURM_DIR / "start.sh"
    if not sys.platform.startswith("linux"):
        reason = f"SLURM tests need Linux (this is {sys.platform})"
    else:
        try:
            with _system_lock():  # one start at a time among the session's processes
                proc = subprocess.run(
                    ["bash", str(start)], check=False, capture_output=True, text=True, timeout=SLURM_START_TIMEOUT
                )
        except subprocess.TimeoutExpired as err:
            tail = (err.stderr or b"")[-1500:]
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            reason = f"tests/system/slurm/start.sh did not finish within {SLURM_START_TIMEOUT} s: {tail.strip()}"
        else:
            if proc.returncode != 0:
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
                reason = f"SLURM could not be started (tests/system/slurm/start.sh exit {proc.returncode}):\n{tail}"
    if reason is not None:
        if _ci():
            pytest.fail(f"{reason}\n(CI is set: the SLURM tests must run in CI)", pytrace=False)
        pytest.skip(reason=reason)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if "started: nothing" not in last:
        _slurm_marker(pytestconfig).touch()
    return last


@pytest.fixture(scope="session")
def gateway():
    """A dask-gateway server on localhost for the session (``tests/system/gateway/start.sh``: the
    UnsafeLocalBackend, whose clusters are processes of this user, and simple authentication), stopped
    at its end with the clusters it runs.  Yields its address (``http://127.0.0.1:PORT``).  Where it cannot
    start (dask-gateway-server missing) the test skips with the reason, or fails when ``CI`` is set."""
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "ADADAMP_GATEWAY_PYTHON": sys.executable,  # its clusters import this adadamp
           "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    try:
        proc = subprocess.run(["bash", str(GATEWAY_DIR / "start.sh")], check=False, capture_output=True, text=True,
                              timeout=120, env=env)
        reason = None if proc.returncode == 0 else (
            f"dask-gateway-server could not be started (tests/system/gateway/start.sh exit {proc.returncode}):\n"
            + "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:]))
    except subprocess.TimeoutExpired:
        reason = "tests/system/gateway/start.sh did not finish within 120 s"
    if reason is not None:
        if _ci():
            pytest.fail(f"{reason}\n(CI is set: the dask-gateway tests must run in CI)", pytrace=False)
        pytest.skip(reason=reason)
    last = proc.stdout.strip().splitlines()[-1]  # Gateway ready: URL (pid PID, state DIR)
    address, state = last.split()[2], last.rstrip(")").split()[-1]
    try:
        yield address
    finally:
        subprocess.run(["bash", str(GATEWAY_DIR / "stop.sh"), state], check=False, capture_output=True, text=True,
                       timeout=120)


@pytest.fixture(scope="session")
def netbed_ready():
    """Whether ``tests/system/netbed`` can build emulated hosts here (Linux, root, iproute2, installed with
    apt-get where missing); where it cannot, the test skips with the reason, or fails when ``CI``
    is set (CI must run the multi-host tests).  Also removes what dead test beds left behind."""
    import netbed

    reason = netbed.available()
    if reason is not None:
        if _ci():
            pytest.fail(f"{reason}\n(CI is set: the multi-host tests must run in CI)", pytrace=False)
        pytest.skip(reason=reason)
    netbed.sweep()


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless Chromium (``tests/system/browser/install.sh`` installs it as root); where it cannot
    be had the test skips with the reason, or fails when ``CI`` is set (CI must run the browser tests)."""
    try:
        proc = subprocess.run(["bash", str(BROWSER_INSTALL)], check=False, capture_output=True, text=True,
                              timeout=SLURM_START_TIMEOUT)
        reason = None if proc.returncode == 0 else (
            f"Chromium could not be installed (tests/system/browser/install.sh exit {proc.returncode}): "
            + "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        )
    except subprocess.TimeoutExpired:
        reason = f"tests/system/browser/install.sh did not finish within {SLURM_START_TIMEOUT} s"
    if reason is not None:
        if _ci():
            pytest.fail(f"{reason}\n(CI is set: the browser tests must run in CI)", pytrace=False)
        pytest.skip(reason=reason)
    return "chromium"
