"""Where any input becomes a data source for fitting or predicting.

* :mod:`.convert`: user inputs (NumPy, pandas, torch, dask, torch Datasets) as arrays, dask
  arrays or a Dataset, each check and its message written once;
* :mod:`.targets`: ``y`` as the criterion takes it, class labels (:class:`Labels`) or values
  (:class:`Values`);
* :mod:`.sources`: the data sources a fit places on its workers, each saying what the workers need;
* :mod:`.placement`: the blocks and shards the sources are cut into;
* :mod:`.prepare`: :func:`make_source`, the one call a fit makes.

This layer sits below the engine: it imports the worker and wire layers, never the engine or
the estimators.
"""

from .prepare import FitData, make_source
from .sources import ArrayData, DaskArrayData, DatasetData, DataSource
from .targets import Labels, Targets, Values

__all__ = [
    "ArrayData", "DaskArrayData", "DataSource", "DatasetData", "FitData", "Labels", "Targets", "Values", "make_source",
]
