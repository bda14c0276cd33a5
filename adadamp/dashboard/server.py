"""The live training page on the Dask dashboard (``/adadamp``), served by the scheduler.

The page is three HTTP routes on the dashboard's own server (the page, its JSON, and its script,
style sheet and Bokeh's JavaScript: :data:`routes`), added through Dask's documented extension
point, the config key ``distributed.scheduler.http.routes`` (the embedded cluster lists
``"adadamp.dashboard"`` there), or, on a scheduler started without it, by a scheduler plugin that
a client registers once (:func:`serve`).  Its plots are Bokeh figures, as Dask's pages, that poll
the fit's JSON once a second; the page's HTML, script and style sheet are the files in
``static/``.  The page embeds what fits published (:mod:`.publishing`) as text only: a fit id is
checked against ``FIT_ID``, JSON in the page's data blocks has ``<``, ``>`` and ``&`` escaped, and
the tables are built with ``textContent``; every response sends a :data:`CSP` that runs no inline
script, and ``X-Content-Type-Options: nosniff``.  The JSON reads each field of the events on its
own (:func:`fit_data`): an odd event (a batch size that is None, a string, NaN) is a blank on the
page, never an error.
"""

from __future__ import annotations

import functools
import html
import json
import logging
import math
import re
from pathlib import Path

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.http.utils import RequestHandler, get_handlers
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine
from tornado.web import HTTPError

from ..cluster import policy as cl

logger = logging.getLogger(__name__)

#: The event topic that lists the fits; each fit publishes its records under ``TOPIC + "/" + id``.
TOPIC = "adadamp"
UPDATE_FIELDS = ("batch_size", "lr", "n_workers", "loss", "compute_time", "comm_time", "step_time", "update_time",
                 "share_min", "share_max", "stragglers", "lost",
                 "noise_scale", "efficiency", "predicted_throughput", "decay")  # the last four: Goodput's reasons
#: The columns of the page's ``updates`` series.
UPDATE_COLUMNS = ("update", "time", *UPDATE_FIELDS, "batch_schedule")
EPOCH_COLUMNS = ("epoch", "n_updates", "train_loss", "valid_loss")
MAX_POINTS = 2000  # per series sent to the page (longer fits are thinned evenly)
#: What a fit id looks like (``Publisher`` draws 12 hex digits); the page refuses anything else.
FIT_ID = re.compile(r"[0-9a-f]{12}")


def fit_list(scheduler) -> list[dict]:
    """The fits that published to this scheduler, newest first, as the page reads them: a start event
    whose fit id is not one (:data:`FIT_ID`) is left out, and its other fields are checked one by one
    (:func:`_start`), so that an odd event shows as blanks, never as an error."""
    fits = [_start(msg) for _, msg in scheduler.get_events(TOPIC) if isinstance(msg, dict) and msg.get("kind") == "start"]
    return sorted((f for f in fits if f is not None), key=lambda f: f["time"], reverse=True)


def _start(msg: dict) -> dict | None:
    fit = msg.get("fit")
    if not isinstance(fit, str) or not FIT_ID.fullmatch(fit):
        return None
    params = msg.get("params")
    params = {k: _text(v) for k, v in params.items() if isinstance(k, str)} if isinstance(params, dict) else {}
    return {"fit": fit, "name": _text(msg.get("name")) or "", "params": {k: v for k, v in params.items() if v is not None},
            "epochs": _finite(msg.get("epochs")), "time": _finite(msg.get("time")) or 0.0}


def _finite(value) -> int | float | None:
    """``value`` where it is a finite number (not a bool), else None: what a published number becomes
    on the page, whatever an event holds (None, a string, NaN, infinity, a list)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if isinstance(value, int) or math.isfinite(value) else None


def _text(value) -> str | None:
    """``value`` as the page's text: a string, a number written out, else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return None


#: The numbers of an epoch's row the page reads (with the epoch's ``eta`` and ``time``).
EPOCH_FIELDS = ("epoch", "n_updates", "n_samples_seen", "train_loss", "valid_loss", "batch_size")


