"""What an estimator's pickle keeps of its Dask client, so that it trains on the same cluster in
another process (a joblib worker process of ``GridSearchCV(n_jobs=k)``, ``cross_val_score``).

A ``distributed.Client`` is a live connection and does not pickle.  An estimator's ``client=`` is
pickled as :class:`PickledClient`: the scheduler's address and the client's ``Security``.  In the
process that unpickles it, it stays a :class:`PickledClient` (``get_params()["client"]``) and is
connected when a fit needs it: one connection per process and scheduler (:meth:`PickledClient.client`),
shared by the calls that run at once there, and closed when the last of them ends
(:func:`in_use`), unless an estimator keeps a backend open on it; in the process whose client it
was, it becomes that client again.  A connection held between calls outlived the scheduler it
connected to: when the user's cluster closed after a search, each joblib worker process's client
tried to reconnect, and logged the attempt's traceback at ERROR when the process exited.

Credentials travel only to this user's child processes: a pickle made for joblib's worker
processes (loky's pickler) or for ``multiprocessing`` / ``concurrent.futures`` (their
``ForkingPickler``) carries the client's TLS settings, in-memory keys included, as Dask passes
them to the worker processes its ``LocalCluster`` spawns.  Any other pickle (a file, Dask's
comms, ``copy.deepcopy``) carries the address, and the TLS settings only when they are file paths;
a process that unpickles it connects with the TLS settings of its own dask config.  The embedded
cluster's credentials are never carried: they stay in the process that started it.

An estimator with ``client=None`` pickled for a child process carries :class:`Sender`: the
sending process's id and its default client, if it has one.  A fit in the child that finds no
client of its own trains on that scheduler (logged at INFO); with none anywhere it starts the
child's own embedded cluster, and says so once per process (a WARNING), since each joblib worker
process then starts one.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing.reduction
import os
import threading
import weakref

from distributed import Client, Security

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()  # one connection per scheduler per process, however many threads fit at once
_KNOWN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # address -> this process's pickled clients
_CONNECTED: dict[str, Client] = {}  # address -> the client this process made for unpickled estimators
_USES: dict[str, int] = {}  # address -> the calls of this process using the client made for it now
_INHERITED: list = []  # a forked child's copies of its parent's clients: never used, closed nor collected
_WARNED: set[str] = set()  # what this process has warned about once

#: The fields of a ``Security`` that a client connects with.
_CLIENT_FIELDS = ("tls_ca_file", "tls_client_cert", "tls_client_key", "tls_ciphers", "tls_min_version", "tls_max_version")
#: The fields that hold credentials (``tls_key``, ``tls_cert``: dask-gateway's ``GatewaySecurity``, as PEM text).
_CREDENTIALS = ("tls_ca_file", "tls_client_cert", "tls_client_key", "tls_key", "tls_cert")


class PickledClient:
    """A Dask client as an estimator's pickle keeps it: its scheduler's address and ``Security``.

    ``get_params()["client"]`` of an estimator unpickled in another process.  It connects when a
    fit (or a prediction on dask data) needs the cluster: one connection per process and address
    at a time (:func:`in_use`).

    Parameters
    ----------
    address : str
        The scheduler's address, as the client connected to it.
    security : distributed.Security or None
        The TLS settings to connect with (None: those of the dask config).

    Examples
    --------
    What ``get_params()["client"]`` shows in a joblib worker process:

    >>> from adadamp.cluster.pickled_client import PickledClient
    >>> PickledClient("tcp://10.0.0.5:8786")
    PickledClient('tcp://10.0.0.5:8786')
    """

    __slots__ = ("address", "security")

    def __init__(self, address: str, security: Security | None = None):
        self.address = str(address)
        self.security = security

    @classmethod
    def of(cls, client: Client) -> PickledClient:
        """The pickled form of ``client``; this process gets ``client`` back when it unpickles it."""
        address = client.scheduler.address
        _KNOWN[address] = client
        if _is_embedded(client):  # its credentials stay in the process that started it
            return cls(address)
        return cls(address, _client_side(getattr(client, "security", None)))

    def known(self) -> Client | None:
        """The running client of this process that was pickled as this one, or None."""
        client = _KNOWN.get(self.address)
        return client if client is not None and client.status == "running" else None

    def client(self) -> Client:
        """A running client of this scheduler: this process's own (the one pickled, or the current
        client when it is connected there), else the one made for this address (made now if none is open).

        Raises
        ------
        ConnectionError
            The scheduler cannot be reached (it is gone, or needs TLS settings this process lacks).
        """
        known = self.known()
        if known is not None:
            return known
        worker = _worker()
        if worker is not None and _address(worker) == self.address:  # a task on this cluster (joblib's "dask")
            from distributed import get_client

            return get_client()
        current = _current_client()
        if current is not None and _address(current) == self.address:
            return current
        with _LOCK:
            made = _CONNECTED.get(self.address)
            if made is not None and made.status == "running":
                return made
            if made is not None:
                with contextlib.suppress(Exception):
                    made.close(timeout=1)
            try:
                made = Client(self.address, security=self.security, set_as_default=False)
            except (OSError, TimeoutError, ValueError) as err:
                raise ConnectionError(
                    f"This estimator's client= was pickled with the scheduler at {self.address}, which this "
                    f"process (pid {os.getpid()}) cannot connect to ({type(err).__name__}: {err}). Pass a running "
                    "client with set_params(client=...), or client=None to use the current one or the embedded "
                    "cluster. A scheduler that needs TLS takes the settings of the dask config here, or the "
                    "client's own where the pickle was made for a child process (joblib, multiprocessing)."
                ) from err
            _CONNECTED[self.address] = made
        logger.info("process %d connected to the scheduler at %s (a pickled estimator's client=)", os.getpid(), self.address)
        return made

    def __reduce__(self):
        return PickledClient, (self.address, _without_secrets(self.security))

    def _for_child_process(self):
        """The reduction for this user's child processes: the TLS settings as they are."""
        return PickledClient, (self.address, self.security)

    def __eq__(self, other) -> bool:
        return isinstance(other, PickledClient) and other.address == self.address

    def __hash__(self) -> int:
        return hash((PickledClient, self.address))

    def __repr__(self) -> str:
        return f"PickledClient({self.address!r})"


