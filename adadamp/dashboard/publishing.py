"""What a fit publishes for its live training page, as Dask events (``Client.log_event``).

Its parameters when it starts, its update records in batches (at most every half second, less
often as a long fit goes on, so a fit stays within the scheduler's event log) and each epoch's row.
The scheduler keeps them; the page (:mod:`.server`) reads them there.  Publishing needs nothing on
the scheduler: with no page installed, no Bokeh or no dashboard the fit runs the same, and a
publication that fails is dropped, never raised.
"""

from __future__ import annotations

import logging
import os
import time
import uuid

from .server import TOPIC, UPDATE_FIELDS, overview_line, serve

logger = logging.getLogger(__name__)


class Publisher:
    """Publishes one fit's progress to the scheduler of ``client`` (see the module docstring).

    ``loop``: the fit's clock (:class:`~adadamp.dampers.clock.LoopState`), read after each update
    to tell a data epoch's ragged last batch from a change of the schedule (``batch_schedule``).
    """

    def __init__(self, client, name: str, params: dict, n_data: int, epochs: int, loop=None):
        self.client = client
        self.loop = loop
        self._schedule = None  # the schedule's latest batch size
        self.fit = uuid.uuid4().hex[:12]
        self.topic = f"{TOPIC}/{self.fit}"
        self.start = time.time()
        self._pending: list[dict] = []
        self._last_flush = time.monotonic()
        self._broken = self._ended = False
        page = serve(client)
        #: This fit's page (``http://.../adadamp?fit=ID``), or None where the scheduler serves none.
        self.url = None if page is None else f"{page}?fit={self.fit}"
        self._send(TOPIC, {"kind": "start", "fit": self.fit, "name": name, "params": params, "n_data": n_data,
                           "epochs": epochs, "time": self.start})

    def _send(self, topic: str, msg: dict) -> None:
        if self._broken:
            return
        try:
            self.client.log_event(topic, msg)
        except Exception as err:  # noqa: BLE001 -- monitoring never stops a fit
            self._broken = True
            logger.info("not publishing training progress to the dashboard (%r)", err)

    def update(self, n_update: int, record: dict) -> None:
        record = {**record, **_shares(record)}
        row = {k: _number(record[k]) for k in UPDATE_FIELDS if k in record}
        row.update(update=n_update, time=time.time() - self.start, batch_schedule=self._scheduled(row.get("batch_size")))
        self._pending.append(row)
        # every half second at first; a long fit less often (at most ~1000 batches per fit)
        every = max(0.5, (time.time() - self.start) / 1000)
        if time.monotonic() - self._last_flush >= every:
            self.flush()

    def _scheduled(self, size):
        """The schedule's batch size at this update: a batch that ended a data epoch (the sampler back
        at position 0) holds the examples left, fewer than the schedule asked for, and is published
        with the size before it, so that the page draws no dip at every epoch's end."""
        ended = getattr(self.loop, "position", None) == 0
        if not isinstance(size, int | float) or isinstance(size, bool):
            return size
        if not (ended and self._schedule is not None and size < self._schedule):
            self._schedule = size
        return self._schedule

    def flush(self) -> None:
        if self._pending:
            self._send(self.topic, {"kind": "updates", "rows": self._pending})
            self._pending = []
        self._last_flush = time.monotonic()

    def epoch(self, row: dict, eta: float | None) -> None:
        """Publish an epoch's ``row``; ``eta``: the fit's seconds left at the epoch's end (None: unknown)."""
        self.flush()
        fields = {k: _number(v) for k, v in row.items() if k != "updates" and _plain(_number(v))}
        self._send(self.topic, {"kind": "epoch", "row": fields, "eta": None if eta is None else float(eta),
                                "time": time.time() - self.start})

    def training(self) -> None:
        """The fit has its workers: the page shows it running (before: waiting for workers)."""
        self._send(self.topic, {"kind": "training", "time": time.time() - self.start})

    def end(self, error: str | None = None) -> None:
        """The fit ended (``error``: how it failed); once: a second call publishes nothing."""
        if self._ended:
            return
        self._ended = True
        self.flush()
        self._send(self.topic, {"kind": "end", "error": error, "time": time.time() - self.start})

    def overview(self) -> str | None:
        """The run of fits this one belongs to, in a line (:func:`~.server.overview_line`: a search's
        fits done, running and waiting), or None where the scheduler cannot tell."""
        if self._broken:
            return None
        try:
            return self.client.run_on_scheduler(overview_line, fit=self.fit)
        except Exception as err:  # noqa: BLE001 -- monitoring never stops a fit
            logger.info("no overview of the fits on this cluster (%r)", err)
            return None


def _shares(record: dict) -> dict:
    """The page's numbers of an update's shares: the smallest and largest worker's examples (the
    workers computing any) and the count of stragglers."""
    out = {}
    shares = [n for n in record.get("shares") or () if n]
    if shares:
        out.update(share_min=min(shares), share_max=max(shares))
    if "stragglers" in record:
        out["stragglers"] = len(record["stragglers"])
    return out


def _number(value):
    """NumPy scalars as Python numbers (events travel as msgpack)."""
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else value


def _plain(value) -> bool:
    return isinstance(value, int | float | str | bool) or value is None


def opener(name: str, params: dict, state):
    """What the fit loop calls to open a fit's page, ``page(client, last_epoch)``: a :class:`Publisher`
    of estimator ``name`` with ``params`` (:func:`short_params`), training ``state`` (a
    :class:`~adadamp.records.TrainingState`)."""
    shown = short_params(params)
    return lambda client, last: Publisher(client, name, shown, state.loop.n_data, last, loop=state.loop)


def short_params(params: dict) -> dict:
    """An estimator's parameters as short strings for the page (classes by name).  Every local user
    may read the page: a file path (``checkpoint``, a logger's folder) shows as its last part only."""
    out = {}
    for key, value in sorted(params.items()):
        if key == "client":
            continue
        if key == "checkpoint" and value is not None:
            out[key] = "on"
            continue
        if isinstance(value, os.PathLike) or isinstance(value, str) and os.sep in value:
            value = os.path.basename(os.fspath(value).rstrip(os.sep))
        text = getattr(value, "__name__", None) or repr(value)
        out[key] = text if len(text) <= 60 else text[:57] + "..."
    return out


