"""The scikit-learn face: the estimators (:mod:`.base`), what ``fit`` does (:mod:`.fitting`), what a
fitted estimator answers (:mod:`.predicting`), and what each parameter accepts and where a routed
one goes (:mod:`.parameters`)."""

from .base import BaseDaskEstimator, DaskBaseDamper, DaskClassifier, DaskRegressor

__all__ = ["BaseDaskEstimator", "DaskBaseDamper", "DaskClassifier", "DaskRegressor"]
