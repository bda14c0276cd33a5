"""Ctrl-C and SIGTERM during a fit: a request to stop at the next update's end, not a crash.

A batch scheduler sends SIGTERM before it ends a job, a user presses Ctrl-C; both used to kill the
fit mid-update (or, once dask-jobqueue's runner had installed ``signal(SIGINT, sys.exit)``, to
exit with status 0).  While a fit trains in the main thread, the first of them is noted here and
the fit loop stops at the end of the update running (keeping the weights, writing the checkpoint,
releasing the workers, raising :class:`~adadamp.exceptions.FitInterrupted`); a second Ctrl-C
stops at once.  The handlers that were there before come back when the fit ends.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The signal that asked the running fit to stop (None until one came)."""

    signum: int | None = None

    @property
    def name(self) -> str:
        return "" if self.signum is None else signal.Signals(self.signum).name


@contextlib.contextmanager
def stop_on_signals():
    """A :class:`StopRequest` that SIGINT and SIGTERM set while the block runs (in the main thread;
    elsewhere signals cannot be handled, and the request stays empty)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def note(signum, frame):
        if request.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: at once
        request.signum = signum
        logger.warning("%s: the fit stops at the end of this update (Ctrl-C again to stop at once)", request.name)

    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, note)
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
