"""A backend kept open between an estimator's calls on the same data (``partial_fit`` loops).

Opening a backend sets the module up on every worker and places the data; a model-selection or
streaming loop that calls ``partial_fit`` again and again on the same data would pay that every
call.  After a ``partial_fit`` call that succeeded, the estimator keeps its backend suspended (workers,
their data and the channels stay; the module gets its own storage back) together with a key:
the client, the cluster policy, the device and the data's token.  The next warm call with the
same key resumes it; anything else, a failed call, ``KEEP_SECONDS`` without a call, or the
estimator being garbage-collected closes it.  ``fit`` keeps nothing: its memory on the workers
is released when it returns.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref

logger = logging.getLogger(__name__)

#: Seconds a suspended backend is kept without a call (well under the workers' idle timeout).
KEEP_SECONDS = 600.0


class KeptBackend:
    """A suspended backend and the key of the calls that may resume it.

    Closed after ``KEEP_SECONDS`` without a call (a timer), when its owner (the estimator) is
    garbage-collected, at interpreter exit, or by :meth:`claim` for a call that cannot resume it.
    """

    def __init__(self, owner, backend, key: tuple):
        self.backend = backend
        self.key = key
        self._lock = threading.Lock()
        self._claimed = False
        self._finalizer = weakref.finalize(owner, _close, backend)
        self._timer = threading.Timer(KEEP_SECONDS, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
        logger.info("released the workers and data kept since the last call (%.0f s without a call)", KEEP_SECONDS)
        self._finalizer()

    def claim(self, key: tuple | None):
        """The backend if a call with ``key`` may resume it (it is then the caller's); else close it
        and return None."""
        self._timer.cancel()
        with self._lock:
            if self._claimed:  # expired meanwhile: closed already
                return None
            self._claimed = True
        if key is not None and key == self.key and getattr(key[0], "status", None) == "running":
            self._finalizer.detach()
            return self.backend
        self._finalizer()
        return None


def _close(backend) -> None:
    with contextlib.suppress(Exception):  # the client or the cluster may be gone already
        backend.__exit__(None, None, None)
