// The fenced dashboard: plain JS, no build step. Everything shown is data and goes in as text nodes (textContent),
// never as markup: a user's input or a model's words appear literally.
"use strict";

const KEY = "fenced.key";
const FEED_KEEP = 200;
const PING_MS = 30000;
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const key = () => localStorage.getItem(KEY) || "";
const short = (id) => (id || "").slice(0, 8);
const when = (ms) => (ms ? new Date(ms).toLocaleTimeString() : "");
const runLink = (id) => el("a", { href: "#/run/" + encodeURIComponent(id), class: "mono", title: id }, short(id));
const wsUrl = (path) => (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path +
  (path.includes("?") ? "&" : "?") + "key=" + encodeURIComponent(key());

function notice(text) {
  const p = $("notice");
  p.textContent = text || "";
  p.hidden = !text;
}

function setStatus(node, on, text) {
  node.className = "status " + (on ? "on" : "off");
  node.textContent = text;
}

async function api(path, options) {
  const opts = Object.assign({ headers: {} }, options || {});
  opts.headers = Object.assign({ Authorization: "Bearer " + key() }, opts.headers);
  const response = await fetch(path, opts);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(response.status + ": " + (body.detail || response.statusText));
  return body;
}

function describe(ev) {
  const d = ev.data || {};
  switch (ev.type) {
    case "run_queued": return "queued (" + (d.kind || "") + ", " + (d.credits_held ?? "?") + " credits held)";
    case "step_started": return "step " + ev.step + " started" + (d.name ? " (" + d.name + ")" : "");
    case "model_decision": return "model decided: " + JSON.stringify(d);
    case "tool_started": return "tool " + (d.name || "") + " called with " + JSON.stringify(d.args ?? {});
    case "tool_result": return "tool " + (d.name || "") + " answered " + JSON.stringify(d.result ?? d);
    case "step_done": return "step " + ev.step + " done" + (d.name ? " (" + d.name + ")" : "");
    case "task_resumed": return "TAKEOVER: resumed by epoch " + ev.epoch + " at step " + (d.step ?? ev.step) +
      " from checkpoint '" + (d.phase || "") + "'; previous holder " + (d.previous_owner || "none");
    case "run_waiting": return "waiting for a person: " + (d.question || "");
    case "run_done": return "done: " + (d.answer || "") + " (charged " + (d.credits_charged ?? "?") + ")";
    case "run_failed": return "failed (" + (d.error_class || "") + "): " + (d.error || "");
    case "run_dead": return "dead-lettered: " + (d.reason || JSON.stringify(d));
    case "run_cancelled": return "cancelled";
    case "queue_long": return "WARNING: queue " + d.queue + " holds " + d.length + " messages (over " + d.threshold +
      ")" + (d.lag_ms !== "" && d.lag_ms !== undefined ? ", the oldest waiting " + (Number(d.lag_ms) / 1000).toFixed(1) + " s" : "");
    case "queue_ok": return "queue " + d.queue + " back to " + (d.length === "" ? "not watched" : d.length + " messages") +
      " (threshold " + d.threshold + ")";
    case "worker_offline": return "worker " + d.worker + " offline: " + d.reason + " (" + d.rerouted + " wake-ups rerouted)";
    default: return ev.type + " " + JSON.stringify(d);
  }
}

function eventItem(ev, withRun) {
  const at = when(ev.at_ms || Number(String(ev.stream_id || ev.id || "0").split("-")[0]));
  if (!ev.run_id && withRun)  // a routing warning (long queue, queue back to normal, worker offline): no run
    return el("li", { class: ev.type, "data-eid": ev.eid, "data-type": ev.type }, at, " routing ", describe(ev));
  return el("li", { class: ev.type, "data-eid": ev.eid, "data-type": ev.type }, at, " ",
    withRun ? runLink(ev.run_id) : null, withRun ? " " : null,
    "e" + ev.epoch + " s" + ev.step + " ", describe(ev));
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// -- the overview: one WebSocket, a snapshot then increments ------------------------------------------
const ov = { ws: null, ping: null, retry: null, skew: 0, runs: new Map(), workers: [], feed: [], dead: [], counters: {},
  routing: {}, scored: new Map(), order: [], queues: [] };

function connectOverview() {
  if (ov.ws || !key()) return;
  const ws = new WebSocket(wsUrl("/api/dashboard/live"));
  ov.ws = ws;
  ws.onopen = () => { ov.ping = setInterval(() => ws.send('{"type":"ping"}'), PING_MS); };
  ws.onmessage = (m) => applyOverview(JSON.parse(m.data));
  ws.onclose = (e) => {
    clearInterval(ov.ping);
    ov.ws = null;
    setStatus($("live-status"), false, "offline");
    if (e.code === 4403) {
      notice("The overview needs an admin key (fenced users add NAME --admin); below are your own runs, as of now.");
      loadMyRuns();
      return;
    }
    if (e.code === 1008) { notice("The API refused the key: " + (e.reason || "invalid API key")); return; }
    if (currentView() === "overview") ov.retry = setTimeout(connectOverview, 1000);  // resync: a new snapshot
  };
}

// A user's key: their own runs, once (GET /api/runs); the overview's live socket is for operators.
async function loadMyRuns() {
  try {
    const page = await api("/api/runs?limit=50");
    ov.runs = new Map(page.runs.map((r) => [r.run_id, Object.assign({ user_id: "", owner: null, phase: "",
      query: r.input, lease_deadline_ms: null }, r)]));
    renderRuns();
  } catch (err) {
    notice("Cannot list your runs: " + err.message);
  }
}

function disconnectOverview() {
  clearTimeout(ov.retry);
  if (ov.ws) { const ws = ov.ws; ov.ws = null; ws.onclose = null; ws.close(); }
  clearInterval(ov.ping);
  setStatus($("live-status"), false, "overview closed");
}

function applyOverview(msg) {
  if (msg.now_ms) ov.skew = msg.now_ms - Date.now();
  switch (msg.type) {
    case "snapshot":
      notice("");
      setStatus($("live-status"), true, "live");
      ov.runs = new Map(msg.runs.map((r) => [r.run_id, r]));
      ov.workers = msg.workers; ov.feed = msg.feed; ov.dead = msg.dead_letters; ov.counters = msg.counters;
      ov.routing = msg.routing || {}; ov.queues = msg.queues || [];
      ov.scored = new Map((ov.routing.workers || []).map((w) => [w.name, w]));
      ov.order = (ov.routing.workers || []).map((w) => w.name);
      renderOverview();
      break;
    case "runs":
      for (const r of msg.runs) ov.runs.set(r.run_id, r);
      for (const id of msg.gone || []) ov.runs.delete(id);
      renderRuns();
      break;
    case "events": {
      const seen = new Set(ov.feed.map((e) => e.stream_id + e.run_id));
      ov.feed = ov.feed.concat(msg.events.filter((e) => !seen.has(e.stream_id + e.run_id))).slice(-FEED_KEEP);
      renderFeed();
      break;
    }
    case "workers": ov.workers = msg.workers; renderWorkers(); break;
    case "routing":  // the workers whose score or fields changed, the ones gone, and the order now
      for (const w of msg.workers) ov.scored.set(w.name, w);
      for (const name of msg.gone || []) ov.scored.delete(name);
      ov.order = msg.order;
      Object.assign(ov.routing, { policy: msg.policy, threshold: msg.threshold, weights: msg.weights,
        load_per_slot: msg.load_per_slot, queue_warn: msg.queue_warn });
      renderRouting();
      break;
    case "queues": ov.queues = msg.queues; renderQueues(); break;
    case "dead_letters": ov.dead = msg.dead_letters; renderDead(); break;
    case "counters": ov.counters = msg.counters; renderCounters(); break;
    case "error": setStatus($("live-status"), false, "store error: " + msg.error); break;
    default: break;
  }
}

function renderOverview() {
  renderCounters(); renderWorkers(); renderRouting(); renderQueues(); renderRuns(); renderFeed(); renderDead();
}

// The routing registry as `fenced workers` shows it (routing.view on the server: one computation).
function renderRouting() {
  const r = ov.routing, w8 = r.weights || {};
  $("routing-policy").textContent = r.policy ? "policy " + r.policy + ", threshold " + r.threshold + "; score = " +
    w8.freshness + " × freshness + " + w8.speed + " × speed + " + w8.load + " × load" +
    (r.load_per_slot ? " (per slot)" : "") + " + " + w8.success + " × success" : "";
  const f2 = (x) => Number(x).toFixed(2);
  fill($("routing").tBodies[0], ov.order.filter((n) => ov.scored.has(n)).map((name) => {
    const w = ov.scored.get(name), c = w.routing;
    const avg = c.avg_step_ms === null ? "no step yet" : (c.avg_step_ms / 1000).toFixed(2) + " s";
    return el("tr", { "data-worker": name, class: (c.qualified ? "qualified " : "not-qualified ") + c.status },
      el("td", { class: "mono", title: (w.host || "") + ":" + (w.pid || "") }, name),
      el("td", { class: "status" }, c.status),
      el("td", { class: "score" }, f2(c.score)),
      el("td", { class: "freshness" }, f2(c.freshness) + " (" + (c.age_ms / 1000).toFixed(1) + " s)"),
      el("td", { class: "speed" }, f2(c.speed) + " (" + avg + ")"),
      el("td", { class: "load" }, f2(c.load) + " (" + c.running + " running + " + c.queued + " queued)"),
      el("td", { class: "success" }, f2(c.success)),
      el("td", { class: "qualifies" }, c.qualified ? "yes" : "no: " + c.why_not));
  }));
}

function renderQueues() {
  $("queues-threshold").textContent = ov.routing.queue_warn ? "a warning past " + ov.routing.queue_warn + " messages" : "";
  fill($("queues").tBodies[0], ov.queues.map((q) => el("tr", { "data-queue": q.queue, class: q.long ? "long" : "" },
    el("td", { class: "mono" }, q.queue), el("td", {}, String(q.length)),
    el("td", {}, q.lag_ms === null ? "" : (q.lag_ms / 1000).toFixed(1) + " s"),
    el("td", { class: "warning" }, q.long ? "over the threshold" : ""))));
}

function renderCounters() {
  const c = ov.counters || {};
  const items = Object.entries(c.runs_by_state || {}).map(([s, n]) => ["runs " + s, n]);
  items.push(["dead letters", c.dead_letters ?? 0], ["takeovers seen", c.takeovers_seen ?? 0],
    ["events seen", c.events_seen ?? 0], ["false-positive deaths", c.false_positive_deaths ?? 0],
    ["workers alive", ov.workers.filter((w) => w.alive).length]);
  $("counters").replaceChildren(...items.map(([label, n]) => el("div", { "data-counter": label }, el("b", {}, n), label)));
}

function renderWorkers() {
  fill($("workers").tBodies[0], ov.workers.map((w) => el("tr", { "data-token": w.token },
    el("td", { class: "mono", title: w.token }, w.host + ":" + w.pid),
    el("td", {}, w.alive ? "alive" : (w.presumed_dead_at_ms ? "presumed dead " + when(w.presumed_dead_at_ms) : "no connection")),
    el("td", {}, String(w.runs.length)),
    el("td", {}, String(w.renew_failures)),
    el("td", {}, when(w.last_seen_ms)))));
  renderCounters();
}

function leaseLeft(r) {
  if (!r.lease_deadline_ms) return "";
  const left = r.lease_deadline_ms - (Date.now() + ov.skew);
  return left > 0 ? (left / 1000).toFixed(1) + " s" : "expired";
}

function renderRuns() {
  const order = { running: 0, queued: 1, waiting: 2 };
  const rows = [...ov.runs.values()].sort((a, b) =>
    (order[a.state] ?? 3) - (order[b.state] ?? 3) || b.updated_at_ms - a.updated_at_ms);
  fill($("runs").tBodies[0], rows.map((r) => el("tr", { "data-run": r.run_id, class: r.epoch > 1 ? "takeover" : "" },
    el("td", {}, runLink(r.run_id)), el("td", {}, r.user_id), el("td", {}, r.agent),
    el("td", {}, el("span", { class: "state " + r.state }, r.state)),
    el("td", { class: "step" }, String(r.step) + " " + r.phase), el("td", { class: "epoch" }, String(r.epoch)),
    el("td", { class: "mono", title: r.owner || "" }, r.owner ? r.owner.split("/")[0] : ""),
    el("td", { class: "lease" }, leaseLeft(r)), el("td", { class: "input" }, r.query))));
}

function renderFeed() {
  fill($("feed"), ov.feed.slice().reverse().map((e) => eventItem(e, true)));
}

function renderDead() {
  fill($("dead-letters").tBodies[0], ov.dead.map((d) => el("tr", {},
    el("td", {}, runLink(d.run_id)), el("td", {}, String(d.step)), el("td", {}, String(d.attempts)),
    el("td", {}, when(d.at_ms)), el("td", { class: "reason" }, d.reason))));
}

setInterval(() => {  // the lease countdown between pushes is local arithmetic, not a request
  if (currentView() !== "overview") return;
  for (const tr of $("runs").tBodies[0].rows) {
    const r = ov.runs.get(tr.dataset.run);
    if (r) tr.querySelector("td.lease").textContent = leaseLeft(r);
  }
}, 500);

// -- a run's page -------------------------------------------------------------------------------------
const rv = { id: null, ws: null, ping: null, events: [], lastId: null };

async function openRun(id) {
  closeRun();
  rv.id = id;
  $("run-id").textContent = id;
  try {
    const page = await api("/api/dashboard/runs/" + encodeURIComponent(id));
    if (rv.id !== id) return;
    renderRunPage(page);
    rv.events = page.events.map((e) => Object.assign({ id: e.stream_id }, e));
    renderRunEvents();
    followRun(id);
  } catch (err) {
    notice("Cannot show run " + id + ": " + err.message);
  }
}

function closeRun() {
  if (rv.ws) { const ws = rv.ws; rv.ws = null; ws.onclose = null; ws.close(); }
  clearInterval(rv.ping);
  rv.id = null; rv.events = []; rv.lastId = null;
}

async function refreshRunPage() {  // after the live stream said the run moved: the row, ledger and "why"
  const id = rv.id;
  try { const page = await api("/api/dashboard/runs/" + encodeURIComponent(id)); if (rv.id === id) renderRunPage(page); }
  catch (err) { notice("Cannot refresh run " + id + ": " + err.message); }
}

function renderRunPage(page) {
  const r = page.run;
  const state = $("run-state");
  state.className = "state " + r.state;
  state.textContent = r.state;
  const facts = [["user", r.user_id], ["agent", r.agent + (r.agent_version ? " " + r.agent_version : "")],
    ["input", r.query], ["step", r.step + " (" + r.phase + ")"], ["epoch", r.epoch], ["owner", r.owner || ""],
    ["deliveries", r.total_deliveries], ["usage", r.prompt_tokens + " + " + r.completion_tokens + " tokens, " + r.model_calls + " model calls"],
    ["answer", r.answer || ""], ["error", r.error ? r.error_class + ": " + r.error : ""]];
  if (r.question) facts.push(["waiting on", r.question.question || JSON.stringify(r.question)]);
  $("run-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, String(v))]));
  const x = page.explain;
  $("explain-summary").textContent = x ? x.summary : "";
  $("explain").replaceChildren(...(x ? x.answers : []).map((a) =>
    el("div", { class: "why", "data-topic": a.topic }, el("b", {}, a.question), ...a.sentences.map((s) => el("p", {}, s)))));
  fill($("steps").tBodies[0], page.steps.map((s) => el("tr", {},
    el("td", {}, String(s.step)), el("td", {}, s.phase), el("td", {}, String(s.epoch)),
    el("td", { class: "mono", title: s.owner || "" }, (s.owner || "").split("/")[0]),
    el("td", {}, s.prompt_tokens + " + " + s.completion_tokens), el("td", {}, when(s.at_ms)),
    el("td", { class: "input" }, s.decision ? JSON.stringify(s.decision) : ""))));
  fill($("ledger").tBodies[0], page.ledger.map((e) => el("tr", { class: e.kind === "takeover" ? "takeover" : "" },
    el("td", {}, when(e.at_ms)), el("td", {}, String(e.epoch)), el("td", {}, e.kind),
    el("td", { class: "mono", title: e.actor }, e.actor.split("/")[0]), el("td", { class: "reason" }, e.reason))));
}

function renderRunEvents() {
  fill($("run-events"), rv.events.map((e) => {
    const li = eventItem(e, false);
    if (e.superseded) li.classList.add("superseded");
    return li;
  }));
}

function markSuperseded(eids) {
  for (const x of rv.events) if ((eids || []).includes(x.eid) && x.type !== "task_resumed") x.superseded = true;
}

// The run's own live stream (GET /api/runs/{id}/events as a WebSocket: snapshot, then increments).
function followRun(id) {
  const after = rv.lastId ? "?after=" + encodeURIComponent(rv.lastId) : "";
  const ws = new WebSocket(wsUrl("/api/runs/" + encodeURIComponent(id) + "/events" + after));
  rv.ws = ws;
  ws.onopen = () => { setStatus($("events-live"), true, "live"); rv.ping = setInterval(() => ws.send('{"type":"ping"}'), PING_MS); };
  ws.onmessage = (m) => {
    const msg = JSON.parse(m.data);
    if (msg.type === "snapshot") {
      rv.events = msg.events; rv.lastId = msg.last_id || rv.lastId;
    } else if (msg.type === "event") {
      const e = msg.event;
      rv.lastId = e.id;
      markSuperseded(msg.superseded);  // a takeover: the lost half-step is struck through, kept for reading
      if (!rv.events.some((x) => x.eid === e.eid && !x.superseded)) rv.events.push(e);
      if (e.type === "task_resumed" || e.type === "step_done" || e.type.startsWith("run_")) refreshRunPage();
    } else if (msg.type === "superseded") {
      markSuperseded(msg.eids);
    } else return;
    renderRunEvents();
  };
  ws.onclose = (e) => {
    clearInterval(rv.ping);
    setStatus($("events-live"), false, e.code === 1000 ? "ended" : "not live");
    if (rv.ws !== ws) return;
    rv.ws = null;
    if (e.code === 1000) { refreshRunPage(); return; }
    setTimeout(() => { if (rv.id === id && !rv.ws) followRun(id); }, 1000);  // resume after the last id seen
  };
}

// -- views, key, forms --------------------------------------------------------------------------------
function currentView() { return location.hash.startsWith("#/run/") ? "run" : "overview"; }

function route() {
  notice("");
  if (!key()) {
    $("overview").hidden = $("run-view").hidden = true;
    notice("Enter an API key (fenced users add NAME [--admin] prints one).");
    return;
  }
  if (currentView() === "run") {
    disconnectOverview();
    $("overview").hidden = true; $("run-view").hidden = false;
    openRun(decodeURIComponent(location.hash.slice("#/run/".length)));
  } else {
    closeRun();
    $("run-view").hidden = true; $("overview").hidden = false;
    connectOverview();
  }
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const value = $("key-input").value.trim();
  if (value) localStorage.setItem(KEY, value);
  $("key-input").value = "";
  disconnectOverview();
  route();
});
$("key-forget").addEventListener("click", () => { localStorage.removeItem(KEY); disconnectOverview(); closeRun(); route(); });
$("open-run").addEventListener("submit", (e) => {
  e.preventDefault();
  const id = $("open-run-id").value.trim();
  if (id) location.hash = "#/run/" + encodeURIComponent(id);
});
$("submit-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const body = { input: $("submit-input").value, kind: $("submit-kind").value };
  if ($("submit-agent").value.trim()) body.agent = $("submit-agent").value.trim();
  try {
    const run = await api("/api/runs", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    $("submit-result").replaceChildren("submitted ", runLink(run.run_id));
    $("submit-result").dataset.run = run.run_id;
  } catch (err) {
    $("submit-result").textContent = "refused: " + err.message;
  }
});
window.addEventListener("hashchange", route);
route();
