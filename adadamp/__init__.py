"""adadamp: train PyTorch models on a Dask cluster and grow the batch size while training."""

from . import dampers
from .dampers import BaseDamper, Constant
from .estimators import DaskBaseDamper, DaskClassifier, DaskRegressor
from .exceptions import ConvergenceError, NoWorkersError
from .modules import MLP

__version__ = "0.1.0"

__all__ = [
    "MLP",
    "BaseDamper",
    "Constant",
    "ConvergenceError",
    "DaskBaseDamper",
    "DaskClassifier",
    "DaskRegressor",
    "NoWorkersError",
    "dampers",
]
