"""Idle workers retire without an ERROR (issue 65, item 2): the cluster grows for a fit's grant,
the grant ends, and adadamp's adaptive retires the idle workers; twenty times, with no line at
ERROR and no traceback from the scheduler, the nannies or the workers.

Dask's ``Adaptive.scale_down`` both has the scheduler close the retired workers and has the
cluster close their nannies: two closes of one worker at once.  A nanny whose worker process
exited during the cluster's close logged ``ERROR`` with a ``CancelledError`` (and every retired
process was killed after the nanny's 4 s wait).  The scheduler, the nannies and the workers of a
LocalCluster all print to the stderr of the process that started it, so the script runs in a
process of its own and the whole of its stderr is read.
"""

import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = r'''
import logging
import multiprocessing
import sys
import time

import dask
from distributed import Client, LocalCluster

from adadamp.cluster import adapt
from adadamp.cluster.adaptive import ensure_allocator
from adadamp.cluster.grant import Grant
from adadamp.worker.plugin import TrainerPlugin


def n_workers(client):
    return len(client.scheduler_info()["workers"])


if __name__ == "__main__":
    rounds, grow = int(sys.argv[1]), int(sys.argv[2])
    # new workers fork from a server that imported torch, Dask and adadamp once (as the suite's do)
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    multiprocessing.get_context("forkserver").set_forkserver_preload(["distributed", "torch", "adadamp.worker.plugin"])
    start = time.monotonic()
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.WARNING) as cluster, \
            Client(cluster) as client:
        client.register_plugin(TrainerPlugin(), name="adadamp-trainer")  # as a fit leaves it
        ensure_allocator(client)
        adapt(cluster, minimum=1, maximum=grow, idle=0.1)
        retired = 0
        for k in range(rounds):
            grant = Grant(client, f"grow-{k}", (1, grow), scaled=True)
            grant.declare(grow, grow)  # a fit wants them: the adaptive asks the cluster for them
            client.wait_for_workers(grow, timeout=120)
            grant.release()  # the fit ended: they retire once idle
            deadline = time.monotonic() + 60
            while n_workers(client) > 1:
                assert time.monotonic() < deadline, f"round {k}: {n_workers(client)} workers left after 60 s"
                time.sleep(0.05)
            retired += grow - 1
        while len(cluster.workers) > 1:  # every retired nanny closed before the cluster closes
            assert time.monotonic() < deadline + 60, list(cluster.workers)
            time.sleep(0.05)
    print(f"retired {retired} workers in {time.monotonic() - start:.1f} s", file=sys.stderr)
'''


#: Left (issue 65 item 2 stays open for them), two races inside Dask while a worker closes:
#: the scheduler tells it that it closes gracefully on a batched stream that the nanny's close can
#: overtake (seen once in 48 retirements), and its last heartbeat can meet the scheduler's closed
#: connection (logged with its traceback; seen once under the load of other tests).
KNOWN = ("Invalid Worker.status transition: Status.closing -> Status.closing_gracefully",
         "Failed to communicate with scheduler during heartbeat")
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # a log record's first line


def _alarms(err: str) -> list[str]:
    """The log records at ERROR or CRITICAL, and the tracebacks, that are not one of the races of
    :data:`KNOWN` (a record's traceback is its continuation lines)."""
    records, out = [], []
    for line in err.splitlines():
        if _RECORD.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    for record in records:
        text = "\n".join(record)
        alarming = any(level in record[0] for level in ("ERROR", "CRITICAL")) or "Traceback" in text
        if alarming and not any(k in record[0] for k in KNOWN):
            out.append(text)
    return out


@pytest.mark.timeout(400)
def test_idle_workers_retire_twenty_times_without_an_error(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run = subprocess.run([sys.executable, str(script), "10", "3"], check=False, capture_output=True, text=True,
                         timeout=380, cwd=str(tmp_path))
    err = run.stderr
    assert run.returncode == 0, err[-4000:]
    assert "retired 20 workers" in err, err[-4000:]
    assert not _alarms(err), err[-6000:]
    assert "still alive after" not in err, err[-4000:]  # each retired process exits, none is killed
    assert "CancelledError" not in err, err[-4000:]  # the nanny's ERROR when two closes met (4 in 20 before)


def test_the_alarms_leave_out_the_known_races_and_nothing_else():
    known = ("2026-12-07 18:00:00,000 - distributed.worker - ERROR - Failed to communicate with scheduler during "
             "heartbeat.\nTraceback (most recent call last):\n  ...\nCommClosedError: in <TCP (closed)>")
    other = "2026-12-07 18:00:01,000 - distributed.nanny - ERROR - Exception\nTraceback (most recent call last):\n  x"
    bare = "Traceback (most recent call last):\n  File x\nValueError: y"
    warn = "2026-12-07 18:00:02,000 - distributed.nanny - WARNING - Restarting worker"
    assert _alarms(f"{known}\n{warn}") == []
    assert _alarms(f"{known}\n{other}\n{warn}") == [other]
    assert _alarms(bare) == [bare]
