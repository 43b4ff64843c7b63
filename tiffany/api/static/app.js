// Tiffany live dashboard: entry point. Wires the runs list, the submit
// form, the run page, the schedules and tools pages and the activity tail to
// the HTTP API and the live feed, and keeps the view (selected run, filters)
// in the URL hash:
//   #/                      overview (submit form)
//   #/schedules, #/tools    the schedules; the engine's tools
//   #/memory[/<ns>[/<key>]][?search=…]   the agents' memory (memory.js)
//   #/inbox                 the runs that need someone (inbox.js)
//   #/run/<run_id>?status=failed&tail=<run_id>&name=nightly&q=ticket&since=2024-05-01T09:00
// (`since`/`until` are local date-times, as the date inputs show them).
// The activity tail follows the run page open (no `tail` in the hash);
// `tail=<run_id>` pins it to a run, `tail=all` shows every run's.

import { adoptTokenFromUrl, api, ApiError, Feed, getToken, onUnauthorized, setToken } from "./api.js";
import { $, fill, h, runNo, toast } from "./dom.js";
import { Inbox, touchesWaits } from "./inbox.js";
import { Live } from "./live.js";
import { MemoryPage } from "./memory.js";
import { RunPage } from "./runpage.js";
import { RunsPane } from "./runs.js";
import { SchedulesPage } from "./schedules.js";
import { renderSubmit } from "./submit.js";
import { Tail } from "./tail.js";
import { renderTools } from "./tools.js";

const READY_POLL_MS = 2000;
const READY_POLL_OK_MS = 15000;
const RUNS_POLL_MS = 10000;

adoptTokenFromUrl();

// -- the hash route ------------------------------------------------------------

/** The runs list's filters kept in the hash (besides `status`). */
const FILTERS = ["name", "q", "since", "until"];

