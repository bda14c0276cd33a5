"use strict";
(() => {
const json = id => JSON.parse(document.getElementById(id).textContent);
const {dataUrl, fit} = json("settings-json");
Bokeh.embed.embed_item(json("plots-json"), "plots");
function cells(table, rows) {  // text only: what fits published is never parsed as HTML
  document.getElementById(table).replaceChildren(...rows.map(([k, v]) => {
    const row = document.createElement("tr"), th = document.createElement("th"), td = document.createElement("td");
    th.textContent = k;
    td.id = table + "-" + k;
    td.textContent = v === null || v === undefined ? "" : v;
    row.append(th, td);
    return row;
  }));
}
function fmt(v, digits) { return (typeof v === "number") ? Number(v.toPrecision(digits)) : v; }
const blanks = column => Array.isArray(column) ? column.map(v => v === null ? NaN : v) : column;
const SERIES = ["updates", "epochs", "lost"];
async function plot(doc) {  // each series' columns, a value never reported (null) as NaN: a gap, not a 0
  const fetched = await Promise.all(SERIES.map(async what =>
    (await fetch(dataUrl + "?what=" + what + "&fit=" + encodeURIComponent(fit))).json()));
  SERIES.forEach((what, i) => {  // all at once, once all arrived: the plots never show one poll's updates with another's
    doc.get_model_by_name(what).data = Object.fromEntries(Object.entries(fetched[i]).map(([k, v]) => [k, blanks(v)]));
  });
}
const select = document.getElementById("fits");
select.addEventListener("change", () => { window.location.search = "?fit=" + encodeURIComponent(select.value); });
async function refresh() {
  try {
    const r = await (await fetch(dataUrl + "?what=summary&fit=" + encodeURIComponent(fit))).json();
    if (!r.fit) return;
    document.getElementById("name").textContent = r.name + " (fit " + r.fit + ")";
    document.getElementById("state").textContent = r.progress.state;
    select.replaceChildren(...r.fits.map(f => new Option(
      f.name + " " + new Date(f.time * 1000).toLocaleTimeString(), f.fit, false, f.fit === r.fit)));
    const p = r.progress;
    cells("progress", [["epoch", p.epoch + (p.epochs ? " / " + p.epochs : "")], ["updates", p.updates],
      ["examples_seen", p.examples_seen], ["train_loss", fmt(p.train_loss, 6)], ["valid_loss", fmt(p.valid_loss, 6)],
      ["batch_size", p.batch_size], ["workers", p.workers], ["elapsed_s", fmt(p.elapsed_s, 3)],
      ["time_left_s", fmt(p.eta_s, 3)]]);
    cells("params", Object.entries(r.params));
    const run = r.run, n = run.counts;  // the run of fits this one is in (a search's, as far as they started)
    cells("run", [["fits_in_this_run", run.fits.length], ["finished", n.finished], ["running", n.running],
      ["waiting_for_workers", n["waiting for workers"]], ["failed", n.failed],
      ["run_time_left_s", fmt(run.eta_s, 3)]]);
    const doc = window.Bokeh && Bokeh.documents[0];
    if (doc) await plot(doc);
    const src = doc && doc.get_model_by_name("updates");
    if (src) document.getElementById("plotted").textContent =
      "points plotted: " + (src.data.update ? src.data.update.length : 0);
  } catch (err) { document.getElementById("state").textContent = "(no data: " + err + ")"; }
}
refresh(); setInterval(refresh, 1000);
})();
