"""What identifies training data between calls and in a checkpoint, without reading all of it."""

from __future__ import annotations

import hashlib

import numpy as np
from dask.base import tokenize


def data_digest(X, y) -> str:
    """A hash of ``X`` and ``y``: their shapes and types and up to 4096 evenly spaced examples
    (cheap for any size, and different for another data set or another cross-validation fold);
    a dask collection's deterministic token names its data.

    Examples
    --------
    >>> a = np.arange(6.0).reshape(3, 2)
    >>> data_digest(a, np.arange(3)) == data_digest(a.copy(), np.arange(3))
    True
    """
    digest = hashlib.blake2b(digest_size=16)
    for a in (X, y):
        if hasattr(a, "__dask_graph__"):
            digest.update(tokenize(a).encode())
            continue
        a = np.ascontiguousarray(a)
        digest.update(repr((a.shape, a.dtype.str)).encode())
        rows = np.unique(np.linspace(0, len(a) - 1, min(len(a), 4096)).astype(np.int64))
        digest.update(np.ascontiguousarray(a[rows]).tobytes())
    return digest.hexdigest()
