"""dask-gateway-server's configuration for the test suite (read by ``tests/system/gateway/start.sh``).

Clusters run as local processes of the user running the gateway (``UnsafeLocalBackend``: no
per-user accounts, for tests only), with a scheduler and single-threaded workers started by the
Python that runs the gateway; simple authentication (any user name, no password).  The
environment variables are set by start.sh.
"""

import os
import sys

c = get_config()  # noqa: F821 (traitlets' config loader defines it)

state = os.environ["ADADAMP_GATEWAY_STATE"]
c.DaskGateway.address = "127.0.0.1:0"
c.Proxy.address = f"127.0.0.1:{os.environ['ADADAMP_GATEWAY_PORT']}"
c.DaskGateway.backend_class = "dask_gateway_server.backends.local.UnsafeLocalBackend"
c.DaskGateway.authenticator_class = "dask_gateway_server.auth.SimpleAuthenticator"
c.UnsafeLocalBackend.clusters_directory = os.path.join(state, "clusters")
# Scale-downs and failed workers reach the gateway within this many seconds (default 15).
c.UnsafeLocalBackend.cluster_heartbeat_period = int(os.environ.get("ADADAMP_GATEWAY_HEARTBEAT", "3"))
# distributed >= 2024 has no dask-scheduler/dask-worker scripts: run their modules.
c.ClusterConfig.scheduler_cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
c.ClusterConfig.worker_cmd = [sys.executable, "-m", "distributed.cli.dask_worker"]
c.ClusterConfig.worker_cores = 1
c.ClusterConfig.worker_threads = 1
c.ClusterConfig.worker_memory = os.environ.get("ADADAMP_GATEWAY_WORKER_MEMORY", "1.5 G")
c.ClusterConfig.scheduler_memory = "1 G"
c.ClusterConfig.cluster_max_workers = int(os.environ.get("ADADAMP_GATEWAY_MAX_WORKERS", "4"))
c.ClusterConfig.environment = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
c.DaskGateway.log_level = "INFO"
