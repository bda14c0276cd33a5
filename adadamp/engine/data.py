"""The training data a fit places on its workers, behind one small interface.

A data source knows how many examples it has and hands out the rows of a block for placing on
a worker.  In-memory arrays are the one source today; the data-in-Dask issue adds dask
collections (blocks made on the workers) and lazy torch Datasets behind the same calls.
"""

from __future__ import annotations

import numpy as np


class ArrayData:
    """NumPy ``X, y`` held by the client: a block is sent from here when it is placed (again).

    Examples
    --------
    >>> data = ArrayData(np.arange(10.0).reshape(5, 2), np.arange(5))
    >>> index, X, y = data.rows(range(3, 5))
    >>> index.tolist(), y.tolist(), len(data)
    ([3, 4], [3, 4], 5)
    """

    def __init__(self, X: np.ndarray, y: np.ndarray):
        self.X = X
        self.y = y

    def __len__(self) -> int:
        return len(self.X)

    def rows(self, rows: range) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The example indices, inputs and targets of ``rows``."""
        part = slice(rows.start, rows.stop)
        return np.arange(rows.start, rows.stop), self.X[part], self.y[part]
