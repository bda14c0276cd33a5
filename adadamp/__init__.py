"""adadamp: train PyTorch models on a Dask cluster and grow the batch size while training.

Names are imported lazily (PEP 562), so Dask workers, which only need
``adadamp.worker.plugin``, start without importing scikit-learn.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "BaseDaskEstimator": "estimators",
    "DaskBaseDamper": "estimators",
    "DaskClassifier": "estimators",
    "DaskRegressor": "estimators",
    "ConvergenceError": "exceptions",
    "NoWorkersError": "exceptions",
    "SchedulerLostError": "exceptions",
    "InvalidParameterError": "exceptions",
    "FitInterrupted": "exceptions",
    "StopTraining": "exceptions",
    "MLP": "modules",
    "Callback": "callbacks",
    "Checkpoint": "callbacks",
    "EarlyStopping": "callbacks",
    "LRScheduler": "callbacks",
    "TensorBoard": "callbacks",
    "MLflowLogger": "callbacks",
    "MlflowLogger": "callbacks",  # skorch's spelling
    "ProgressBar": "callbacks",
    "close_embedded_cluster": "cluster",
    "auto_requeue": "engine.interrupts",
    # The dampers a user picks by name; their helpers (TrainState, count_updates, ...) stay in adadamp.dampers.
    **dict.fromkeys(("AdaDamp", "AdaScale", "AdamScale", "BaseDamper", "CntsDampLR", "Constant", "DynamicSGD",
                     "GeoDamp", "GeoDampLR", "Goodput", "GradientDescent", "PadaDamp", "RadaDamp", "Seesaw"), "dampers"),
}
_SUBMODULES = ("callbacks", "checkpoint", "cluster", "dampers", "dashboard", "engine", "estimators", "plot", "simulate")

#: Every name above but skorch's spelling of MLflowLogger, and the submodules with public functions.
__all__ = [name for name in _EXPORTS if name != "MlflowLogger"] + ["dampers", "plot", "simulate"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module 'adadamp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
