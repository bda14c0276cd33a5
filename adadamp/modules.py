"""Small default modules."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """A multi-layer perceptron, the default ``module`` of the estimators.

    Inputs of any shape ``(n, ...)`` are flattened to ``(n, n_features)``.

    Parameters
    ----------
    n_features : int
        Input features per example (after flattening).
    n_outputs : int
        Output units: classes for a classifier, targets for a regressor.
    hidden : sequence of int
        Sizes of the hidden layers.

    Examples
    --------
    >>> import torch
    >>> MLP(n_features=4, n_outputs=3, hidden=(8,))(torch.zeros(2, 4)).shape
    torch.Size([2, 3])
    """

    def __init__(self, n_features: int, n_outputs: int, hidden: Sequence[int] = (100,)):
        super().__init__()
        sizes = [n_features, *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], n_outputs))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
