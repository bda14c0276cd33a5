"""The cluster a fit trains on: how many workers a batch wants and how the cluster is asked for them
(:mod:`.policy`), the allocator that shares one cluster among fits (:mod:`.allocator`, with its
division of workers :mod:`.division`, a fit's :mod:`.grant`, and Dask's ``Adaptive`` sized by it,
:mod:`.adaptive`, or a dask-gateway cluster's :mod:`.gateway`), the process's embedded ``LocalCluster`` (:mod:`.embedded`), and a client that
travels to joblib's processes (:mod:`.pickled_client`)."""

from .adaptive import AllocatorAdaptive, adapt
from .embedded import MemorySecurity, close_embedded_cluster, embedded_cluster
from .pickled_client import PickledClient
from .policy import ClusterPolicy, ensure_plugin, heal, live_workers, register_worker_plugin

__all__ = ["AllocatorAdaptive", "ClusterPolicy", "MemorySecurity", "PickledClient", "adapt", "close_embedded_cluster",
           "embedded_cluster", "ensure_plugin", "heal", "live_workers", "register_worker_plugin"]
