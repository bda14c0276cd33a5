"""Nonnegative least squares on grouped rows: the simulator's calibration
(:func:`adadamp.simulate.calibrate`) and the Goodput damper's throughput model
(:class:`adadamp.dampers.Goodput`) fit their timing terms with it."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def grouped_fit(y: NDArray[np.float64], x: NDArray[np.float64], method: str) -> NDArray[np.float64]:
    """Fit ``y ~ x @ coef`` (x has an intercept column) with ``coef >= 0``.

    Rows are grouped by identical ``x``; each group is summarised by its mean
    ("mean": identical to ordinary least squares on the raw rows) or median
    ("median": robust to stragglers), then fitted by least squares weighted by
    group size.  A negative coefficient is set to zero and the rest refitted.

    Examples
    --------
    Three updates at one setting (one a straggler) and one at another: the medians 3 and 7 fit
    ``1 + 2 x``.

    >>> x = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 3.0]])
    >>> grouped_fit(np.array([3.0, 3.0, 100.0, 7.0]), x, "median").round(6).tolist()
    [1.0, 2.0]
    """
    rows, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    center = np.array([(np.mean if method == "mean" else np.median)(y[inverse == g]) for g in range(len(rows))])
    w = np.sqrt(counts.astype(np.float64))
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(rows[:, active] * w[:, None], center * w, rcond=None)
        if np.all(sol >= 0):
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef
