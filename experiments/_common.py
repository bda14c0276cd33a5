"""What the experiments share: the digits split, the classifier and a LocalCluster."""

from __future__ import annotations

import contextlib
import logging

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
def local_client():
    """A LocalCluster of 2 single-threaded worker processes and its client."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        yield client
