"""The embedded cluster authenticates its comms (docs/guide/security.rst): a local process without
the credentials the training process made cannot connect to its scheduler, nannies or workers, so
it cannot run code as the training user; the fast paths (channels, shared memory, the all-reduce
backend) stay on, and the dashboard stays readable on loopback.  Its size is bounded by the
machine before any process starts."""

import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import dask
import numpy as np
import pytest
import torch
from torch import nn

from adadamp import DaskClassifier
from adadamp.cluster import embedded_cluster

# Run by a separate Python process, as another local user would: every way in that needs no key.
ATTACK = textwrap.dedent(
    """
    import socket, ssl, sys, tempfile
    from distributed import Client, Security

    marker = sys.argv[1]

    def plant():
        open(marker, "w").write("ran")

    outcomes = []
    for address in sys.argv[2:]:
        host, port = address.split("://")[1].rsplit(":", 1)
        tries = {
            "plain Client": lambda: Client(address.replace("tls://", "tcp://"), timeout=3),
            "own certificate": lambda: Client(address, timeout=3, security=Security.temporary()),
        }
        for name, connect in tries.items():
            try:
                client = connect()
                client.run_on_scheduler(plant)
                client.run(plant)
                outcomes.append(f"{address} {name}: RAN CODE")
            except Exception as err:
                outcomes.append(f"{address} {name}: refused ({type(err).__name__})")
        # A raw TLS handshake that checks nothing of the server, without and with a self-made certificate.
        own = Security.temporary()
        folder = tempfile.mkdtemp()
        open(folder + "/c.pem", "w").write(own.tls_client_cert)
        open(folder + "/k.pem", "w").write(own.tls_client_key)
        for name, chain in (("raw TLS, no certificate", None), ("raw TLS, own certificate", folder)):
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            if chain:
                context.load_cert_chain(chain + "/c.pem", chain + "/k.pem")
            try:
                with socket.create_connection((host, int(port)), timeout=3) as sock:
                    with context.wrap_socket(sock) as tls:
                        tls.sendall(b"\\0" * 16)
                        got = tls.recv(16)
                outcomes.append(f"{address} {name}: " + ("ACCEPTED" if got else "refused (closed)"))
            except (OSError, ssl.SSLError) as err:
                outcomes.append(f"{address} {name}: refused ({type(err).__name__})")
    print("\\n".join(outcomes))
    """
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def forward(self, x):
        return self.layer(x)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(512, 8)).astype("float32")
    return X, (X[:, 0] > 0).astype("int64")


PARAMS = {"module": Net, "batch_size": 32, "max_epochs": 2, "min_workers": 2, "max_workers": 2, "random_state": 0}


@pytest.mark.parametrize("backend", ["parameter-server", "allreduce"])
def test_the_embedded_cluster_keeps_its_fast_paths_on_tls(data, backend):
    est = DaskClassifier(backend=backend, **PARAMS).fit(*data)
    cluster = embedded_cluster()
    assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
    updates = [u for row in est.history_ for u in row["updates"]]
    assert all(u["n_workers"] == 2 for u in updates)
    assert all(u["sent_bytes"] > 0 for u in updates)  # the per-fit channels carried every round
    with urllib.request.urlopen(cluster.dashboard_link.replace("/status", "/adadamp"), timeout=10) as page:
        assert page.status == 200 and cluster.dashboard_link.startswith("http://127.0.0.1:")


