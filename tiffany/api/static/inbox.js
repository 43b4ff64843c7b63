// The inbox: the runs that need someone. A run is `waiting` when every live
// step waits for a person: a signal someone must send (signal.wait), or an
// operator who must enable a tool or register a python function the engine
// holds a step for (the API's `waiting_for` says which). The top bar shows
// how many (`GET /api/runs?status=waiting`: its `counts.waiting`); `#/inbox`
// lists them, each with what it waits for and a link to its page, where the
// signal's form is. The list is read again when the feed shows a wait begin
// or end (a task blocked "waiting…", a signal, a run's end), as of that
// event's WAL seq, and every RUNS_POLL_MS besides.

import { api } from "./api.js";
import { ago, fill, h, runNo, throttle, timeEl } from "./dom.js";

/** The most waiting runs the inbox lists (the count is always exact). */
const INBOX_PAGE = 100;
/** Seqs an engine owns: engine i writes seqs i * 2^40 + 1 .. (i + 1) * 2^40 (tiffany/wire/shards.py). */
const ENGINE_SEQS = 2 ** 40;

/** One `waiting_for` entry in words: "signal approve (step approve)", "tool shell (step sh)". */
export function waitLabel(entry) {
  const step = entry.step ? ` (step ${entry.step})` : "";
  return `${entry.kind} ${entry.name}${step}`;
}

/** Whether a feed event may start or end a wait for a person (the inbox reads the list again). */
export function touchesWaits(ev) {
  if (ev.kind === "signal" || ev.kind === "run.finished") return true;
  return ev.kind === "blocked" && typeof ev.label === "string" && ev.label.startsWith("waiting");
}

/** Load this module's styles once (a module of its own: the other pages' styles stay apart). */
function styles() {
  if (document.querySelector("link[data-inbox-css]")) return;
  document.head.append(h("link", { rel: "stylesheet", href: "static/waiting.css", dataset: { inboxCss: "1" } }));
}

export class Inbox {
  constructor({ onError }) {
    styles();
    this.onError = onError;
    this.runs = [];
    this.count = 0;
    this.loaded = false;
    this.view = null; // the #/inbox view's root while it is shown
    this.wantSeqs = new Map(); // engine -> the WAL seq the next read asks the store for
    this.countEl = h("span", { class: "count", testid: "inbox-count" }, "0");
    this.badge = h(
      "a",
      { class: "pill tone-wait inbox-link", href: "#/inbox", testid: "inbox-link", title: "Runs that need someone: a signal to send, a tool or function to provide" },
      "Inbox ",
      this.countEl,
    );
    this.refreshSoon = throttle(() => this.refresh(), 700);
  }

  /** Live events arrived: read the list again if one may start or end a wait. */
  onEvents(events) {
    const touching = events.filter(touchesWaits);
    if (!touching.length) return;
    for (const ev of touching) {
      if (ev.wal_seq == null) continue;
      const engine = Math.floor((ev.wal_seq - 1) / ENGINE_SEQS);
      const had = this.wantSeqs.get(engine);
      if (had == null || ev.wal_seq > had) this.wantSeqs.set(engine, ev.wal_seq);
    }
    this.refreshSoon();
  }

  async refresh() {
    const q = new URLSearchParams({ status: "waiting", limit: String(INBOX_PAGE) });
    for (const seq of this.wantSeqs.values()) q.append("min_seq", String(seq));
    try {
      const data = await api(`api/runs?${q}`);
      this.runs = data.runs || [];
      this.count = (data.counts && data.counts.waiting) || 0;
      this.loaded = true;
      this.renderBadge();
      if (this.view) this.render();
    } catch (err) {
      this.onError(err);
    }
  }

  renderBadge() {
    this.countEl.textContent = String(this.count);
    this.badge.classList.toggle("inbox-empty", this.count === 0);
    this.badge.dataset.count = String(this.count);
  }

  /** Show the inbox in `root` (the #/inbox route). */
  mount(root) {
    this.view = root;
    this.render();
    this.refresh();
  }

  unmount() {
    this.view = null;
  }

  render() {
    if (!this.view) return;
    const now = Date.now() / 1000;
    const items = this.runs.map((run) =>
      h(
        "li",
        { class: "inbox-item card", testid: "inbox-item", dataset: { runId: run.run_id } },
        h(
          "div",
          { class: "inbox-head" },
          h("a", { class: "inbox-run", href: `#/run/${encodeURIComponent(run.run_id)}`, testid: "inbox-run-link" }, run.name || run.run_id),
          h("span", { class: "muted small" }, `${runNo(run) ?? ""} · `, timeEl(run.created_at, ago(run.created_at, now))),
          h("span", { class: "pill pill-sm tone-wait" }, "waiting"),
        ),
        h(
          "ul",
          { class: "inbox-waits" },
          (run.waiting_for || []).map((w) =>
            h(
              "li",
              { class: "inbox-wait", testid: "inbox-wait", dataset: { kind: w.kind, name: w.name, step: w.step || "" } },
              w.kind === "signal"
                ? ["waits for ", h("strong", null, `signal ${w.name}`), w.step ? ` in step ${w.step}` : null, " · ", h("a", { href: `#/run/${encodeURIComponent(run.run_id)}`, testid: "inbox-answer" }, "answer it")]
                : ["held: ", h("strong", null, `${w.kind} ${w.name}`), w.step ? ` in step ${w.step}` : null, h("div", { class: "muted small" }, w.reason || "")],
            ),
          ),
        ),
      ),
    );
    const more = this.count > this.runs.length ? h("p", { class: "muted small" }, `${this.count - this.runs.length} more not shown.`) : null;
    fill(
      this.view,
      h(
        "section",
        { class: "inbox", testid: "inbox" },
        h("h1", null, "Inbox ", h("span", { class: "muted" }, `(${this.count})`)),
        h("p", { class: "muted" }, "Runs that need someone: every step still running waits for a signal to be sent, or for an operator to enable a tool or register a function."),
        items.length ? h("ul", { class: "inbox-list", testid: "inbox-list" }, items) : h("div", { class: "empty", testid: "inbox-empty" }, this.loaded ? "Nothing needs you: no run is waiting." : "Loading…"),
        more,
      ),
    );
  }
}
