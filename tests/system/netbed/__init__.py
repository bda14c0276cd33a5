"""Many emulated hosts on one Linux machine: network namespaces joined by shaped virtual links.

A :class:`Netbed` is a Linux bridge in the root namespace and ``n`` *hosts*.  Each host is a
network namespace (``ip netns``) with one interface, ``eth0``, whose address is taken from the
benchmarking range 198.18.0.0/15 (RFC 2544; each bed takes a /24 that no other uses), linked to the bridge by a veth pair, and its own
``/dev/shm``: every process of a host runs under ``ip netns exec`` (which gives it a private mount
namespace) with a per-host directory bind-mounted over ``/dev/shm``, so a worker never sees the
client's shared-memory files nor another host's.  The client (the test process itself) is one more
host: a veth pair whose root-namespace end holds the bed's ``.1`` address and whose other end is a bridge port,
so what the client sends and receives crosses a veth link like the workers' traffic, and its own
``/dev/shm`` is the machine's, which no emulated host sees.  Running the client in the root
namespace keeps the test body, its fixtures and its assertions in the pytest process (no
``setns``, no test body in a subprocess); the only addresses it talks to are the bed's.

``tc`` shapes each link's rate (``tbf`` on both ends of the veth pair: upload and download).  This
kernel has no ``netem``, so delay and loss cannot be emulated here; :mod:`adadamp.simulate` covers
latency.

Names carry the owner's process id (namespaces ``adnb<pid><seq>-h<i>``, links ``nb<pid><seq>...``)
and are removed at :meth:`Netbed.stop` (also after a failure, and at interpreter exit); :func:`sweep`
removes what a dead process left behind and runs at every start.  The processes' output is in
``Netbed.logs`` (removed at stop unless ``ADADAMP_NETBED_KEEP_LOGS=1``).  Needs Linux, root and ``ip``
(iproute2; :func:`available` installs it with apt-get where it is missing).

Used by ``tests/system/test_multihost.py`` and usable by ``benchmarks/``::

    with Netbed(hosts=3, rate="1gbit") as bed:
        address = bed.start_scheduler(bed.hosts[0])
        for host in bed.hosts[1:]:
            bed.start_worker(host, address)
        with Client(address) as client: ...
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Self

NS_PREFIX = "adnb"
LINK_PREFIX = "nb"
SHM_ROOT = "/dev/shm"
SHM_PREFIX = "adadamp-netbed-"
RANGE = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544's benchmarking range
FIRST_HOST = 10  # in a bed's /24 the client is .1, the hosts .10, .11, ...
SCHEDULER_PORT = 8786
_SEQ = itertools.count()
_LIVE: set[Netbed] = set()


class NetbedUnavailable(RuntimeError):
    """The test bed cannot be built here (the message says why)."""


def _run(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise NetbedUnavailable(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def available(install: bool = True) -> str | None:
    """None where a test bed can be built here, else the reason.  ``install``: get iproute2
    with apt-get when ``ip`` is missing (as ``tests/system/slurm/start.sh`` gets SLURM)."""
    if not sys.platform.startswith("linux"):
        return f"the test bed needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"the test bed needs root to create network namespaces (running as uid {os.geteuid()})"
    if shutil.which("ip") is None and install and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "iproute2"]):
            subprocess.run(cmd, capture_output=True, env=env, timeout=300, check=False)
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"the test bed needs {tool!r} (iproute2 / util-linux), which is not installed"
    probe = f"{NS_PREFIX}{os.getpid()}probe"
    proc = _run("ip", "netns", "add", probe, check=False)
    if proc.returncode != 0:
        return f"cannot create a network namespace: {proc.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(name: str, prefix: str) -> int | None:
    digits = ""
    for ch in name[len(prefix):]:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if name.startswith(prefix) and digits else None


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in network namespace ``ns``."""
    proc = _run("ip", "netns", "pids", ns, check=False)
    for pid in proc.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def sweep() -> list[str]:
    """Remove the namespaces, links and shared-memory directories of test beds whose owning
    process is gone; returns what was removed."""
    removed = []
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        owner = _owner(ns, NS_PREFIX)
        if owner is not None and not _pid_alive(owner):
            _kill_namespace(ns)
            _run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        owner = _owner(name, LINK_PREFIX)
        if owner is not None and not _pid_alive(owner):
            _run("ip", "link", "del", name, check=False)
            removed.append(name)
    with contextlib.suppress(OSError), os.scandir(SHM_ROOT) as entries:
        for entry in entries:
            owner = _owner(entry.name, SHM_PREFIX)
            if owner is not None and not _pid_alive(owner):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