def test_no_other_process_can_run_code_through_the_embedded_cluster(data, tmp_path):
    DaskClassifier(**PARAMS).fit(*data)
    info = embedded_cluster().scheduler_info
    addresses = [embedded_cluster().scheduler_address, *info["workers"]]
    addresses += [w["nanny"] for w in info["workers"].values() if w.get("nanny")]
    assert len(addresses) == 5 and all(a.startswith("tls://") for a in addresses)
    marker = tmp_path / "ran"
    script = tmp_path / "attack.py"
    script.write_text(ATTACK)
    out = subprocess.run([sys.executable, str(script), str(marker), *addresses],
                         check=True, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    outcomes = out.stdout.splitlines()
    assert len(outcomes) == 4 * len(addresses), out.stdout + out.stderr
    assert all(": refused" in line for line in outcomes), out.stdout
    assert not marker.exists()
    DaskClassifier(**PARAMS).fit(*data)  # the cluster serves its own fits as before


@pytest.mark.parametrize(("params", "match"), [
    ({"min_workers": 10**6, "max_workers": 10**6}, r"min_workers=1000000 .* more worker processes than this machine"),
    ({"min_workers": 9, "max_workers": 9}, r"adadamp\.embedded-cluster\.max-workers"),
])
def test_an_embedded_cluster_larger_than_the_machine_is_refused_before_any_process(data, params, match):
    before = embedded_cluster()
    with dask.config.set({"adadamp.embedded-cluster.max-workers": 8}), pytest.raises(ValueError, match=match):
        DaskClassifier(**{**PARAMS, **params}).fit(*data)
    assert embedded_cluster() is before  # nothing started


def test_max_workers_above_the_machine_is_capped_with_a_warning(data):
    bound = 4 * os.cpu_count()
    with pytest.warns(UserWarning, match=rf"max_workers=1000000 is capped at {bound}"):
        est = DaskClassifier(**{**PARAMS, "min_workers": 1, "max_workers": 10**6, "max_epochs": 1}).fit(*data)
    assert est.history_[-1]["n_workers"] == 1  # a batch of 32 wants one worker
    assert len(embedded_cluster().scheduler_info["workers"]) <= bound


def test_a_bad_bound_is_named(data):
    with dask.config.set({"adadamp.embedded-cluster.max-workers": "many"}), \
            pytest.raises(ValueError, match=r"adadamp\.embedded-cluster\.max-workers='many'"):
        DaskClassifier(**PARAMS).fit(*data)


def test_a_fit_with_a_client_is_not_bounded_by_the_machine(client, data):
    # the user's cluster decides what it may start; the bound is the embedded cluster's
    with dask.config.set({"adadamp.embedded-cluster.max-workers": 1}):
        est = DaskClassifier(**{**PARAMS, "max_workers": 3, "min_workers": 2}).fit(*data)
    assert est.history_[-1]["n_workers"] == 2
    assert torch.isfinite(torch.tensor(est.history_[-1]["train_loss"]))


# ------------------------------------------------------------------------------ review 3
# Run by the training process with another user's squat of Dask's fixed scratch folder in its
# temporary folder; every process of the cluster (its workers inherit PYTHONPATH) records the
# certificate and key files it opens through an audit hook.
FIT_IN_A_SQUATTED_TMPDIR = textwrap.dedent(
    """
    import json, os, sys, urllib.request
    import numpy as np
    import torch

    if __name__ == "__main__":
        from distributed import Client
        from adadamp import DaskClassifier, close_embedded_cluster
        from adadamp.cluster import embedded_cluster

        X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        est = DaskClassifier(module=torch.nn.Linear, module__in_features=4, module__out_features=2,
                             max_epochs=1, min_workers=2, max_workers=2, checkpoint=sys.argv[1])
        est.fit(X, (X[:, 0] > 0).astype("int64"))
        cluster = embedded_cluster()
        with Client(cluster, set_as_default=False) as client:
            on_workers = client.run(lambda dask_worker: dask_worker.local_directory).values()
            client.run(lambda: open(os.path.join(os.path.dirname(sys.argv[1]), "probe.pem"), "w").close())  # seen?
        folders = [cluster.scheduler.local_directory, *on_workers]
        base = cluster.dashboard_link.replace("/status", "")
        served = {}
        for route in sys.argv[2:]:
            try:
                with urllib.request.urlopen(base + route, timeout=10) as answer:
                    served[route] = answer.read().decode(errors="replace")
            except OSError as err:
                served[route] = getattr(err, "code", str(err))
        close_embedded_cluster()
        print(json.dumps({"folders": folders, "served": served, "left": [f for f in folders if os.path.exists(f)]}))
    """
)
AUDIT = textwrap.dedent(
    """
    import os, sys

    def _opened(event, args):
        if event == "open" and isinstance(args[0], str) and args[0].endswith((".pem", ".crt")):
            with open(os.environ["ADADAMP_TEST_OPENED"], "a") as log:
                log.write(args[0] + "\\n")

    sys.addaudithook(_opened)
    """
)
NOT_SERVED = ["/info/main/logs.html", "/info/call-stacks/main.html", "/info/main/workers.html", "/json/identity.json",
              "/metrics", "/proxy/8787/127.0.0.1/status"]


@pytest.fixture(scope="module")
def squatted(tmp_path_factory):
    """One embedded cluster started where another user created ``dask-scratch-space`` as a plain file."""
    import json
    folder = tmp_path_factory.mktemp("review3")
    (folder / "tmp").mkdir()
    (folder / "tmp" / "dask-scratch-space").write_text("another user's file")
    (folder / "site").mkdir()
    (folder / "site" / "sitecustomize.py").write_text(AUDIT)
    (folder / "fit.py").write_text(FIT_IN_A_SQUATTED_TMPDIR)
    opened = folder / "opened.log"
    env = {**os.environ, "TMPDIR": str(folder / "tmp"), "ADADAMP_TEST_OPENED": str(opened),
           "PYTHONPATH": os.pathsep.join([str(folder / "site"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(folder / "fit.py"), str(folder / "secret-path.ckpt"), "/adadamp/data.json",
                          "/health", *NOT_SERVED], check=False, capture_output=True, text=True, timeout=240,
                         cwd=folder, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["opened"] = opened.read_text().split() if opened.exists() else []
    result["tmp"] = folder / "tmp"
    return result


def test_a_squatted_scratch_folder_neither_stops_the_cluster_nor_receives_its_data(squatted):
    """Dask's fixed ``$TMPDIR/dask-scratch-space`` created as a file by another user made every embedded
    fit fail; as her folder, it took the workers' spilled data and was on their ``sys.path``."""
    assert len(squatted["folders"]) == 3  # the scheduler and two workers
    for folder in squatted["folders"]:
        private = next(p for p in Path(folder).parents if p.name.startswith("adadamp-cluster-"))
        assert private.parent == squatted["tmp"]
    assert squatted["left"] == []  # removed when the cluster closed
    assert (squatted["tmp"] / "dask-scratch-space").read_text() == "another user's file"


def test_the_embedded_clusters_key_is_never_written_to_a_file(squatted):
    """Dask writes in-memory credentials to ``dask.pem``/``dask.crt`` in a temporary folder for each SSL
    context (12 per start); here ``ssl`` reads them from memory files only (``ssl`` opens them in C, which
    no audit hook sees: the hook sees Dask's writes, and the probe files the workers open to show it runs)."""
    probe = str(squatted["tmp"].parent / "probe.pem")
    assert squatted["opened"] == [probe, probe], squatted["opened"]  # the workers' probe files, nothing else


def test_the_embedded_dashboard_serves_the_page_and_not_the_clusters_internals(squatted):
    served = squatted["served"]
    assert served["/health"] == "ok"
    assert all(served[route] == 404 for route in NOT_SERVED), {r: str(served[r])[:80] for r in NOT_SERVED}
    assert "secret-path" not in served["/adadamp/data.json"] and '"checkpoint"' in served["/adadamp/data.json"]