def _fit_events(scheduler, fit: str) -> tuple[list[dict], list[dict], dict | None, bool]:
    """Fit ``fit``'s published update rows, epoch rows, end (None while it runs), and whether it has
    its workers (it published ``training``), each field read on its own (see :func:`fit_data`)."""
    rows: list[dict] = []
    epochs: list[dict] = []
    end, training = None, False
    for _, msg in scheduler.get_events(f"{TOPIC}/{fit}"):
        kind = msg.get("kind") if isinstance(msg, dict) else None
        training = training or kind in ("training", "updates", "epoch")
        if kind == "updates" and isinstance(msg.get("rows"), list | tuple):  # msgpack: tuples
            rows.extend(row for row in msg["rows"] if isinstance(row, dict))
        elif kind == "epoch" and isinstance(msg.get("row"), dict):
            epochs.append({**{k: _finite(msg["row"].get(k)) for k in EPOCH_FIELDS},
                           "eta": _finite(msg.get("eta")), "time": _finite(msg.get("time"))})
        elif kind == "end":
            error = msg.get("error")
            end = {"error": None if error is None or error == "" else _text(error) or "(no message)",
                   "time": _finite(msg.get("time"))}
    return rows, epochs, end, training


def _state(end: dict | None, training: bool) -> str:
    """``waiting for workers`` (before its backend has them), ``running``, ``finished`` or ``failed: ...``."""
    if end is not None:
        return "failed: " + end["error"] if end["error"] else "finished"
    return "running" if training else "waiting for workers"


def fit_data(scheduler, fit: str) -> dict:
    """Everything the page shows of one fit: its parameters, update and epoch series, progress.  Each
    field of the fit's events is read on its own: one that is not a finite number (None, a string, NaN,
    infinity) or is missing is None (null in the JSON, a blank in the table), and an event or row of
    another shape is skipped.  ``batch_schedule`` is the schedule's batch size (a row published
    without it: its ``batch_size``); ``lost`` lists only the updates that lost workers, so that the
    page marks those and draws nothing where nothing was lost."""
    start = next((f for f in fit_list(scheduler) if f["fit"] == fit), None)
    columns = UPDATE_COLUMNS
    rows, epochs, end, training = _fit_events(scheduler, fit)
    stride = max(1, math.ceil(len(rows) / MAX_POINTS))
    shown = rows[::stride]
    if rows and shown[-1] is not rows[-1]:
        shown.append(rows[-1])
    shown = [{c: _finite(row.get(c)) for c in columns} for row in shown]  # the last update is the last shown
    for row in shown:
        row["batch_schedule"] = _first(row["batch_schedule"], row["batch_size"])
    lost = [(_finite(row.get("update")), _finite(row.get("lost"))) for row in rows]
    lost = [(u, n) for u, n in lost if u is not None and n is not None and n > 0][-MAX_POINTS:]
    now = shown[-1] if shown else dict.fromkeys(columns)
    last = epochs[-1] if epochs else {}
    seen = last.get("n_samples_seen")
    progress = {
        "epoch": len(epochs),
        "epochs": None if start is None else start["epochs"],
        "updates": now["update"] or 0,
        "examples_seen": seen if seen is not None else sum(_finite(row.get("batch_size")) or 0 for row in rows),
        "train_loss": last.get("train_loss"),
        "valid_loss": last.get("valid_loss"),
        "batch_size": _first(now["batch_schedule"], last.get("batch_size")),  # the schedule's, now
        "workers": now["n_workers"],
        "eta_s": None if end is not None else last.get("eta"),
        "state": _state(end, training),
        "elapsed_s": _first(end and end["time"], now["time"], 0.0),
    }
    return {
        "fit": fit,
        "name": None if start is None else start["name"],
        "params": {} if start is None else start["params"],
        "progress": progress,
        "updates": {c: [u[c] for u in shown] for c in columns},
        "epochs": {k: [e[k] for e in epochs] for k in EPOCH_COLUMNS},
        "lost": {"update": [u for u, _ in lost], "lost": [n for _, n in lost]},
    }


def _first(*values):
    """The first of ``values`` that is not None (None where all are)."""
    return next((v for v in values if v is not None), None)


#: Fits that start within this many seconds of the previous ones' end are one run of fits (a search's).
RUN_GAP = 60.0


#: The summaries of fits that ended (they change no more), so that the page's poll reads the events
#: of the running fits only (each scheduler process keeps its own).
_ENDED: dict[str, dict] = {}


