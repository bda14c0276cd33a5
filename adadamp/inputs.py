"""What ``fit``, ``predict`` and ``score`` accept besides NumPy arrays: moved to
:mod:`adadamp.data.convert` (and :func:`~adadamp.data.targets.encode_labels`); these names stay."""

from .data.convert import (
    MAX_PARTITIONS,
    aligned,
    as_dask_array,
    as_numpy,
    dask_arrays,
    dask_features,
    dask_frame_types,
    dataset_arrays,
    engine_blocks,
    from_dataset,
    is_dask,
    scoring_data,
)
from .data.targets import encode_labels

__all__ = [
    "MAX_PARTITIONS", "aligned", "as_dask_array", "as_numpy", "dask_arrays", "dask_features", "dask_frame_types",
    "dataset_arrays", "encode_labels", "engine_blocks", "from_dataset", "is_dask", "scoring_data",
]
