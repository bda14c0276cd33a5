"""Per-example weights in the loss (``fit(X, y, sample_weight=w)``), as scikit-learn's estimators take them.

The weights travel with the targets: each target row gains its example's weight as a last
float64 column (:func:`pack`), so every data source, transport and backend carries them with no
change, and :class:`SampleWeightedLoss` (the criterion the workers run) splits them off again.
The trained loss is the weighted mean ``sum_i w_i l_i / sum_i w_i`` over the batch, which for
``w = 1`` is the criterion's own mean (class weights and ``ignore_index`` included: their
per-example normalizers are multiplied by ``w_i``, as in torch's weighted mean).

The weights are rescaled to mean 1 over the training data.  The weighted mean is unchanged by
that, and the gradient sums stay per example: AdaScale's statistics (Johnson et al. 2020)
then estimate the variance of ``w_i g_i``, the per-example gradient of the
weighted objective ``(1/n) sum_i w_i l_i``.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
from torch import nn


def check_sample_weight(sample_weight, n: int) -> np.ndarray | None:
    """``sample_weight`` as float64 weights of mean 1 (None stays None); bad values are named.

    Examples
    --------
    >>> check_sample_weight([1, 3], 2).tolist()
    [0.5, 1.5]
    >>> check_sample_weight(2.0, 3).tolist()
    [1.0, 1.0, 1.0]
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, numbers.Number):
        sample_weight = np.full(n, float(sample_weight))
    if isinstance(sample_weight, torch.Tensor):
        sample_weight = sample_weight.detach().cpu().numpy()
    try:
        w = np.asarray(sample_weight, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"sample_weight must be numbers, one per example: {err}") from err
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(f"sample_weight.shape == {w.shape}, expected ({n},): one weight per example of X.")
    return normalized(w, finite=bool(np.isfinite(w).all()), negative=bool((w < 0).any()), total=float(w.sum()))


def normalized(w, *, finite: bool, negative: bool, total: float):
    """``w`` (NumPy or dask) divided by its mean, after the checks' results are looked at."""
    if not finite:
        raise ValueError("sample_weight contains NaN or infinity.")
    if negative:
        raise ValueError("sample_weight must be non-negative.")
    if not total > 0:
        raise ValueError("sample_weight: every weight is zero; at least one example needs a positive weight.")
    return w * (w.shape[0] / total)


def pack(y, w):
    """Targets ``y`` (NumPy or dask, 1-D or 2-D) with the weights ``w`` as a last float64 column."""
    if isinstance(y, np.ndarray):
        return np.column_stack([y.reshape(len(y), -1).astype(np.float64), w])
    import dask.array as da

    y2 = y.reshape(y.shape[0], -1) if y.ndim == 1 else y
    packed = da.concatenate([y2.astype(np.float64), w.rechunk((y.chunks[0],))[:, None]], axis=1)
    return packed.rechunk({1: -1})  # one block per partition, as the engine places them


class SampleWeightedLoss(nn.Module):
    """A criterion whose targets carry their examples' weights in a last column (:func:`pack`).

    ``forward`` is the weighted mean loss; the workers call :meth:`sum_and_weight`, whose ratio it is
    (gradients are sums, divided once by the batch's total weight).

    Parameters
    ----------
    criterion : torch.nn.Module
        The user's criterion, called with ``reduction="none"``.
    target_dtype : torch.dtype
        The targets' dtype (int64 labels, float32 values).
    target_ndim : int
        1 for one target per example, 2 for a row of them.
    """

    def __init__(self, criterion: nn.Module, target_dtype: torch.dtype, target_ndim: int):
        super().__init__()
        self.criterion = criterion
        self.target_dtype = target_dtype
        self.target_ndim = target_ndim

    def unpack(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The targets as the criterion takes them, and the weights."""
        target = packed[:, :-1].to(self.target_dtype)
        return (target[:, 0] if self.target_ndim == 1 else target), packed[:, -1]

    def sum_and_weight(self, out: torch.Tensor, packed: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``sum_i w_i l_i`` and ``sum_i w_i c_i``, ``c_i`` the criterion's own normalizer of example
        ``i``: 1, or for a class-weighted or ``ignore_index`` mean its target's class weight (0 if
        ignored), summed over the example's elements when the loss has several per example."""
        y, w = self.unpack(packed)
        crit = self.criterion
        original = getattr(crit, "reduction", "mean")
        crit.reduction = "none"
        try:
            losses = crit(out, y)
        finally:
            crit.reduction = original
        w = w.to(losses.dtype)
        per_example = losses.reshape(len(losses), -1)
        if original != "mean":  # a summed criterion stays a sum, normalized by the examples
            return (w * per_example.sum(1)).sum(), float(len(losses))
        ignore = getattr(crit, "ignore_index", None)
        if ignore is None or y.is_floating_point():
            return (w * per_example.mean(1)).sum(), float(w.sum())
        class_weight = getattr(crit, "weight", None)
        c = torch.ones_like(y, dtype=losses.dtype) if class_weight is None else class_weight.to(losses.dtype)[y.clamp(min=0)]
        c = (c * (y != ignore)).reshape(len(losses), -1).sum(1)
        return (w * per_example.sum(1)).sum(), float((w * c).sum())

    def forward(self, out: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        total, weight = self.sum_and_weight(out, packed)
        return total / weight
