"""The live training page on the Dask dashboard (issue 18, item 1): fits publish their progress as
Dask events, the scheduler's HTTP server serves ``/adadamp`` and its JSON, and a real headless
Chromium renders it with the numbers of ``history_``."""

import configparser
import json
import logging
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import dask
import numpy as np
import psutil
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits

from adadamp import DaskClassifier, dashboard
from adadamp.callbacks import Callback
from adadamp.dampers import GeoDamp
from adadamp.dashboard import server


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return (X / 16).astype(np.float32), y


def _page(cluster) -> str:
    return cluster.dashboard_link.replace("/status", "/adadamp")


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _geodamp_fit(digits):
    X, y = digits
    return DaskClassifier(batch_size=GeoDamp, batch_size__initial=32, batch_size__delay=1, batch_size__factor=2,
                          max_epochs=3, validation_fraction=0.1, random_state=0).fit(X, y)


def test_the_page_data_is_the_fits_history(client, cluster, digits):
    est = _geodamp_fit(digits)
    summary = json.loads(_get(_page(cluster) + "/data.json"))
    assert summary["name"] == "DaskClassifier" and summary["fits"][0]["fit"] == summary["fit"]  # the newest fit
    assert summary["params"]["batch_size"] == "GeoDamp" and summary["params"]["batch_size__factor"] == "2"
    p = summary["progress"]
    assert p["state"] == "finished" and p["epoch"] == 3 and p["epochs"] == 3
    assert p["updates"] == est.loop_.n_updates and p["examples_seen"] == est.history_[-1]["n_samples_seen"]
    assert p["train_loss"] == est.history_[-1]["train_loss"] and p["valid_loss"] == est.history_[-1]["valid_loss"]

    updates = json.loads(_get(_page(cluster) + f"/data.json?fit={summary['fit']}&what=updates"))
    records = [u for row in est.history_ for u in row["updates"]]
    assert updates["update"] == list(range(1, len(records) + 1))
    assert updates["batch_size"] == [u["batch_size"] for u in records]
    assert updates["loss"] == [u["loss"] for u in records]
    assert updates["n_workers"] == [u["n_workers"] for u in records]
    assert updates["share_max"] == [max(u["shares"]) for u in records]  # issue 33: the workers' shares
    assert updates["stragglers"] == [len(u["stragglers"]) for u in records] and updates["lost"] == [0] * len(records)
    epochs = json.loads(_get(_page(cluster) + f"/data.json?fit={summary['fit']}&what=epochs"))
    assert epochs["train_loss"] == [row["train_loss"] for row in est.history_]
    assert epochs["n_updates"] == [row["n_updates"] for row in est.history_]


def test_long_fits_are_thinned_for_the_page(monkeypatch):
    rows = [{"update": k, "time": k / 10, "loss": 1.0 / k} for k in range(1, 5001)]
    monkeypatch.setattr(server, "MAX_POINTS", 1000)

    class Events:  # the scheduler's get_events, with one fit's records in it
        @staticmethod
        def get_events(topic):
            if topic == dashboard.TOPIC:
                return [(0.0, {"kind": "start", "fit": "f", "name": "X", "params": {}, "n_data": 1, "epochs": 1,
                               "time": 0.0})]
            return [(0.0, {"kind": "updates", "rows": rows[:2500]}), (0.0, {"kind": "updates", "rows": rows[2500:]})]

    data = dashboard.fit_data(Events(), "f")
    assert len(data["updates"]["update"]) == 1001 and data["updates"]["update"][-1] == 5000  # the last one kept
    assert data["progress"]["updates"] == 5000 and data["progress"]["state"] == "running"


