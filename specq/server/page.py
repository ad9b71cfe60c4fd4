"""The status page at `/`: every batch of the queue with a progress bar, tokens/s,
tau and acceptance, and the workers alive, refreshed every two seconds from
`GET /v1/specq/status`. Plain HTML and a little JavaScript, no build step.

The page holds no data itself, so it is served without a key; its script reads the
status with the API key, which the user types in once (kept in the tab's
sessionStorage) or passes in the URL's fragment (`/#key=...`; a fragment is never
sent to the server, so it is in no log). Every value is put into the page as text,
never as HTML, and the Content-Security-Policy allows only this server's script.
"""

from __future__ import annotations

CSP = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'"

HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>specq</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  #summary { color: #555; margin-bottom: 16px; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
  th { font-weight: 600; color: #444; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .bar { width: 220px; height: 12px; background: #eee; border-radius: 6px; overflow: hidden; display: inline-block;
         vertical-align: middle; }
  .bar span { display: block; height: 100%; background: #3b7ddd; }
  .bar span.failed { background: #d9534f; }
  .state { font-weight: 600; }
  .state.completed { color: #2e7d32; } .state.paused { color: #b26a00; } .state.damaged,
  .state.stalled, .state.cancelled { color: #c62828; }
  #key { display: none; margin: 12px 0; }
  #error { color: #c62828; }
  code { font-size: 13px; }
</style>
</head>
<body>
<h1>specq</h1>
<div id="summary">loading...</div>
<form id="key"><label>API key <input type="password" id="key-input" autocomplete="off"></label>
<button type="submit">show</button></form>
<div id="error"></div>
<table>
  <thead><tr><th>batch</th><th>state</th><th>progress</th><th class="num">requests</th><th class="num">tokens</th>
  <th class="num">tokens/s</th><th class="num">tau</th><th class="num">acceptance</th><th class="num">time left</th>
  </tr></thead>
  <tbody id="batches"></tbody>
</table>
<script src="/status.js"></script>
</body>
</html>
"""

SCRIPT = r"""
"use strict";
const REFRESH_MS = 2000;
const params = new URLSearchParams(location.hash.slice(1));
if (params.get("key")) {
  sessionStorage.setItem("specq-key", params.get("key"));
  history.replaceState(null, "", location.pathname);  // the key leaves the address bar
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(r).padStart(2, "0")}s` : `${r}s`;
}

function state(b) {
  if (b.damaged) return "damaged";
  if (b.synchronous) return b.counts.running || b.counts.queued ? "serving" : "idle";
  if (b.stalled) return "stalled";
  if (b.flags.includes("cancelled")) return "cancelled";
  if (b.flags.includes("paused")) return "paused";
  if (b.done) return "completed";
  return b.counts.running ? "running" : "queued";
}

function render(data) {
  const workers = data.workers;
  document.getElementById("summary").textContent =
    `${workers.length} worker process${workers.length === 1 ? "" : "es"} alive` +
    (workers.length ? ` (${workers.map(w => `${w.host} pid ${w.pid}, ${w.held} held`).join("; ")})` : "") +
    ` \u00b7 ${data.batches.length} batches \u00b7 updated ${new Date().toLocaleTimeString()}`;
  const body = document.getElementById("batches");
  body.replaceChildren();
  for (const b of data.batches) {
    const row = document.createElement("tr");
    row.dataset.batch = b.batch_id;
    const name = cell(row, b.batch_id);
    if (b.synchronous) name.textContent += " (synchronous)";
    const st = state(b);
    cell(row, st, "state " + st);
    if (b.damaged) {
      cell(row, b.damaged).colSpan = 7;
      body.appendChild(row);
      continue;
    }
    const finished = b.counts.completed + b.counts.failed + b.counts.cancelled;
    const bar = document.createElement("span");
    bar.className = "bar";
    const ok = document.createElement("span");
    ok.style.width = (b.total ? 100 * b.counts.completed / b.total : 100) + "%";
    const bad = document.createElement("span");
    bad.className = "failed";
    bad.style.width = (b.total ? 100 * (b.counts.failed + b.counts.cancelled) / b.total : 0) + "%";
    ok.style.float = bad.style.float = "left";
    bar.append(ok, bad);
    const progress = cell(row, "");
    if (b.synchronous) {
      progress.textContent = `${b.counts.running} decoding, ${b.counts.queued} waiting`;
    } else {
      progress.append(bar, ` ${b.total ? Math.floor(100 * finished / b.total) : 100}%`);
    }
    cell(row, `${finished}/${b.total}` + (b.counts.failed ? ` (${b.counts.failed} failed)` : ""), "num");
    cell(row, String(b.tokens), "num");
    cell(row, b.tokens_per_second.toFixed(1), "num");
    cell(row, b.tau === null ? "-" : b.tau.toFixed(2), "num");
    cell(row, b.acceptance_rate === null ? "-" : b.acceptance_rate.toFixed(2), "num");
    cell(row, b.done ? "-" : duration(b.eta_seconds), "num");
    body.appendChild(row);
  }
}

async function refresh() {
  const key = sessionStorage.getItem("specq-key");
  const headers = key ? { Authorization: "Bearer " + key } : {};
  const form = document.getElementById("key");
  const error = document.getElementById("error");
  try {
    const response = await fetch("/v1/specq/status", { headers, cache: "no-store" });
    if (response.status === 401) {
      form.style.display = "block";
      error.textContent = key ? "that key was refused" : "this server needs its API key";
      return;
    }
    if (!response.ok) throw new Error(`the server answered ${response.status}`);
    form.style.display = "none";
    error.textContent = "";
    render(await response.json());
  } catch (e) {
    error.textContent = "cannot read the status: " + e.message;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.getElementById("key").addEventListener("submit", ev => {
  ev.preventDefault();
  sessionStorage.setItem("specq-key", document.getElementById("key-input").value);
  document.getElementById("key-input").value = "";
});
refresh();
"""