class Sender:
    """Where an estimator with ``client=None`` came from, in a child process: the sending process's
    id and its default client (a :class:`PickledClient`, or None).  Pickled only for child
    processes; any other pickle leaves it out."""

    __slots__ = ("client", "pid")

    def __init__(self, pid: int | None = None, client: PickledClient | None = None):
        self.pid = pid
        self.client = client

    def __reduce__(self):
        return _nothing, ()

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def _for_child_process(self):
        default = _current_client()
        client = self.client
        if default is not None and not _is_embedded(default):
            client = PickledClient.of(default)
        return Sender, (os.getpid(), client)

    def resolve(self, name: str) -> Client | None:
        """The client a fit of estimator ``name`` trains on in this process, which has no client of
        its own: the sender's default client (logged), or None (the embedded cluster: said once)."""
        if self.pid is None or self.pid == os.getpid():
            return None
        if self.client is not None:
            client = self.client.client()
            logger.info(
                "%s.fit in process %d, with client=None and no Dask client here, trains on the scheduler at %s: "
                "the default client of the process that sent it (pid %d)", name, os.getpid(), self.client.address, self.pid,
            )
            return client
        if "embedded" not in _WARNED:
            _WARNED.add("embedded")
            logger.warning(
                "%s.fit in process %d (sent by process %d, which has no default Dask client) starts an embedded "
                "cluster of this process: each joblib worker process starts its own. To train a parallel search "
                "on one cluster, create a distributed.Client before it (the fits in joblib's processes find it), "
                "pass client=, or use joblib's 'threading' backend.", name, os.getpid(), self.pid,
            )
        return None


def pickled(client):
    """What ``__getstate__`` keeps of an estimator's ``client`` parameter."""
    if client is None or isinstance(client, PickledClient):
        return client
    if isinstance(client, Client):
        return PickledClient.of(client)
    return client  # something else (checked when used): pickled as it is