def _fit_summary(scheduler, start: dict, now: float) -> dict:
    """One fit of :func:`fits_overview`: its state, epochs, time left now, and when it ended (inf: not yet)."""
    known = _ENDED.get(start["fit"])
    if known is not None and known["time"] == start["time"]:
        return known
    _, epochs, end, training = _fit_events(scheduler, start["fit"])
    last = epochs[-1] if epochs else {}
    eta = last.get("eta")
    if end is None and eta is not None:  # the estimate at the epoch's end, less the time since
        eta = max(0.0, eta - max(0.0, now - start["time"] - (last.get("time") or 0.0)))
    ended = start["time"] + (end["time"] or 0.0) if end is not None else math.inf
    summary = {"fit": start["fit"], "name": start["name"], "time": start["time"], "ended": ended,
               "state": _state(end, training), "epoch": len(epochs), "epochs": start["epochs"],
               "eta_s": None if end is not None else eta}
    if end is not None:
        if len(_ENDED) >= 100_000:
            _ENDED.clear()
        _ENDED[start["fit"]] = summary
    return summary


def fits_overview(scheduler, fit: str | None = None, now: float | None = None) -> dict:
    """The run of fits that ``fit`` (default: the newest) belongs to: the fits published to this
    scheduler that started while an earlier one of them ran or within :data:`RUN_GAP` seconds of its
    end -- a search's fits, whatever process or joblib backend ran them.  Returns each fit's state,
    epoch and time left, the count of each state, and ``eta_s``: the seconds until the last running
    fit ends by their estimates (None when none has one).  The fits a search has not started yet are
    not known to the scheduler, so they are not counted."""
    import time

    now = time.time() if now is None else now
    fits = [_fit_summary(scheduler, start, now) for start in sorted(fit_list(scheduler), key=lambda f: f["time"])]
    runs: list[list[dict]] = []
    for f in fits:
        if not runs or f["time"] > max(g["ended"] for g in runs[-1]) + RUN_GAP:
            runs.append([])
        runs[-1].append(f)
    run = next((r for r in runs if any(f["fit"] == fit for f in r)), runs[-1] if runs else [])
    counts = dict.fromkeys(("finished", "running", "waiting for workers", "failed"), 0)
    for f in run:
        counts[f["state"].split(":")[0]] += 1
    etas = [f["eta_s"] for f in run if f["eta_s"] is not None]
    return {"fits": [{k: v for k, v in f.items() if k != "ended"} for f in reversed(run)], "counts": counts,
            "eta_s": max(etas) if etas else None}


def overview_line(dask_scheduler, fit: str) -> str | None:
    """:func:`fits_overview` in a line, for a fit's ``verbose`` output (run on the scheduler); None
    for a fit alone in its run."""
    o = fits_overview(dask_scheduler, fit)
    if len(o["fits"]) < 2:
        return None
    counts = ", ".join(f"{n} {state}" for state, n in o["counts"].items())
    left = "" if o["eta_s"] is None else f"; the running fits end in about {o['eta_s']:.1f} s"
    return f"fits on this cluster (this run of {len(o['fits'])}): {counts}{left}"


def _json(value) -> str:
    """Strict JSON (what browsers' ``JSON.parse`` takes): NaN, infinity and whatever JSON has no
    value for (bytes, sets, objects) are null, keys are strings."""

    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v if v is None or isinstance(v, str | int | float) else None

    return json.dumps(clean(value), allow_nan=False)