function readRoute() {
  const raw = location.hash.replace(/^#/, "");
  const [path, query = ""] = raw.split("?");
  const q = new URLSearchParams(query);
  const m = path.match(/^\/run\/(.+)$/);
  // A namespace and a key are one segment each, encoded (a key may hold "/").
  const mem = path.match(/^\/memory(?:\/([^/]+)(?:\/([^/]+))?)?\/?$/);
  const pages = { "/new": "new", "/schedules": "schedules", "/tools": "tools", "/inbox": "inbox" };
  return {
    view: m ? "run" : mem ? "memory" : pages[path] || "home",
    runId: m ? decodeURIComponent(m[1]) : null,
    memNs: mem && mem[1] ? safeDecode(mem[1]) : null,
    memKey: mem && mem[2] ? safeDecode(mem[2]) : null,
    search: (mem && q.get("search")) || null,
    status: q.get("status") || null,
    tail: q.get("tail") || null,
    ...Object.fromEntries(FILTERS.map((k) => [k, q.get(k) || null])),
  };
}

/** A hash segment decoded (a hand-typed stray "%" is taken as it is). */
function safeDecode(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

function routeHash(r) {
  const page = { new: "/new", schedules: "/schedules", tools: "/tools", inbox: "/inbox" }[r.view];
  let path = r.runId ? `/run/${encodeURIComponent(r.runId)}` : page || "/";
  if (r.view === "memory") {
    path = "/memory";
    if (r.memNs != null) path += `/${encodeURIComponent(r.memNs)}`;
    if (r.memNs != null && r.memKey != null) path += `/${encodeURIComponent(r.memKey)}`;
  }
  const q = new URLSearchParams();
  if (r.view === "memory" && r.search) q.set("search", r.search);
  if (r.status) q.set("status", r.status);
  if (r.tail) q.set("tail", r.tail);
  for (const k of FILTERS) if (r[k]) q.set(k, r[k]);
  const qs = q.toString();
  return `#${path}${qs ? `?${qs}` : ""}`;
}

/** Change the route: `patch` over the current one; `replace` keeps history clean. */
function navigate(patch, { replace = false } = {}) {
  const next = { ...readRoute(), ...patch };
  if (patch.view && patch.view !== "run") next.runId = null;
  if (patch.view && patch.view !== "memory") Object.assign(next, { memNs: null, memKey: null, search: null });
  const hash = routeHash(next);
  if (hash === location.hash) return;
  if (replace) {
    history.replaceState(null, "", hash);
    onRoute();
  } else location.hash = hash;
}

// -- the app ---------------------------------------------------------------------

const live = new Live();
let page = null; // the open RunPage
let pageRunId = null;

const runs = new RunsPane($("#runs-pane"), {
  live,
  route: readRoute,
  navigate,
  onError: reportError,
  onLoaded: (list) => {
    tail.updateFilterOptions(list);
    tail.relabel();
  },
});

const tail = new Tail($("#tail-pane"), {
  live,
  runName: (id) => {
    const r = runs.runs.find((x) => x.run_id === id);
    if (!r) return { short: id.replace(/^run-/, "").slice(0, 6), long: id };
    return { short: runNo(r) ?? r.name, long: `${r.name} · ${id}` };
  },
  openRun: (id) => navigate({ view: "run", runId: id }),
  // A run picked pins the tail to it (`tail=<run_id>`, kept across pages);
  // "All runs" on a run page is `tail=all` (no `tail`: it follows the page).
  onFilter: (id) => {
    const r = readRoute();
    navigate({ tail: id || (r.view === "run" ? "all" : null) }, { replace: true });
  },
});

/** The run the tail shows (null: every run's) and whether it follows the open run page. */
function tailOf(r) {
  if (r.tail === "all") return { runId: null, following: false };
  if (r.tail) return { runId: r.tail, following: false };
  const open = r.view === "run" ? r.runId : null;
  return { runId: open, following: open != null };
}

const waitingInbox = new Inbox({ onError: reportError });
$("#store-badge").before(waitingInbox.badge);

const main = $("#main");
// run id -> the WAL seq its submission answered (its page asks the store for it).
const created = new Map();

let other = null; // the open schedules page
let memoryPage = null; // the open memory page
let shownView = null; // the view the main area shows

const NAV = { home: "nav-runs", new: "nav-runs", run: "nav-runs", schedules: "nav-schedules", tools: "nav-tools", memory: "nav-memory" };

function onRoute() {
  const r = readRoute();
  const t = tailOf(r);
  tail.setFilter(t.runId, { following: t.following });
  // The nav keeps the hash's query (filters, a pinned tail), as the runs' links do.
  const query = location.hash.split("?")[1];
  for (const a of document.querySelectorAll(".nav a")) {
    a.setAttribute("href", `${a.getAttribute("href").split("?")[0]}${query ? `?${query}` : ""}`);
    if (a.dataset.testid === NAV[r.view]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (other && r.view !== "schedules") {
    other.destroy();
    other = null;
  }
  if (memoryPage && r.view !== "memory") {
    memoryPage.destroy();
    memoryPage = null;
  }
  if (r.view !== "inbox") waitingInbox.unmount();
  if (r.view === "memory") {
    if (page) page.destroy();
    page = null;
    pageRunId = null;
    if (!memoryPage) {
      const root = h("div", { class: "page" });
      fill(main, root);
      memoryPage = new MemoryPage(root, { onError: reportError });
    }
    memoryPage.show(r);
    document.title = r.memKey != null ? `Tiffany · ${r.memNs} / ${r.memKey}` : r.memNs != null ? `Tiffany · memory ${r.memNs}` : "Tiffany · memory";
  } else if (r.view === "inbox") {
    if (page) page.destroy();
    page = null;
    pageRunId = null;
    const root = h("div", { class: "page" });
    fill(main, root);
    waitingInbox.mount(root);
    document.title = "Tiffany · inbox";
  } else if (r.view === "schedules" || r.view === "tools") {
    if (page) page.destroy();
    page = null;
    pageRunId = null;
    if (r.view === "schedules" && !other) {
      const root = h("div", { class: "page" });
      fill(main, root);
      other = new SchedulesPage(root, { onError: reportError });
      document.title = "Tiffany · schedules";
    } else if (r.view === "tools" && shownView !== "tools") {
      const root = h("div", { class: "page" });
      fill(main, root);
      renderTools(root, { onError: reportError });
      document.title = "Tiffany · tools";
    }
  } else if (r.view === "run") {
    if (pageRunId !== r.runId) {
      if (page) page.destroy();
      const root = h("div");
      fill(main, root);
      pageRunId = r.runId;
      const minSeq = created.get(r.runId) ?? null;
      page = new RunPage(root, r.runId, {
        live,
        minSeq,
        onError: reportError,
        onRunChanged: () => runs.refreshSoon(),
        openRun: (runId, seq, name) => {
          // A run just created (a re-run): its page reads it as of its seq.
          if (seq != null) {
            created.set(runId, seq);
            runs.added(runId, name, seq);
          }
          navigate({ view: "run", runId });
        },
      });
      document.title = `Tiffany · ${r.runId}`;
    }
  } else {
    if (page) page.destroy();
    page = null;
    pageRunId = null;
    const root = h("div", { class: "home" });
    fill(main, root);
    renderSubmit(root, {
      onCreated: (runId, name, seq) => {
        created.set(runId, seq);
        runs.added(runId, name, seq);
        navigate({ view: "run", runId });
      },
    });
    document.title = "Tiffany";
  }
  shownView = r.view;
  runs.render();
}

window.addEventListener("hashchange", onRoute);

// -- live events, batched per animation frame -----------------------------------------

let inbox = [];
let flushQueued = false;

function onEvent(ev) {
  inbox.push(ev);
  if (!flushQueued) {
    flushQueued = true;
    requestAnimationFrame(flush);
  }
}

function flush() {
  flushQueued = false;
  const batch = inbox;
  inbox = [];
  const touched = new Set();
  let finished = false;
  const walSeqs = []; // the newest WAL seq of each engine's events (serve --engines N)
  const mine = [];
  for (const ev of batch) {
    live.apply(ev);
    if (ev.run) touched.add(ev.run);
    const e = ev.engine || 0;
    if (ev.wal_seq != null && (walSeqs[e] == null || ev.wal_seq > walSeqs[e])) walSeqs[e] = ev.wal_seq;
    if (ev.kind === "run.finished" || ev.kind === "run.started") finished = true;
    if (page && ev.run === pageRunId) mine.push(ev);
  }
  tail.push(batch);
  const waits = batch.some(touchesWaits);
  if (touched.size) runs.touched(touched, finished, walSeqs.filter((x) => x != null), waits);
  if (waits) waitingInbox.onEvents(batch);
  if (page && mine.length) page.onEvents(mine);
}

const conn = $("#conn");
const feed = new Feed({
  onEvent,
  onStatus: (st, delayMs) => {
    conn.dataset.state = st;
    document.body.dataset.feed = st;
    conn.textContent =
      st === "live" ? "live" : st === "connecting" ? "connecting…" : `reconnecting in ${Math.ceil(delayMs / 1000)} s`;
    conn.title = feed.lastSeq != null ? `last event seq ${feed.lastSeq}` : "";
  },
  onGone: () => {
    // We were away too long to resume: reload the state over HTTP.
    toast("Missed too many events while disconnected; reloading.", "warn");
    runs.refresh();
    waitingInbox.refresh();
    if (page) page.refresh();
  },
});

// -- errors, the token prompt -------------------------------------------------------------

let lastError = 0;
function reportError(err) {
  if (err instanceof ApiError && err.status === 401) return; // the token prompt handles it
  // Unreachable while the feed is down too: the connection pill says so.
  if (err instanceof ApiError && err.status === 0 && document.body.dataset.feed !== "live") return;
  if (Date.now() - lastError < 3000) return;
  lastError = Date.now();
  toast(err.message || String(err), "bad");
}

const dialog = $("#token-dialog");
const tokenInput = $("#token-input");
onUnauthorized(() => {
  if (dialog.open) return;
  $("#token-reason").textContent = getToken()
    ? "The server refused the token this page has. Enter another."
    : "This server needs an API token.";
  dialog.showModal();
  tokenInput.focus();
});
$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setToken(tokenInput.value.trim());
  tokenInput.value = "";
  dialog.close();
  runs.refresh();
  waitingInbox.refresh();
  if (page) page.refresh();
  feed.restart();
});

// -- readiness banner -------------------------------------------------------------------

const banner = $("#banner");
const storeBadge = $("#store-badge");
/** The store's health beside the connection pill: lag, a stall, quarantined records. */
function showStore(store, reason) {
  const parts = [];
  if (/^store stalled/.test(reason || "")) parts.push(reason);
  else if (store && store.lag_records > 0) parts.push(`store lagging ${store.lag_records}`);
  if (store && store.dead_letters > 0) parts.push(`${store.dead_letters} dead letters`);
  storeBadge.textContent = parts.join(" · ");
  storeBadge.hidden = parts.length === 0;
}
async function pollReady() {
  let next = READY_POLL_MS;
  try {
    const headers = { Accept: "application/json" };
    if (getToken()) headers.Authorization = `Bearer ${getToken()}`;
    const res = await fetch("readyz", { headers });
    const body = await res.json().catch(() => ({}));
    // 401: the token prompt is up; readiness is unknown, not "not ready".
    const ready = res.status === 401 || (res.ok && body.ready !== false);
    banner.hidden = ready;
    showStore(body.store, body.reason);
    if (!ready) {
      const reason = body.reason || body.detail || "";
      const recovering = !reason || /recover/i.test(reason);
      fill(
        banner,
        h("strong", null, recovering ? "Recovering. " : "Not ready. "),
        recovering
          ? "The engine is replaying its write-ahead log; runs may be incomplete until it is done."
          : `${reason}.`,
      );
      banner.dataset.reason = reason;
    }
    if (ready) next = READY_POLL_OK_MS;
  } catch {
    banner.hidden = true; // the connection pill tells that the server is gone
  }
  setTimeout(pollReady, next);
}

// -- theme ---------------------------------------------------------------------------------

const THEME_KEY = "tiffany.theme";
function applyTheme(t) {
  if (t) document.documentElement.dataset.theme = t;
  else delete document.documentElement.dataset.theme;
}
applyTheme(localStorage.getItem(THEME_KEY));
$("#theme-toggle").addEventListener("click", () => {
  const dark =
    document.documentElement.dataset.theme === "dark" ||
    (!document.documentElement.dataset.theme && matchMedia("(prefers-color-scheme: dark)").matches);
  const t = dark ? "light" : "dark";
  localStorage.setItem(THEME_KEY, t);
  applyTheme(t);
});

// -- start ------------------------------------------------------------------------------------

onRoute();
runs.refresh();
waitingInbox.refresh();
feed.start();
pollReady();
setInterval(() => runs.refresh(), RUNS_POLL_MS);
setInterval(() => waitingInbox.refresh(), RUNS_POLL_MS);
setInterval(() => runs.tick(), 1000);
window.__tiffany = { live, feed, runs, tail, inbox: waitingInbox }; // for debugging from the console
