"""What a lost or unreachable worker raises, on the client's side of any call to it.

The engine recomputes a lost worker's share elsewhere, and a data source reports the workers it
lost while placing blocks; both tell a lost worker from a failed call by this tuple.
"""

from __future__ import annotations

import asyncio

from distributed.comm.core import CommClosedError

#: What a lost or unreachable worker raises; its share of an update is recomputed elsewhere.
LOST = (OSError, CommClosedError, asyncio.TimeoutError, TimeoutError, EOFError)
