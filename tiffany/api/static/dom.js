// Small DOM and formatting helpers shared by the dashboard's views.

import { STATE_LABELS, STATUS_OF } from "./vocab.js";

/**
 * Build an element: h("div", {class: "x", dataset: {testid: "y"}, onclick}, ...children).
 * Children may be strings, numbers, nodes, arrays or null (skipped).
 */
export function h(tag, attrs = null, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "dataset") Object.assign(el.dataset, v);
      else if (k === "testid") el.dataset.testid = v;
      else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
      else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
      else if (k in el && typeof v !== "string") el[k] = v;
      else el.setAttribute(k, v === true ? "" : v);
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c == null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

// -- a pressed pointer: redraws wait for its release ----------------------------------
//
// An element rebuilt between a click's mousedown and mouseup swallows the
// click: the browser sends it to neither the old element nor the new one.
// A live page redraws several times a second (a run's elapsed time, the
// feed's patches), and a person's click takes about a tenth of one, so a
// redraw asks `pressed()` first and, while a button is down, leaves itself
// to `whenReleased` instead: it runs after the release and its click.
let pointerDown = false;
const onRelease = new Set();

function released() {
  if (!pointerDown) return;
  pointerDown = false;
  // The click is dispatched with the mouseup, in this same task: after it.
  setTimeout(() => {
    if (pointerDown) return;
    const waiting = [...onRelease];
    onRelease.clear();
    for (const fn of waiting) fn();
  }, 0);
}

addEventListener("pointerdown", () => (pointerDown = true), true);
addEventListener("pointerup", released, true);
addEventListener("pointercancel", released, true);
addEventListener("blur", released);

/** Whether a pointer's button is down on the page (a click may be under way). */
export function pressed() {
  return pointerDown;
}

/** Run `fn` once the pointer's button is released (one call per `fn`, however often asked). */
export function whenReleased(fn) {
  if (pointerDown) onRelease.add(fn);
  else fn();
}

/** Replace the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const $ = (sel, root = document) => root.querySelector(sel);

/** Pretty JSON for payload views (strings shown as they are). */
export function pretty(value) {
  if (value === undefined) return "";
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** Parse a JSON text field (blank is null): `{value}`, or `{error}` with the parser's message. */
export function parseJsonField(text) {
  if (!text.trim()) return { value: null };
  try {
    return { value: JSON.parse(text) };
  } catch (err) {
    return { error: err.message };
  }
}

/** One-line JSON, cut at `max` characters. */
export function compact(value, max = 140) {
  let s;
  try {
    s = typeof value === "string" ? value : JSON.stringify(value);
  } catch {
    s = String(value);
  }
  if (s === undefined) return "";
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}

/** A duration in seconds as "850 ms", "12.4 s", "3m 05s", "2h 10m". */
export function duration(s) {
  if (s == null || !isFinite(s)) return "";
  if (s < 0) s = 0;
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
}

/** Epoch seconds as a local clock time with milliseconds. */
export function clock(ts) {
  if (ts == null) return "";
  const d = new Date(ts * 1000);
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

const WHEN = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  timeZoneName: "short",
});

/** Epoch seconds as a local date and time with the zone: "May 1, 2024, 10:00:00 AM GMT+2". */
export function when(ts) {
  return ts == null ? "" : WHEN.format(new Date(ts * 1000));
}

/** A <time> element showing `when(ts)` (or `text`), machine-readable, with the zone in its title. */
export function timeEl(ts, text = null, attrs = {}) {
  if (ts == null) return null;
  const iso = new Date(ts * 1000).toISOString();
  return h("time", { datetime: iso, title: when(ts), ...attrs }, text ?? when(ts));
}

/** Epoch seconds as "just now", "5 s ago", "3 min ago", or a date. */
export function ago(ts, now = Date.now() / 1000) {
  if (ts == null) return "";
  const s = now - ts;
  if (s < 2) return "just now";
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(ts * 1000).toLocaleDateString();
}

/** Full local date-time, with the zone, for tooltips. */
export function stamp(ts) {
  return when(ts);
}

/** Run `fn` at most once per animation frame, however often it is scheduled. */
export function frameBatcher(fn) {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      fn();
    });
  };
}

/** Call `fn` at most every `ms` (trailing call kept). */
export function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  return (...args) => {
    const wait = last + ms - Date.now();
    if (wait <= 0 && !timer) {
      last = Date.now();
      fn(...args);
    } else if (!timer) {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn(...args);
      }, Math.max(wait, 0));
    }
  };
}

