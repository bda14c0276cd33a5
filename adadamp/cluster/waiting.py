"""Why a fit has no workers (or fewer than its batch wants): the words of its waiting line and of
:class:`~adadamp.exceptions.NoWorkersError`.

A fit may wait because it asks for nothing (``scale_cluster=False``), because nobody sizes the
cluster for the wants its fits declare (no :func:`~adadamp.cluster.adapt` runs where the cluster
was made: a fit in joblib's processes or on a Dask worker holds no cluster object to scale), or
because the workers asked for are jobs still pending in a batch queue (a dask-jobqueue cluster in
this process: its job ids, and SLURM's reason from ``squeue``).
"""

from __future__ import annotations

import shutil
import subprocess

#: Seconds since an adaptive last asked the allocator for the cluster's target after which nobody
#: is taken to size the cluster (an ``AllocatorAdaptive`` asks every ``interval``, 0.5 s by default).
ADAPTED_WITHIN = 10.0
SQUEUE_TIMEOUT = 5.0


def pending_jobs(cluster, live_names: set[str]) -> list[str]:
    """The jobs of a dask-jobqueue ``cluster`` (in this process) whose workers have not joined, as
    ``"<job id> (<state>: <reason>)"`` where ``squeue`` tells, else ``"<job id>"``; [] for other clusters."""
    workers = getattr(cluster, "workers", None)
    if not isinstance(workers, dict):
        return []
    ids = []
    for name, job in workers.items():
        job_id = getattr(job, "job_id", None)
        joined = any(n == str(name) or n.startswith(f"{name}-") for n in live_names)
        if job_id and not joined:
            ids.append(str(job_id))
    known = _squeue(ids)  # a job that runs without its worker is starting it, or retiring: not pending
    return [_described(i, known) for i in ids if i not in known or known[i].startswith(("PENDING", "CONFIGURING"))]


def _squeue(ids: list[str]) -> dict[str, str]:
    """SLURM's state and reason of each job in ``ids`` (empty where there is no ``squeue`` or it fails)."""
    if not ids or shutil.which("squeue") is None:
        return {}
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%r", "-j", ",".join(ids)], capture_output=True,
                             text=True, timeout=SQUEUE_TIMEOUT, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            found[parts[0]] = f"{parts[1]}: {parts[2]}"
    return found


def _described(job_id: str, reasons: dict[str, str]) -> str:
    return f"{job_id} ({reasons[job_id]})" if job_id in reasons else job_id


def why(client, scale: bool, adapted_ago: float | None, live_names: set[str]) -> str:
    """One sentence per reason the fit lacks workers, or "" where none is known.

    Examples
    --------
    >>> print(why(None, scale=False, adapted_ago=None, live_names=set()))
    scale_cluster is off: the fit asks the cluster for no workers (start some, or pass scale_cluster=True with a cluster that can scale).
    """
    cluster = getattr(client, "cluster", None)
    said = []
    if not scale:
        said.append("scale_cluster is off: the fit asks the cluster for no workers (start some, or pass "
                    "scale_cluster=True with a cluster that can scale).")
    elif adapted_ago is None or adapted_ago > ADAPTED_WITHIN:
        where = ("this process holds no cluster object to scale (joblib's processes and Dask workers do not): "
                 if cluster is None else "")
        said.append(f"Nobody sizes the cluster for the fits' wants: {where}call adadamp.cluster.adapt(cluster, "
                    "maximum=N) in the process that made the cluster.")
    pending = pending_jobs(cluster, live_names)
    if pending:
        said.append(f"Jobs asked for are pending in the queue: {', '.join(pending[:8])}"
                    + (f" and {len(pending) - 8} more." if len(pending) > 8 else "."))
    return " ".join(said)
