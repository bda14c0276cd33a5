"""What the experiments share: the digits split, the classifier and a LocalCluster."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import time
from pathlib import Path

import torch
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from adadamp import DaskClassifier


def digits_split():
    """Scikit-learn's digits (1,797 8x8 images), scaled to [0, 1], 75/25 stratified split."""
    X, y = load_digits(return_X_y=True)
    return train_test_split(X / 16.0, y, test_size=0.25, random_state=0, stratify=y)


def digits_classifier(damper, lr: float, seed: int, client, **params) -> DaskClassifier:
    """MLP 64-128-10 trained with SGD, momentum 0.9, on the given batch-size schedule."""
    return DaskClassifier(
        module__hidden=(128,),
        optimizer=torch.optim.SGD,
        optimizer__lr=lr,
        optimizer__momentum=0.9,
        batch_size=damper,
        random_state=seed,
        client=client,
        **params,
    )


@contextlib.contextmanager
def local_client(n_workers: int = 2):
    """A LocalCluster of ``n_workers`` single-threaded worker processes and its client."""
    with (
        LocalCluster(
            n_workers=n_workers, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def scale_to(client, n_workers: int, timeout: float = 120.0) -> None:
    """Grow or shrink the client's LocalCluster to exactly ``n_workers`` running workers and wait for it."""
    client.cluster.scale(n_workers)
    deadline = time.monotonic() + timeout
    while True:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        statuses = [w.get("status", "running") for w in workers]
        if len(statuses) == n_workers and all(s == "running" for s in statuses):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster did not reach {n_workers} running workers in {timeout:.0f} s: {statuses}")
        time.sleep(0.1)


def library_commit() -> str:
    """The checkout's commit (short hash), recorded with the results; "unknown" outside git."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def timed_run(fn, n_workers: int) -> dict:
    """``fn(client)`` on a fresh :func:`local_client`; its result with the seconds and the commit added."""
    start, commit = time.perf_counter(), library_commit()
    with local_client(n_workers=n_workers) as client:
        result = fn(client)
    result["seconds"] = time.perf_counter() - start
    result["commit"] = commit
    return result


def write_results(out: Path, name: str, result: dict, report: str) -> str:
    """Write ``name.md`` (the report and, for a timed run, its time and commit) and ``name.json``."""
    if "seconds" in result:
        report += f"\nFull run: {result['seconds'] / 60:.1f} min on this machine (commit {result.get('commit')}).\n"
    (out / f"{name}.md").write_text(report)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return report