@dataclass(eq=False)
class Host:
    """One emulated host: a network namespace, its address, its /dev/shm and its processes."""

    bed: Netbed
    index: int
    ns: str
    address: str
    port: str  # the veth end on the bridge (root namespace)
    shm: str  # the directory bind-mounted over /dev/shm in the host
    procs: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, args: list[str], log: str, env: dict | None = None) -> subprocess.Popen:
        """Start ``args`` on this host (its namespace, its /dev/shm); output goes to ``log``."""
        wrapped = ["ip", "netns", "exec", self.ns, "sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"', self.shm,
                   *args]
        with open(log, "ab") as out:
            proc = subprocess.Popen(wrapped, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append(proc)
        return proc

    def exec(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a command on this host and wait for it (its /dev/shm included)."""
        return subprocess.run(["ip", "netns", "exec", self.ns, "sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"',
                               self.shm, *args], capture_output=True, text=True, timeout=timeout, check=False)

    def kill(self) -> None:
        """The host is lost: SIGKILL every process in it (whatever started them)."""
        _kill_namespace(self.ns)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def link(self, up: bool) -> None:
        """Cut (``up=False``) or restore this host's link (its veth end, ``eth0``)."""
        _run("ip", "-n", self.ns, "link", "set", "eth0", "up" if up else "down")

    def shape(self, rate: str | None) -> None:
        """Shape the link to ``rate`` (a tc rate: "1gbit", "10gbit") both ways; None: unshaped."""
        _tbf(["ip", "netns", "exec", self.ns, "tc"], "eth0", rate)
        _tbf(["tc"], self.port, rate)


def _tbf(tc: list[str], dev: str, rate: str | None) -> None:
    """Replace ``dev``'s root qdisc by a tbf at ``rate`` (None: no shaping)."""
    _run(*tc, "qdisc", "del", "dev", dev, "root", check=False)
    if rate is not None:
        _run(*tc, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", _burst(rate), "latency", "50ms")


def _free_network(start: int) -> ipaddress.IPv4Network:
    """A /24 of 198.18.0.0/15 that no interface of the root namespace uses (several test beds,
    of this process or others, run side by side), trying from the ``start``-th on."""
    used = set()
    for line in _run("ip", "-o", "-4", "addr", "show", check=False).stdout.splitlines():
        for word in line.split():
            if "/" in word and word[0].isdigit():
                with contextlib.suppress(ValueError):
                    used.add(ipaddress.ip_interface(word).network)
    subnets = list(RANGE.subnets(new_prefix=24))
    for k in range(len(subnets)):
        net = subnets[(start + k) % len(subnets)]
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetbedUnavailable("every /24 of 198.18.0.0/15 is in use")


def _burst(rate: str) -> str:
    """A tbf bucket that holds a few ms at ``rate`` (at least 64 KiB)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            bits = float(rate[: -len(unit)]) * scale
            return str(max(65536, int(bits / 8 * 0.004)))
    return "1mb"


class Netbed:
    """A bridge, the client's link (``client_address``, the /24's ``.1``, in the root namespace) and ``hosts`` hosts.

    ``rate`` shapes every link (see :meth:`Host.shape`).  Use as a context manager, or call
    :meth:`start` and :meth:`stop` (which is safe to call twice and also runs at exit).
    """

    def __init__(self, hosts: int = 3, rate: str | None = None):
        self.n_hosts, self.rate = hosts, rate
        self.tag = f"{os.getpid()}{chr(ord('a') + next(_SEQ) % 26)}"
        self.bridge = f"{LINK_PREFIX}{self.tag}br"
        self.client_link = f"{LINK_PREFIX}{self.tag}cl"
        self.hosts: list[Host] = []
        self.network: ipaddress.IPv4Network | None = None  # this bed's /24, chosen at start
        self.logs = tempfile.mkdtemp(prefix=f"adadamp-netbed-{self.tag}-logs-")
        self._next = 0
        self._started = False

    # ------------------------------------------------------------------ life
    def start(self) -> Netbed:
        reason = available()
        if reason is not None:
            raise NetbedUnavailable(reason)
        sweep()
        self.network = _free_network(os.getpid() * 26 + ord(self.tag[-1]))
        self.client_address = str(self.network[1])
        self._started = True
        _LIVE.add(self)
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
            peer = f"{LINK_PREFIX}{self.tag}cp"
            _run("ip", "link", "add", self.client_link, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", peer, "master", self.bridge, "up")
            _run("ip", "addr", "add", f"{self.client_address}/{self.network.prefixlen}", "dev", self.client_link)
            _run("ip", "link", "set", self.client_link, "up")
            if self.rate is not None:
                for dev in (self.client_link, peer):
                    _tbf(["tc"], dev, self.rate)
            for _ in range(self.n_hosts):
                self.add_host()
        except BaseException:
            self.stop()
            raise
        return self

    def add_host(self) -> Host:
        """One more host on the bridge (also while a fit runs: a machine joining)."""
        i = self._next
        self._next += 1
        ns, port = f"{NS_PREFIX}{self.tag}-h{i}", f"{LINK_PREFIX}{self.tag}p{i}"
        address = str(self.network[FIRST_HOST + i])
        shm = os.path.join(SHM_ROOT, f"{SHM_PREFIX}{self.tag}-h{i}")
        os.makedirs(shm, mode=0o1777)
        os.chmod(shm, 0o1777)
        host = Host(self, i, ns, address, port, shm)
        self.hosts.append(host)
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", port, "master", self.bridge, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "addr", "add", f"{address}/{self.network.prefixlen}", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        if self.rate is not None:
            host.shape(self.rate)
        return host

    def shape(self, rate: str | None) -> None:
        """Shape every link, the client's and each host's, to ``rate`` both ways (None: unshaped);
        hosts added later get it too."""
        self.rate = rate
        for dev in (self.client_link, f"{LINK_PREFIX}{self.tag}cp"):
            _tbf(["tc"], dev, rate)
        for host in self.hosts:
            host.shape(rate)

    def remove_host(self, host: Host) -> None:
        """Kill a host's processes and remove it (namespace, link, /dev/shm)."""
        host.kill()
        _run("ip", "netns", "del", host.ns, check=False)  # its veth pair goes with it
        _run("ip", "link", "del", host.port, check=False)
        shutil.rmtree(host.shm, ignore_errors=True)
        with contextlib.suppress(ValueError):
            self.hosts.remove(host)

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        for host in list(self.hosts):
            self.remove_host(host)
        _run("ip", "link", "del", self.client_link, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        _LIVE.discard(self)
        if os.environ.get("ADADAMP_NETBED_KEEP_LOGS", "") in ("", "0"):
            shutil.rmtree(self.logs, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ Dask on the bed
    def start_scheduler(self, host: Host, tls: dict | None = None, env: dict | None = None) -> str:
        """A Dask scheduler on ``host``; returns its address.  ``tls``: from :meth:`tls_files`."""
        protocol = "tls" if tls else "tcp"
        args = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host.address, "--port",
                str(SCHEDULER_PORT), "--no-dashboard", "--protocol", protocol, *_tls_args(tls)]
        host.popen(args, os.path.join(self.logs, f"h{host.index}-scheduler.log"), env=env)
        address = f"{protocol}://{host.address}:{SCHEDULER_PORT}"
        self._wait_listening(host, SCHEDULER_PORT)
        return address

    def start_worker(self, host: Host, scheduler: str, tls: dict | None = None, env: dict | None = None):
        """One single-threaded Dask worker on ``host`` (no nanny: a lost host restarts nothing;
        it exits when it cannot reach the scheduler for 60 s).  It imports adadamp's worker side
        (torch) before it joins: an import in the worker's event loop on a loaded machine blocks
        its heartbeats for seconds, and a scheduler with a short worker TTL drops it."""
        protocol = scheduler.split("://")[0]
        args = [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--host", host.address,
                "--nworkers", "1", "--nthreads", "1", "--no-nanny", "--no-dashboard", "--protocol", protocol,
                "--death-timeout", "60", "--local-directory", host.shm, "--preload", "adadamp.worker.plugin",
                *_tls_args(tls)]
        return host.popen(args, os.path.join(self.logs, f"h{host.index}-worker.log"),
                          env={"OMP_NUM_THREADS": "1", **(env or {})})

    def tls_files(self, security) -> dict:
        """Write a ``distributed.Security``'s in-memory credentials (``Security.temporary()``) to
        files the command-line scheduler and workers read."""
        files = {}
        for key, name in (("tls_ca_file", "ca.pem"), ("tls_scheduler_cert", "cert.pem"),
                          ("tls_scheduler_key", "key.pem")):
            path = os.path.join(self.logs, name)
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(getattr(security, key))
            files[key] = path
        return files

    def _wait_listening(self, host: Host, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = _run("ip", "netns", "exec", host.ns, "ss", "-Hltn", f"sport = :{port}", check=False).stdout
            if out.strip():
                return
            if any(p.poll() is not None for p in host.procs):
                break
            time.sleep(0.2)
        raise NetbedUnavailable(f"nothing listens on {host.address}:{port} (logs in {self.logs})")


def _tls_args(tls: dict | None) -> list[str]:
    if not tls:
        return []
    return ["--tls-ca-file", tls["tls_ca_file"], "--tls-cert", tls["tls_scheduler_cert"], "--tls-key",
            tls["tls_scheduler_key"]]


@atexit.register
def _stop_all() -> None:
    for bed in list(_LIVE):
        with contextlib.suppress(Exception):
            bed.stop()