/** A transient message in the corner. */
export function toast(text, kind = "info") {
  let box = $("#toasts");
  const el = h("div", { class: `toast toast-${kind}`, role: "status", testid: "toast" }, text);
  box.append(el);
  setTimeout(() => el.classList.add("fade"), 4000);
  setTimeout(() => el.remove(), 4600);
}

// The vocabulary is the server's (vocab.js reads GET api/meta); re-exported for the pages.
export { RUN_STATUSES, STEP_STATUSES, TERMINAL_RUN, TERMINAL_TASK } from "./vocab.js";

/**
 * The one state vocabulary the dashboard shows: pending, running, waiting (a
 * run only), succeeded, failed, cancelled (and `skipped`, a step that never ran). Runs and steps
 * already speak it; the kernel's task states and the feed's `run.finished`
 * labels (`done`, `crashed`, `ready`, `blocked_*`) are mapped by the
 * server's `status_of` (the store's task rows carry the same word as
 * `status`: tiffany/wire/status.py, TASK_STATUS).
 */
export function statusWord(state) {
  if (!state) return STATUS_OF.ready;
  return STATUS_OF[state] || state;
}

/** Short label of a task state: the vocabulary's word, or what a running task waits on ("sleeping"). */
export function stateLabel(state) {
  return STATE_LABELS[state] || statusWord(state);
}

/**
 * A task's state as the run page shows it: a worker whose step failed ended
 * `done` (it returned the failure to the planner), yet what it did failed.
 * `failedSteps`: the ids of the run's failed steps.
 */
export function taskState(task, failedSteps) {
  const failed = task.kind === "worker" && task.state === "done" && failedSteps?.has(task.step_id);
  return failed
    ? { tone: "bad", label: "step failed", state: "step_failed" }
    : { tone: tone(task.state), label: stateLabel(task.state), state: task.state };
}

/** A CSS class family for a run/step/task state. */
export function tone(state) {
  switch (state) {
    case "succeeded":
    case "done":
    case "identical":
      return "ok";
    case "failed":
    case "crashed":
    case "diverged":
      return "bad";
    // Neutral: someone stopped it, nothing went wrong.
    case "cancelled":
    case "cancelling":
    case "skipped":
      return "idle";
    case "running":
    case "ready":
      return "live";
    case "waiting":
      return "wait";
    default:
      return state && state.startsWith("blocked") ? "wait" : "idle";
  }
}

/** What a task blocked on a run's concurrency slot is blocked on (the planner waits for its signal). */
const SLOT_WAIT = "waiting for signal concurrency.slot";

/**
 * A run's concurrency slot as the live feed tells it: "queued" (its planner
 * waits for the slot), "granted" (it waited and woke), else null (not seen:
 * no limit, or the wait came before the page's feed). The feed says
 * `run.started` for a queued run too: this is what tells it is not running.
 * Ask it of a run the store shows pending (it looks through the run's tasks).
 */
export function slotState(liveRun) {
  if (!liveRun) return null;
  let planner = null;
  for (const t of liveRun.tasks.values()) {
    if (t.kind === "planner") {
      planner = t; // the first task seen, as a rule
      break;
    }
  }
  const wait = planner && planner.segments.find((s) => s.label === SLOT_WAIT);
  if (!wait) return null;
  return wait.end == null ? "queued" : "granted";
}

/** A run's number as shown: `#7`, or `#7 · e1` for engine 1's (numbers are per engine). */
export function runNo(run) {
  if (typeof run.run_no !== "number") return null;
  return run.engine ? `#${run.run_no} · e${run.engine}` : `#${run.run_no}`;
}

/**
 * Ask before doing something that cannot be undone: a modal dialog with
 * `title`, `message` (text or nodes) and two buttons. Resolves to true when
 * `confirm` was pressed, false on "Keep" or Escape.
 */
export function confirmDialog({ title, message, confirm, danger = true }) {
  return new Promise((done) => {
    const keep = h("button", { type: "button", class: "btn", testid: "confirm-cancel", onclick: () => dialog.close("keep") }, "Keep");
    const ok = h(
      "button",
      { type: "button", class: `btn ${danger ? "btn-danger armed" : "btn-primary"}`, testid: "confirm-ok", onclick: () => dialog.close("ok") },
      confirm,
    );
    const dialog = h(
      "dialog",
      { class: "dialog confirm-dialog", testid: "confirm-dialog", "aria-label": title },
      h("h2", null, title),
      h("div", { class: "confirm-message", testid: "confirm-message" }, message),
      h("div", { class: "form-actions" }, keep, ok),
    );
    dialog.addEventListener("close", () => {
      dialog.remove();
      done(dialog.returnValue === "ok");
    });
    document.body.append(dialog);
    dialog.showModal();
    keep.focus();
  });
}
