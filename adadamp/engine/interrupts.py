"""Ctrl-C and SIGTERM during a fit: a request to stop at the next update's end, not a crash.

A batch scheduler sends SIGTERM before it ends a job, a user presses Ctrl-C; left to the default
handlers, either kills the fit mid-update (or, where dask-jobqueue's runner installed
``signal(SIGINT, sys.exit)``, exits with status 0).  While a fit trains in the main thread, the first of them is noted here and
the fit loop stops at the end of the update running (keeping the weights, writing the checkpoint,
releasing the workers, raising :class:`~adadamp.exceptions.FitInterrupted`); a second Ctrl-C
stops at once.  The handlers that were there before come back when the fit ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading

from ..exceptions import FitInterrupted

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_REQUEUE: list[int] = []  # the signals of the auto_requeue blocks running: they stop a fit too


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

    stops = (*SIGNALS, *_REQUEUE)
    previous = {s: signal.getsignal(s) for s in stops}
    for s in stops:
        signal.signal(s, note)
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def auto_requeue(signum: int = signal.SIGUSR1, command: tuple[str, ...] = ("scontrol", "requeue")):
    """Requeue this SLURM job when ``signum`` says its time is nearly up, after the fit inside stopped.

    In a batch job submitted with ``--requeue --signal=B:USR1@90`` (the script ``exec``-ing Python,
    which then receives the batch shell's signal), a fit with ``checkpoint=`` inside this block
    stops at the end of its update when SIGUSR1 comes, writes its checkpoint and gives its workers
    back (:class:`~adadamp.FitInterrupted`, re-raised); then ``scontrol requeue $SLURM_JOB_ID`` puts
    the job back in the queue, and when it starts again the same script resumes the fit from the
    checkpoint, ending with the weights of a fit never stopped.  A signal that comes outside a fit
    requeues at the block's end.  Outside a SLURM job nothing is requeued (logged).  SIGTERM and
    Ctrl-C stop the fit without requeueing (``scancel`` sends SIGTERM).

    Examples
    --------
    >>> from adadamp import auto_requeue
    >>> with auto_requeue():  # doctest: +SKIP
    ...     est.fit(X, y)  # est = DaskClassifier(checkpoint="fit.ckpt", ...)
    """
    asked = threading.Event()

    def note(s, frame):
        asked.set()
        logger.warning("%s: this job will be requeued at the end of the block", signal.Signals(s).name)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signum, note) if main else None
    _REQUEUE.append(signum)
    try:
        yield
    except FitInterrupted as stop:
        if stop.signal == signum:
            _requeue(command)
        raise
    else:
        if asked.is_set():
            _requeue(command)
    finally:
        _REQUEUE.remove(signum)
        if main:
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)


def _requeue(command: tuple[str, ...]) -> None:
    job = os.environ.get("SLURM_JOB_ID")
    if job is None:
        logger.warning("not in a SLURM job (no SLURM_JOB_ID): nothing to requeue")
        return
    done = subprocess.run([*command, job], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(command)} {job}` failed ({done.stderr.strip()[:300]}): submit the job with "
                           "`sbatch --requeue`, where the cluster allows requeueing.")
    logger.warning("requeued SLURM job %s: it resumes from its checkpoint when it starts again", job)