def test_goodputs_reasons_are_published_with_each_update():
    """The page plots Goodput's noise scale, efficiency and learning-rate decay: the rows it is sent
    carry them (other dampers' records have none, and their rows leave them out)."""
    publisher = dashboard.Publisher(None, "X", {}, n_data=10, epochs=1)
    publisher.update(1, {"loss": 0.5, "batch_size": 4, "noise_scale": 80.0, "efficiency": 0.9, "decay": 0.5})
    publisher.update(2, {"loss": 0.4, "batch_size": 4})
    first, second = publisher._pending
    assert (first["noise_scale"], first["efficiency"], first["decay"]) == (80.0, 0.9, 0.5)
    assert "decay" not in second


def test_publishing_never_stops_a_fit():
    publisher = dashboard.Publisher(None, "X", {}, n_data=10, epochs=1)  # no client: nothing to publish to
    publisher.update(1, {"loss": np.float64(0.5), "batch_size": 4})
    publisher.epoch({"epoch": 1, "train_loss": np.float32(0.5), "updates": []}, eta=np.float64(1.0))
    publisher.end()


def _dump_dom(chromium, url: str, budget_ms: int = 5000) -> str:
    """The page at ``url`` as headless Chromium has it after ``budget_ms`` of virtual time; its console
    (``--enable-logging=stderr``) must show no Content-Security-Policy violation (issue 50)."""
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    violations = [line for line in proc.stderr.splitlines() if "Content Security Policy" in line or "Refused to" in line]
    assert not violations, "\n".join(violations)[:3000]
    return proc.stdout


def test_chromium_renders_the_live_page(client, cluster, digits, chromium):
    est = _geodamp_fit(digits)
    dom = _dump_dom(chromium, _page(cluster), budget_ms=8000)

    def cell(name: str) -> str:
        match = re.search(f'id="progress-{name}"[^>]*>([^<]*)<', dom)
        assert match, f"no {name} on the page:\n{dom[-3000:]}"
        return match.group(1)

    assert cell("epoch") == "3 / 3" and int(cell("updates")) == est.loop_.n_updates
    assert int(cell("examples_seen")) == est.history_[-1]["n_samples_seen"]
    assert float(cell("train_loss")) == pytest.approx(est.history_[-1]["train_loss"], rel=1e-5)
    plotted = re.search(r"points plotted: (\d+)", dom)  # Bokeh loaded and its data source polled the fit
    assert plotted and int(plotted.group(1)) == est.loop_.n_updates
    assert "GeoDamp" in dom and "finished" in dom


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_page_runs_no_script_it_was_given(client, cluster, chromium):
    """Issue 34, item 3: a fit id in the address and a class named like HTML stay text in a real browser."""
    evil = "<img src=x onerror=document.body.dataset.pwned=1>"
    params = dashboard.short_params({"module": type(evil, (), {}), "note": evil})
    publisher = dashboard.Publisher(client, evil, params, n_data=10, epochs=1)
    publisher.update(1, {"loss": 0.5, "batch_size": 10, "n_workers": 1})
    publisher.end()

    dom = _dump_dom(chromium, _page(cluster) + f"?fit={publisher.fit}")
    assert "data-pwned" not in dom, dom[-3000:]
    assert "fit " + publisher.fit in dom  # the page did render this fit, with the name as text
    assert dom.count("&lt;img src=x onerror=document.body.dataset.pwned=1&gt;") >= 3  # title, option, parameters

    injected = "</script><script>document.body.dataset.pwned=2</script>"
    url = _page(cluster) + "?fit=" + urllib.parse.quote(injected)
    assert "data-pwned" not in _dump_dom(chromium, url)
    assert _status(url) == 400


def test_fit_ids_are_checked(client, cluster):
    data = _page(cluster) + "/data.json?fit="
    assert _status(data + urllib.parse.quote('"><b>')) == 400
    assert _status(_page(cluster) + "?fit=0123456789ab") == 404  # well formed, but no such fit
    assert _status(data + "0123456789ab") == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(data + "x")
    assert "fit" in err.value.read().decode()  # the message names the parameter