def _script_json(value) -> str:
    """JSON to put inside an HTML ``<script>``: ``<``, ``>`` and ``&`` escaped, so that no string in it
    can close the script (``</script>``) or open a comment."""
    return _json(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


#: The page's Content-Security-Policy, sent with every response of its routes: scripts
#: only from the page's own files (``/adadamp/static/``; none inline, no ``eval``), requests only
#: to the scheduler's server, nothing else loaded (no plugins, frames, fonts, forms).  Two
#: allowances are Bokeh's: inline styles (it styles its plots with ``<style>`` elements it makes,
#: without a nonce; styles run no code) and ``data:`` images (its toolbar's icons).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'")


class _Handler(RequestHandler):
    def set_default_headers(self) -> None:  # tornado sets them again before an error's page
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("X-Content-Type-Options", "nosniff")


class _FitHandler(_Handler):
    def chosen_fit(self, fits: list[dict]) -> str | None:
        """The ``fit`` argument, or the newest fit where there is none; a malformed id is a 400 (it
        never reaches the page), an id no fit published a 404."""
        fit = self.get_argument("fit", "")
        if not fit:
            return fits[0]["fit"] if fits else None
        if not FIT_ID.fullmatch(fit):
            raise HTTPError(400, reason="the 'fit' parameter is not a fit id (12 hex digits)")
        if not any(f["fit"] == fit for f in fits):
            raise HTTPError(404, reason="no fit with this 'fit' id published to this scheduler")
        return fit


class TrainingData(_FitHandler):
    """``/adadamp/data.json?fit=ID&what=updates|epochs|lost|summary``: the page's data (JSON)."""

    def get(self):
        fits = fit_list(self.server)
        fit = self.chosen_fit(fits)
        what = self.get_argument("what", "summary")
        self.set_header("Content-Type", "application/json")
        if fit is None:
            self.write(_json({"fits": [], "fit": None}))
            return
        data = fit_data(self.server, fit)
        series = ("updates", "epochs", "lost")
        if what in series:  # a Bokeh ColumnDataSource's columns, which page.js polls
            self.write(_json(data[what]))
            return
        listed = [{"fit": f["fit"], "name": f["name"], "time": f["time"]} for f in fits]
        run = fits_overview(self.server, fit)
        self.write(_json({"fits": listed, "run": run, **{k: v for k, v in data.items() if k not in series}}))


class TrainingPage(_FitHandler):
    """``/adadamp``: live plots of the newest fit (or ``?fit=ID``), its parameters and progress."""

    def get(self):
        fit = self.chosen_fit(fit_list(self.server)) or ""
        base = self.request.path.rstrip("/")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        try:
            self.write(page_html(base + "/data.json", fit, static=base + "/static/"))
        except ImportError:
            link = html.escape(base + "/data.json")
            self.write("<p>The adadamp training page needs Bokeh on the scheduler: <code>pip install bokeh</code> "
                       f"(its data is at <a href='{link}'>{link}</a>).</p>")


class PageFiles(_Handler):
    """``/adadamp/static/NAME``: the page's script and style sheet and Bokeh's JavaScript, served from
    the scheduler (the page loads nothing else, and nothing from the network)."""

    def get(self, name: str):
        if name not in _FILES:
            raise HTTPError(404, reason="no such file of the adadamp page")
        content_type, body = _FILES[name]
        try:
            body = body()
        except (ImportError, OSError) as err:
            raise HTTPError(404, reason="Bokeh's JavaScript is not installed on the scheduler") from err
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "no-cache")  # revalidated: tornado answers 304 to a matching ETag
        self.write(body)


@functools.cache
def _bokeh_js() -> bytes:
    from bokeh.util.paths import bokehjs_path

    return (bokehjs_path() / "js" / "bokeh.min.js").read_bytes()


#: The routes Dask's scheduler serves when ``"adadamp.dashboard"`` is in ``distributed.scheduler.http.routes``.
routes = [("adadamp", TrainingPage, {}), ("adadamp/data.json", TrainingData, {}),
          ("adadamp/static/([a-z.-]+)", PageFiles, {})]


class PageRoutes(SchedulerPlugin):
    """Adds the page's routes to a running scheduler's HTTP server (one started without the route
    config, e.g. a notebook's ``Client()``), unless it serves them already.  Registered under one
    name and ``idempotent``: a client registers it once (:func:`adadamp.cluster.ensure_plugin`), and
    the scheduler keeps the first of several clients'."""

    name = "adadamp-dashboard"
    idempotent = True

    def start(self, scheduler) -> None:
        app = getattr(scheduler, "http_application", None)
        if app is None:  # a scheduler without an HTTP server
            return
        request = HTTPServerRequest(start_line=RequestStartLine("GET", "/adadamp", "HTTP/1.1"),
                                    headers=HTTPHeaders({"Host": "localhost"}))
        served = app.find_handler(request).handler_class
        if not issubclass(served, TrainingPage):
            app.add_handlers(r".*$", get_handlers(scheduler, [__name__]))


def serve(client) -> str | None:
    """Make ``client``'s scheduler serve the page (:class:`PageRoutes`) and return its address, or None
    (logged) where it cannot: no client, no dashboard, or a scheduler that cannot import adadamp."""
    try:
        link = client.dashboard_link
        if not link:
            return None
        cl.ensure_plugin(client, PageRoutes, PageRoutes.name)  # once per client and scheduler
    except Exception as err:  # noqa: BLE001 -- monitoring never stops a fit
        logger.info("the scheduler does not serve the live training page (%r)", err)
        return None
    return (link[: -len("/status")] if link.endswith("/status") else link.rstrip("/")) + "/adadamp"