def unpickled(client):
    """What ``__setstate__`` makes of a pickled ``client``: this process's own client when it was
    pickled here, else the :class:`PickledClient` (connected when used)."""
    if isinstance(client, PickledClient):
        return client.known() or client
    return client


def resolve(client):
    """The ``distributed.Client`` an estimator's ``client`` parameter names (None stays None)."""
    return client.client() if isinstance(client, PickledClient) else client


@contextlib.contextmanager
def in_use(client: Client | None, keep=lambda: False):
    """Hold ``client`` for one estimator call; a client this process made for unpickled estimators
    is closed when the last call holding it ends, unless ``keep()`` (the estimator keeps a backend
    open on it for its next call)."""
    with _LOCK:  # by identity: nothing of a client this process did not make is touched
        address = next((a for a, made in _CONNECTED.items() if made is client), None)
        made = address is not None
        if made:
            _USES[address] = _USES.get(address, 0) + 1
    try:
        yield client
    finally:
        if made:
            with _LOCK:
                _USES[address] -= 1
                close = _USES[address] == 0 and _CONNECTED.get(address) is client and not keep()
                if close:
                    del _CONNECTED[address], _USES[address]
            if close:
                with contextlib.suppress(Exception):
                    client.close(timeout=2)


def _nothing():
    return None


def _current_client() -> Client | None:
    """This process's current (``as_current``) or default client, or None; connects to nothing."""
    try:
        client = Client.current(allow_global=True)
    except ValueError:
        return None
    return client if client.status == "running" else None


def _worker():
    """The Dask worker this code runs in (a task), or None."""
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        return None


def _address(client) -> str | None:
    """The scheduler address of a client or worker."""
    scheduler = getattr(client, "scheduler", None)
    return getattr(scheduler, "address", None)


def _is_embedded(client: Client) -> bool:
    """Whether ``client`` is connected to this process's embedded cluster, whose credentials stay here."""
    from .embedded import embedded_cluster

    cluster = embedded_cluster()
    return cluster is not None and _address(client) == cluster.scheduler_address


def _client_side(security):
    """What of ``security`` a client connects with (no scheduler's or worker's key), or None."""
    if not isinstance(security, Security):
        return None
    if not hasattr(security, "require_encryption"):
        # A subclass with connection arguments of its own, which skips Security's fields: dask-gateway's
        # GatewaySecurity holds only the credentials a client of its cluster connects with.
        return security
    fields = {k: getattr(security, k, None) for k in _CLIENT_FIELDS}
    fields = {k: v for k, v in fields.items() if v is not None}
    return Security(require_encryption=security.require_encryption, extra_conn_args=dict(security.extra_conn_args or {}),
                    **fields)


def _without_secrets(security):
    """``security`` unless it holds credentials in memory (PEM text rather than file paths)."""
    if security is None:
        return None
    if any("-----BEGIN" in str(getattr(security, k, None) or "") for k in _CREDENTIALS):
        return None
    return security


def _register_for_child_processes() -> None:
    """Reduce :class:`PickledClient` and :class:`Sender` with their credentials and their sender in
    the pickles made for child processes: joblib's loky and ``multiprocessing``'s ForkingPickler."""
    reducers = {PickledClient: PickledClient._for_child_process, Sender: Sender._for_child_process}
    for cls, reduce in reducers.items():
        multiprocessing.reduction.ForkingPickler.register(cls, reduce)
    for module in ("joblib.externals.loky.backend.reduction", "loky.backend.reduction"):
        try:
            reduction = __import__(module, fromlist=["register"])
        except ImportError:
            continue
        for cls, reduce in reducers.items():
            reduction.register(cls, reduce)


def _close_connected() -> None:
    with _LOCK:
        made = list(_CONNECTED.values())
        _CONNECTED.clear()
    for client in made:
        with contextlib.suppress(Exception):
            client.close(timeout=2)


def _after_fork_in_child() -> None:
    """A forked child's copies of the parent's clients are not connections of its own."""
    global _LOCK, _KNOWN
    _INHERITED.extend(_CONNECTED.values())
    _CONNECTED.clear()
    _KNOWN = weakref.WeakValueDictionary()
    _LOCK = threading.Lock()
    _WARNED.clear()


_register_for_child_processes()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_connected)