ODD = [None, "32", "", float("nan"), float("inf"), -float("inf"), True, [1, 2], {"a": 1}]


def _odd_events(fit: str) -> tuple[dict, list]:
    """A fit's start and events as no :class:`~adadamp.dashboard.Publisher` sends them (issue 50,
    item 5): numbers that are None, strings, NaN, infinite, bools or containers, missing fields, rows
    and messages of another shape."""
    start = {"kind": "start", "fit": fit, "name": None, "params": {"a": float("nan"), "b": ["x"], "c": "ok"},
             "epochs": "three", "time": float("nan")}
    rows = [{"update": k, "time": 0.1 * k, "batch_size": v, "loss": v, "lr": v, "n_workers": v}
            for k, v in enumerate(ODD, 1)]
    rows += [{}, {"update": "x", "batch_size": 8}, "not a row", None]
    events = [
        {"kind": "updates", "rows": rows}, {"kind": "updates", "rows": None}, {"kind": "updates"},
        {"kind": "epoch", "row": {"epoch": "1", "n_updates": None, "train_loss": float("nan"), "valid_loss": "x",
                                  "n_samples_seen": float("inf"), "batch_size": [3]}, "eta": float("inf"), "time": "x"},
        {"kind": "epoch", "row": None}, {"kind": "epoch"}, {"kind": None}, {"no kind": 1}, "a string", 7,
        {"kind": "end", "error": 5, "time": None},
    ]
    return start, events


