"""The data sources a fit places on its workers: moved to :mod:`adadamp.data.sources` (the data
layer makes them); these names stay for the modules that import them here."""

from ..data.sources import ArrayData, DaskArrayData, DatasetData, DataSource

__all__ = ["ArrayData", "DaskArrayData", "DataSource", "DatasetData"]
