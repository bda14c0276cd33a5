"""What ``fit``, ``predict`` and ``score`` accept besides NumPy arrays: tensors, dask collections and
map-style torch Datasets, turned into arrays on the client."""

from __future__ import annotations

import numpy as np
import torch


def as_numpy(X):
    """A torch tensor or a dask collection as a NumPy array (other inputs unchanged)."""
    if isinstance(X, torch.Tensor):
        return X.detach().cpu().numpy()
    if isinstance(X, torch.utils.data.Dataset):
        raise TypeError("A torch Dataset goes to fit as X with y=None; see BaseDaskEstimator.fit.")
    try:
        import dask

        if dask.is_dask_collection(X):
            return np.asarray(X.compute())
    except ImportError:  # pragma: no cover
        pass
    return X


def from_dataset(dataset, y):
    """Materialise a map-style torch Dataset of ``(x, y)`` pairs (placed on the workers once)."""
    if y is not None:
        raise ValueError("With a torch Dataset as X, y must be None: the Dataset yields (x, y) pairs.")
    pairs = [dataset[i] for i in range(len(dataset))]
    X = np.stack([np.asarray(p[0]) for p in pairs])
    y = np.asarray([np.asarray(p[1]) for p in pairs])
    return X, y


def scoring_data(X, y):
    """``score`` takes arrays, or a map-style torch Dataset of ``(x, y)`` pairs with y=None (as fit)."""
    if isinstance(X, torch.utils.data.DataLoader):
        raise TypeError(
            "score takes arrays or a map-style torch Dataset, not a DataLoader: pass score(loader.dataset) "
            "(the original adadamp's score(X, y) also took a Dataset)."
        )
    if isinstance(X, torch.utils.data.Dataset):
        return from_dataset(X, y)
    return X, y
