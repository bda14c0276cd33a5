"""The blocks and shards of a fit's data: moved to :mod:`adadamp.data.placement` (a data source
builds its placement); this name stays for the modules and tests that import it here."""

from ..data.placement import Placement, plan_moves, shard_of_blocks

__all__ = ["Placement", "plan_moves", "shard_of_blocks"]