def page_html(data_url: str, fit: str, static: str = "static/") -> str:
    """The page: Bokeh figures polling ``data_url`` for ``fit``, and a progress table kept current by
    the page's script.  It runs no inline script (its :data:`CSP` forbids any): the scripts are files
    under ``static`` (:class:`PageFiles`: Bokeh's JavaScript and ``page.js``), and the plots and the
    page's settings are JSON data blocks that ``page.js`` reads and hands to Bokeh.  ``page.js`` also
    polls the plotted series, turning JSON's null (a value a fit never reported, such as Goodput's
    reasons in a GeoDamp fit) into NaN, which Bokeh leaves blank: Bokeh's own ``AjaxDataSource``
    hands null on, which Bokeh draws at 0.  Legends sit above their plots, never over the newest
    data (a legend inside the top right corner covered the end of the loss curve)."""
    from bokeh import __version__ as bokeh_version
    from bokeh.embed import json_item
    from bokeh.layouts import gridplot
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure

    def source(name: str, columns) -> ColumnDataSource:  # filled by page.js (``name`` is the data's ``what``)
        return ColumnDataSource({c: [] for c in columns}, name=name)

    updates, epochs, lost = source("updates", UPDATE_COLUMNS), source("epochs", EPOCH_COLUMNS), source("lost", ("update", "lost"))
    size = {"width": 560, "height": 230, "x_axis_label": "model updates", "tools": "pan,wheel_zoom,box_zoom,reset"}
    loss = figure(title="loss", y_axis_type="log", name="loss", **size)
    loss.line("update", "loss", source=updates, legend_label="batch loss", alpha=0.5)
    loss.scatter("n_updates", "train_loss", source=epochs, legend_label="train loss (epoch)", color="black", size=6)
    loss.scatter("n_updates", "valid_loss", source=epochs, legend_label="valid loss (epoch)", color="red", size=6)
    batch = figure(title="batch size (the schedule's)", name="batch", **size)  # not each epoch's ragged last batch
    batch.step("update", "batch_schedule", source=updates, mode="after", name="batch_schedule")
    lr = figure(title="learning rate", y_axis_type="log", **size)
    lr.step("update", "lr", source=updates, mode="after", color="green")
    workers = figure(title="workers", name="workers", **size)
    workers.step("update", "n_workers", source=updates, mode="after", color="purple", legend_label="workers")
    workers.step("update", "stragglers", source=updates, mode="after", color="red", legend_label="stragglers")
    workers.scatter("update", "lost", source=lost, color="black", marker="x", size=8, legend_label="lost",
                    name="lost_markers")  # only the updates that lost workers
    shares = figure(title="examples per worker (smallest, largest share)", name="shares", **size)
    shares.line("update", "share_min", source=updates, color="red", legend_label="smallest")
    shares.line("update", "share_max", source=updates, color="blue", legend_label="largest")
    times = figure(title="time per update (s)", y_axis_type="log", name="times", **size)
    for field, color in (("update_time", "black"), ("compute_time", "orange"), ("comm_time", "blue"),
                         ("step_time", "green")):
        times.line("update", field, source=updates, legend_label=field.replace("_time", ""), color=color, alpha=0.7)
    noise = figure(title="gradient noise scale (Goodput's reason)", y_axis_type="log", name="noise", **size)
    noise.line("update", "noise_scale", source=updates, color="red")
    efficiency = figure(title="statistical efficiency of the batch, learning-rate decay (Goodput)", name="efficiency",
                        **size)
    efficiency.line("update", "efficiency", source=updates, color="gray", legend_label="efficiency")
    efficiency.line("update", "decay", source=updates, color="purple", legend_label="lr decay")
    for fig in (loss, times, workers, shares, efficiency):  # above the plot: inside, it covered the data
        legend = fig.legend[0]
        fig.center = [r for r in fig.center if r is not legend]
        legend.update(orientation="horizontal", location="top_left", click_policy="hide", padding=2, margin=2,
                      spacing=8, label_text_font_size="11px", glyph_width=14)
        fig.add_layout(legend, "above")
    plots = json_item(gridplot([[loss, times], [batch, lr], [workers, shares], [noise, efficiency]]))
    return (STATIC / "page.html").read_text().format(static=html.escape(static), bokeh_version=html.escape(bokeh_version),
                        plots=_script_json(plots), settings=_script_json({"dataUrl": data_url, "fit": fit}))


STATIC = Path(__file__).with_name("static")


def _static(name: str) -> bytes:
    return (STATIC / name).read_bytes()


#: What :class:`PageFiles` serves: name -> (content type, the bytes' maker).
_FILES = {
    "page.js": ("text/javascript; charset=utf-8", functools.partial(_static, "page.js")),
    "page.css": ("text/css; charset=utf-8", functools.partial(_static, "page.css")),
    "bokeh.min.js": ("text/javascript; charset=utf-8", _bokeh_js),
}
