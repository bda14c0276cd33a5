"""Shared fixtures: one real LocalCluster of worker processes for the session."""

import logging

import pytest
import torch
from distributed import Client, LocalCluster

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def cluster():
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def session_client(cluster):
    with Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def client(session_client):
    """The shared client, made current so estimators with client=None use it."""
    with session_client.as_current():
        yield session_client
