"""adadamp: train PyTorch models on a Dask cluster and grow the batch size while training."""

from . import dampers
from .dampers import (
    AdaDamp,
    AdaScale,
    BaseDamper,
    CntsDampLR,
    Constant,
    DynamicSGD,
    GeoDamp,
    GeoDampLR,
    GradientDescent,
    PadaDamp,
    RadaDamp,
)
from .estimators import DaskBaseDamper, DaskClassifier, DaskRegressor
from .exceptions import ConvergenceError, NoWorkersError
from .modules import MLP

__version__ = "0.1.0"

__all__ = [
    "MLP",
    "AdaDamp",
    "AdaScale",
    "BaseDamper",
    "CntsDampLR",
    "Constant",
    "ConvergenceError",
    "DaskBaseDamper",
    "DaskClassifier",
    "DaskRegressor",
    "DynamicSGD",
    "GeoDamp",
    "GeoDampLR",
    "GradientDescent",
    "NoWorkersError",
    "PadaDamp",
    "RadaDamp",
    "dampers",
]