def _strict_json(text: str):
    """``text`` parsed as browsers' ``JSON.parse`` would: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the page's JSON"))


def test_odd_events_are_blanks_in_the_data():
    """Each field of an event is read on its own: what is not a finite number is None (null), and rows
    or messages of another shape are skipped; the JSON stays strict."""
    fit = "0123456789ab"
    start, events = _odd_events(fit)

    class Events:
        @staticmethod
        def get_events(topic):
            if topic == dashboard.TOPIC:
                return [(0.0, {"kind": "start", "fit": "<script>", "time": 9.0}), (0.0, start)]  # a bad id: not listed
            return [(0.0, msg) for msg in events]

    fits = dashboard.fit_list(Events())
    assert fits == [{"fit": fit, "name": "", "params": {"a": "nan", "c": "ok"}, "epochs": None, "time": 0.0}]
    data = _strict_json(server._json(dashboard.fit_data(Events(), fit)))
    updates = data["updates"]
    assert updates["update"] == [*range(1, len(ODD) + 1), None, None]  # the two rows that are dicts kept
    assert updates["batch_size"] == [None] * (len(ODD) + 1) + [8]
    assert updates["loss"] == updates["lr"] == updates["n_workers"] == [None] * (len(ODD) + 2)
    assert data["epochs"] == {"epoch": [None], "n_updates": [None], "train_loss": [None], "valid_loss": [None]}
    p = data["progress"]
    assert p["examples_seen"] == p["batch_size"] == 8 and p["train_loss"] is None
    assert p["epochs"] is None and p["state"] == "failed: 5" and p["elapsed_s"] == 0.0 and p["updates"] == 0


def _headers(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def test_every_response_of_the_page_sends_its_security_headers(client, cluster):
    """Issue 50, item 5: the page, its JSON, its files and its error answers all send the
    Content-Security-Policy (no inline script) and ``X-Content-Type-Options: nosniff``; the page runs
    no inline script, and the files it loads are served from the scheduler with their types."""
    publisher = dashboard.Publisher(client, "X", {}, n_data=10, epochs=1)
    publisher.update(1, {"loss": 0.5, "batch_size": 10, "n_workers": 1})
    publisher.end()
    page = _page(cluster)
    status, _, body = _headers(page + f"?fit={publisher.fit}")
    loaded = re.findall(r'(?:src|href)="([^"]+)"', body.decode())
    assert status == 200 and len(loaded) == 3  # the style sheet, Bokeh's JavaScript, the page's script
    assert not re.search(r"<script(?![^>]*(?:\bsrc=|type=\"application/json\"))", body.decode())  # none inline
    origin = page[: page.index("/adadamp")]
    answers = {
        page + f"?fit={publisher.fit}": (200, "text/html"),
        page + "/data.json": (200, "application/json"),
        page + f"/data.json?fit={publisher.fit}&what=updates": (200, "application/json"),
        page + "/data.json?fit=x": (400, "text/html"),
        page + "?fit=0123456789ab": (404, "text/html"),
        page + "/static/nothing.js": (404, "text/html"),
        **{origin + path: (200, "text/css" if path.endswith(".css") else "text/javascript") for path in loaded},
    }
    for url, (expected, content_type) in answers.items():
        status, headers, body = _headers(url)
        assert (status, headers["Content-Type"].split(";")[0]) == (expected, content_type), url
        assert headers["X-Content-Type-Options"] == "nosniff", url
        csp = {d.split()[0]: d.split()[1:] for d in headers["Content-Security-Policy"].split("; ")}
        assert csp["default-src"] == ["'none'"] and csp["script-src"] == ["'self'"], url
    assert len(_headers(origin + loaded[1])[2]) > 500_000  # Bokeh's JavaScript, whole


def test_odd_events_never_make_the_json_an_error(client, cluster):
    """Issue 50, item 5: a fit whose events hold non-numeric, None, NaN or infinite batch sizes and
    losses, or miss fields, is served (HTTP 200, strict JSON), as is its page."""
    fit = "feedfacecafe"
    start, events = _odd_events(fit)
    client.log_event(dashboard.TOPIC, start)
    for msg in events:
        client.log_event(f"{dashboard.TOPIC}/{fit}", msg)
    data = _page(cluster) + f"/data.json?fit={fit}"
    summary = _strict_json(_get(data))
    assert summary["fit"] == fit and summary["progress"]["state"] == "failed: 5"
    assert fit in [f["fit"] for f in summary["fits"]]
    updates = _strict_json(_get(data + "&what=updates"))
    assert updates["batch_size"] == [None] * (len(ODD) + 1) + [8]
    assert _strict_json(_get(data + "&what=epochs"))["train_loss"] == [None]
    assert _status(_page(cluster) + f"?fit={fit}") == 200
    assert _status(_page(cluster) + "/data.json") == 200  # the newest fit, and the list with this one in it


def _handler_rules(dask_scheduler) -> int:
    return len(dask_scheduler.http_application.default_router.rules)


def test_the_page_is_served_on_a_cluster_started_without_its_route(digits, capsys):
    """Issue 35, item 2: a notebook's ``Client()`` (no route config) serves the page once a fit ran on it,
    its address is printed when the fit starts, and the fit's data stays after the fit."""
    X, y = digits
    routes = [r for r in dask.config.get("distributed.scheduler.http.routes") if r != "adadamp.dashboard"]
    with (
        dask.config.set({"distributed.scheduler.http.routes": routes}),  # Dask's defaults (the session's has it)
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        page = _page(cluster)
        assert _status(page) == 404  # Dask's own server, without adadamp's route
        est = DaskClassifier(client=client, max_epochs=1, verbose=1, random_state=0).fit(X[:300], y[:300])
        printed = re.findall(r"live training page: (\S+)", capsys.readouterr().out)
        assert len(printed) == 1 and printed[0].startswith(page + "?fit=")
        fit = printed[0].rsplit("=", 1)[1]
        summary = json.loads(_get(page + "/data.json?fit=" + fit))
        assert summary["fit"] == fit and summary["progress"]["state"] == "finished"
        assert summary["progress"]["updates"] == est.loop_.n_updates
        assert "<title>adadamp: training</title>" in _get(printed[0])

        rules = client.run_on_scheduler(_handler_rules)
        est.fit(X[:300], y[:300])  # the next fit finds the route there and adds nothing
        assert client.run_on_scheduler(_handler_rules) == rules
        assert len(json.loads(_get(page + "/data.json"))["fits"]) == 2


def test_the_route_is_not_added_twice_where_configured(client, cluster, digits):
    rules = client.run_on_scheduler(_handler_rules)
    assert dashboard.serve(client) == _page(cluster)
    assert client.run_on_scheduler(_handler_rules) == rules


def test_the_embedded_clusters_dashboard_listens_on_loopback(digits, capsys, monkeypatch):
    X, y = digits
    listening = []

    class Sockets(Callback):
        def on_train_begin(self, estimator, **info):
            connections = psutil.Process().net_connections("tcp")
            listening.extend(c.laddr for c in connections if c.status == psutil.CONN_LISTEN)

    from adadamp.engine import loop

    monkeypatch.setattr(loop, "_PAGES", set())  # printed once per page and process: as if the first fit
    DaskClassifier(max_epochs=1, verbose=1, callbacks=[Sockets()], random_state=0).fit(X[:200], y[:200])
    port = int(re.search(r"live training page: http://[^/]+:(\d+)/adadamp", capsys.readouterr().out).group(1))
    assert {a.ip for a in listening if a.port == port} == {"127.0.0.1"}


def test_the_install_brings_bokeh():
    """The README's ``pip install`` serves the page: Bokeh is a core dependency, not only an extra."""
    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    required = [re.split(r"[<>=\[ ]", line.strip())[0] for line in config["options"]["install_requires"].split("\n")]
    assert "bokeh" in required


def test_the_monitoring_guide_says_why_the_task_stream_is_idle():
    """Issue 35: a user watching Dask's task stream sees nothing; the guide says why and where to look."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "monitoring.rst").read_text()
    section = guide[guide.index("Why Dask's task stream stays idle"):]
    section = section[: section.index("\n\n**")]
    assert "bypassing" in section and "scheduler" in section and "/adadamp" in section
    assert "live training page: http://127.0.0.1:PORT/adadamp" in guide  # what a fit prints


class _Events:
    """A client that keeps the events a :class:`~adadamp.dashboard.Publisher` logs, and a scheduler's
    ``get_events`` over them (no dashboard: the publisher has no page to print)."""

    dashboard_link = None

    def __init__(self):
        self.logged: dict[str, list] = {}

    def log_event(self, topic, msg):
        self.logged.setdefault(topic, []).append((0.0, msg))

    def get_events(self, topic):
        return self.logged.get(topic, [])


def _ragged_fit(client, lost_at=()):
    """A fit of 67 examples at batch 32 then 64 published as the fit loop does: each epoch's last batch
    holds the examples left (3); the updates in ``lost_at`` lost two workers."""
    from adadamp.dampers.clock import LoopState, Sampler

    loop = LoopState(seed=0, n_data=67)
    sampler = Sampler(loop)
    publisher = dashboard.Publisher(client, "X", {}, n_data=67, epochs=2, loop=loop)
    for size in (32, 64):
        while True:
            n = len(sampler.take(size))
            loop.advance(n)
            lost = 2 if loop.n_updates in lost_at else 0
            publisher.update(loop.n_updates, {"loss": 1.0 / loop.n_updates, "batch_size": n, "n_workers": 2,
                                              "lost": lost})
            if loop.position == 0:
                break
        publisher.epoch({"epoch": loop.data_epoch, "n_updates": loop.n_updates, "batch_size": size}, eta=None)
    publisher.end()
    return publisher


def test_the_page_data_has_the_schedule_and_only_the_lost_updates():
    """Issue 54, item 5: the ragged last batch of each epoch is not a change of the schedule
    (``batch_schedule``), and ``lost`` lists only the updates that lost workers (none: empty)."""
    events = _Events()
    fit = _ragged_fit(events, lost_at=(2,)).fit
    data = _strict_json(server._json(dashboard.fit_data(events, fit)))
    assert data["updates"]["batch_size"] == [32, 32, 3, 64, 3]
    assert data["updates"]["batch_schedule"] == [32, 32, 32, 64, 64]
    assert data["updates"]["lost"] == [0, 2, 0, 0, 0]  # every update's count stays in the updates' columns
    assert data["lost"] == {"update": [2], "lost": [2]}
    assert data["progress"]["batch_size"] == 64  # the table's too, after the ragged batch of 3
    fit = _ragged_fit(events).fit
    assert dashboard.fit_data(events, fit)["lost"] == {"update": [], "lost": []}


class _DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    commands on the browser's fd 3, replies on its fd 4, each JSON message ended by a NUL), so that
    a test reads the page's layout and Bokeh's views where ``--dump-dom`` only gives the HTML."""

    def __init__(self, chromium: str, tmp_path: Path):
        import os

        to_browser, from_browser = os.pipe(), os.pipe()

        def fds():  # in the child: the pipes' ends as fds 3 and 4, whatever their numbers here
            read, write = os.dup(to_browser[0]), os.dup(from_browser[1])
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1400,1400", "about:blank"],
            pass_fds=(3, 4), preexec_fn=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,  # noqa: PLW1509
        )
        os.close(to_browser[0])
        os.close(from_browser[1])
        self._send = os.fdopen(to_browser[1], "wb", buffering=0)
        self._receive = os.fdopen(from_browser[0], "rb", buffering=0)
        self._buffer, self._id = b"", 0

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        self._send.write(json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = self._receive.read(1 << 16)
                assert chunk, f"Chromium closed its DevTools pipe (exit {self.proc.poll()})"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:  # events and other sessions' messages are skipped
                assert "error" not in reply, reply["error"]
                return reply["result"]

    def open(self, url: str) -> str:
        """A new tab at ``url``; returns its session."""
        target = self.call("Target.createTarget", url=url)["targetId"]
        return self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def evaluate(self, session: str, expression: str):
        result = self.call("Runtime.evaluate", session, expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, session: str, expression: str, timeout: float = 60.0):
        """The value of ``expression`` once it is truthy (polled in real time: Bokeh polls every second)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(session, expression)
            if value:
                return value
            time.sleep(0.25)
        pytest.fail(f"the page never had {expression}")

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 -- a browser that does not close is ended
            self.proc.kill()
            self.proc.wait(timeout=30)
        finally:
            self._send.close()
            self._receive.close()


#: What the page's plots show, read from Bokeh's views once fit ``fit``'s ``n`` updates are plotted: each
#: legend's box and its plot's data area (the frame) in page pixels, the batch-size line's screen y
#: and data, and the markers drawn for lost workers.
_LAYOUT_JS = """(() => {
  if (!location.search.includes("fit=%(fit)s")) return null;  // still the page before
  const doc = window.Bokeh && Bokeh.documents[0];
  const updates = doc && doc.get_model_by_name("updates"), marked = doc && doc.get_model_by_name("lost_markers");
  if (!updates || !updates.data.update || updates.data.update.length < %(n)d || !marked.data_source.data.update)
    return null;
  const rect = r => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom});
  const figures = {};
  for (const name of ["loss", "times", "workers", "shares", "efficiency"]) {
    const fig = doc.get_model_by_name(name), view = Bokeh.index.find_one(fig);
    const canvas = view.canvas.el.getBoundingClientRect(), f = view.frame.bbox;
    const legends = [...fig.above, ...fig.below, ...fig.left, ...fig.right, ...fig.center]
      .filter(m => m.constructor.__name__ == "Legend");
    figures[name] = {frame: {left: canvas.left + f.left, top: canvas.top + f.top, right: canvas.left + f.right,
                             bottom: canvas.top + f.bottom},
                     legends: legends.map(m => rect(Bokeh.index.find_one(m).el.getBoundingClientRect()))};
  }
  const loss = Bokeh.index.find_one(doc.get_model_by_name("loss")), canvas = loss.canvas.el.getBoundingClientRect();
  const curve = loss.renderer_views.get(doc.get_model_by_name("loss").renderers[0]).glyph;
  const batch = Bokeh.index.find_one(doc.get_model_by_name("batch_schedule"));
  const markers = Bokeh.index.find_one(doc.get_model_by_name("lost_markers"));
  const efficiency = doc.get_model_by_name("efficiency");
  const unreported = Bokeh.index.find_one(efficiency).renderer_views.get(efficiency.renderers[0]).glyph;
  if (batch.glyph.sx.length != updates.data.update.length
      || markers.glyph.sx.length != markers.model.data_source.get_length()) return null;  // drawn with the data polled last
  return {figures,
          curve: Array.from(curve.sx, (x, i) => [canvas.left + x, canvas.top + curve.sy[i]]),
          batch_sy: Array.from(batch.glyph.sy), batch: Array.from(batch.glyph.y),
          lost_drawn: markers.glyph.sx.length,
          efficiency_drawn: Array.from(unreported.sy).filter(Number.isFinite).length};
})()"""


def _overlap(a: dict, b: dict) -> float:
    width = min(a["right"], b["right"]) - max(a["left"], b["left"])
    height = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
    return max(0.0, width) * max(0.0, height)


def test_chromium_shows_legends_beside_the_data_the_schedule_and_only_lost_updates(client, cluster, digits,
                                                                                   chromium, tmp_path):
    """Issue 54, item 5, in a real browser: the loss legend covered the end of the loss curve (every
    legend sat inside its plot's top right corner), the ragged last batch of each epoch drew a dip in
    the batch size, and "lost" was a dotted line of markers at 0 under every update."""
    est = _geodamp_fit(digits)
    sizes = [u["batch_size"] for row in est.history_ for u in row["updates"]]
    scheduled = [row["updates"][0]["batch_size"] for row in est.history_ for _ in row["updates"]]
    assert sizes != scheduled  # the digits' 1617 training examples end each epoch with a ragged batch
    fit = json.loads(_get(_page(cluster) + "/data.json"))["fit"]  # the newest: this one
    lossy = _ragged_fit(client, lost_at=(2,))
    browser = _DevTools(chromium, tmp_path)
    try:
        page = browser.open(_page(cluster) + f"?fit={fit}")
        seen = browser.wait_for(page, _LAYOUT_JS % {"n": len(sizes), "fit": fit})
        for name, figure in seen["figures"].items():
            assert figure["legends"], f"{name} has no legend"
            for legend in figure["legends"]:
                assert _overlap(legend, figure["frame"]) == 0, (name, legend, figure["frame"])
        last = seen["curve"][int(0.7 * len(seen["curve"])):]  # the last 30% of the batch loss
        box = seen["figures"]["loss"]["legends"][0]
        assert not [p for p in last if box["left"] <= p[0] <= box["right"] and box["top"] <= p[1] <= box["bottom"]]

        assert seen["batch"] == scheduled
        assert all(b <= a for a, b in zip(seen["batch_sy"], seen["batch_sy"][1:], strict=False))  # never down
        assert seen["lost_drawn"] == 0  # nothing lost: nothing drawn
        assert seen["efficiency_drawn"] == 0  # a GeoDamp fit reports no efficiency: a gap, not a line at 0

        browser.call("Page.navigate", page, url=_page(cluster) + f"?fit={lossy.fit}")  # the tab in front draws
        seen = browser.wait_for(page, _LAYOUT_JS % {"n": 5, "fit": lossy.fit})
        assert seen["lost_drawn"] == 1  # one marker, at the one update that lost workers
        assert seen["batch"] == [32, 32, 32, 64, 64]
    finally:
        browser.close()
