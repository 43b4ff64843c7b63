// The runs list: status chips with counts, a search bar (name, text in the
// inputs, a created-at range: `?name=&q=&since=&until=` of GET /api/runs,
// kept in the URL hash), newest runs first, paged by `before`, refreshed
// over HTTP and patched live from the activity feed.
// A refresh prompted by events asks for the store at least at their WAL seq
// (`?min_seq=`), so a run that just started or finished is in the answer.
// With a filter on, bulk actions act on every run it selects (not only the
// page shown): "Cancel N runs" (those pending or running) and "Re-run N
// failed runs" (each from its failed steps), after a confirmation naming N;
// the runs are listed page by page, the requests sent BULK_CONCURRENCY at a
// time, and what was done and refused is reported.

import { api, rerunRun } from "./api.js";
import { waitLabel } from "./inbox.js";
import {
  ago,
  confirmDialog,
  duration,
  fill,
  h,
  pressed,
  RUN_STATUSES,
  runNo,
  slotState,
  TERMINAL_RUN,
  throttle,
  timeEl,
  toast,
  tone,
  whenReleased,
} from "./dom.js";

const PAGE = 50;
/** Requests a bulk action has in flight at once. */
const BULK_CONCURRENCY = 4;
/** Most runs one bulk action acts on (the confirmation says when the filter selects more). */
const BULK_MAX = 1000;
/** Runs a page of the bulk action's listing holds (the API's most). */
const BULK_PAGE = 500;
/** The bulk actions: the statuses they act on and what they do to a run. */
const BULK = {
  cancel: {
    statuses: ["pending", "running"],
    label: (n) => `Cancel ${n} run${n === 1 ? "" : "s"}`,
    doing: "Cancelling",
    done: "cancelled",
    run: (id) => api(`api/runs/${encodeURIComponent(id)}/cancel`, { method: "POST" }),
  },
  rerun: {
    statuses: ["failed"],
    label: (n) => `Re-run ${n} failed run${n === 1 ? "" : "s"}`,
    doing: "Re-running",
    done: "re-run",
    run: (id) => rerunRun(id),
  },
};
/** How long typing pauses before the list is asked again, in milliseconds. */
const SEARCH_DEBOUNCE_MS = 300;
const TEXT_FILTERS = ["name", "q"];
const TIME_FILTERS = ["since", "until"];

/** The API's query for the route's filters (local date-times sent with their zone, as UTC). */
function filterQuery(route, q) {
  for (const k of TEXT_FILTERS) if (route[k]) q.set(k, route[k]);
  for (const k of TIME_FILTERS) {
    const d = route[k] ? new Date(route[k]) : null;
    if (d && !isNaN(d)) q.set(k, d.toISOString());
  }
  return q;
}

/** The filters of a route, as one comparable string. */
function filterKey(route) {
  return JSON.stringify([route.status || null, ...[...TEXT_FILTERS, ...TIME_FILTERS].map((k) => route[k] || null)]);
}
/** Seqs an engine owns: engine i writes seqs i * 2^40 + 1 .. (i + 1) * 2^40 (tiffany/wire/shards.py). */
const ENGINE_SEQS = 2 ** 40;

export class RunsPane {
  constructor(root, { live, route, navigate, onError, onLoaded }) {
    this.root = root;
    this.live = live;
    this.route = route; // () => {runId, status}
    this.navigate = navigate;
    this.onError = onError;
    this.onLoaded = onLoaded;
    this.runs = [];
    this.byId = new Map();
    this.counts = {};
    this.nextBefore = null;
    this.sentMs = 0;
    this.loading = false;
    this.asked = new Set();
    // The WAL seqs the next refresh asks the store to have reached, one an
    // engine (each engine's seqs lie in a range of their own: 2^40 apart).
    this.wantSeqs = new Map();
    this.refreshSoon = throttle(() => this.refresh(), 700);
    this.renderSoon = throttle(() => this.render(), 250); // live patches: 4 redraws/s at most
    this.renderReleased = () => this.render(); // the redraw a pressed pointer put off
    this.build();
  }

  build() {
    this.chips = h("div", { class: "chips", role: "tablist", testid: "status-chips" });
    this.list = h("ul", { class: "runs-list", testid: "runs-list" });
    this.more = h(
      "button",
      { class: "btn btn-ghost more", testid: "runs-more", hidden: true, onclick: () => this.loadMore() },
      "Older runs",
    );
    this.empty = h("div", { class: "empty", testid: "runs-empty", hidden: true });
    this.bulkBar = h("div", { class: "bulk-bar", testid: "bulk-bar", hidden: true });
    this.bulk = null; // the bulk action under way, or its report: {verb, done, refused, total, busy}
    fill(
      this.root,
      h(
        "div",
        { class: "pane-head" },
        h("h2", null, "Runs"),
        h(
          "a",
          {
            class: "btn btn-primary btn-sm",
            href: "#/new",
            testid: "new-run-button",
            onclick: (e) => {
              e.preventDefault();
              this.navigate({ view: "new" });
            },
          },
          "+ New run",
        ),
      ),
      this.buildFilters(),
      this.chips,
      this.bulkBar,
      h("div", { class: "runs-scroll" }, this.list, this.empty, this.more),
    );
  }

  /** The search bar: name, inputs text, created from/to; each change goes to the hash. */
  buildFilters() {
    const route = this.route();
    this.inputs = {};
    const changed = (k, el) => {
      clearTimeout(this.searchTimer);
      const apply = () => {
        if ((this.route()[k] || "") === el.value) return;
        this.navigate({ [k]: el.value || null }, { replace: true });
        this.runs = [];
        this.render();
        this.refresh();
      };
      if (el.type === "search") this.searchTimer = setTimeout(apply, SEARCH_DEBOUNCE_MS);
      else apply();
    };
    const input = (k, attrs) => {
      const el = h("input", { class: "text-input input-sm", testid: `filter-${k}`, ...attrs });
      el.value = route[k] || "";
      el.addEventListener("input", () => changed(k, el));
      el.addEventListener("change", () => changed(k, el));
      this.inputs[k] = el;
      return el;
    };
    this.clearBtn = h(
      "button",
      {
        class: "btn btn-ghost btn-sm",
        type: "button",
        testid: "filter-clear",
        onclick: () => {
          this.navigate({ name: null, q: null, since: null, until: null, status: null }, { replace: true });
          this.runs = [];
          this.render();
          this.refresh();
        },
      },
      "Clear",
    );
    return h(
      "div",
      { class: "run-filters", testid: "run-filters", role: "search" },
      input("name", { type: "search", placeholder: "name", "aria-label": "Filter runs by name" }),
      input("q", { type: "search", placeholder: "text in inputs", "aria-label": "Filter runs by text in their inputs" }),
      h(
        "div",
        { class: "filter-range" },
        h("label", { class: "small muted" }, "from ", input("since", { type: "datetime-local", "aria-label": "Created from" })),
        h("label", { class: "small muted" }, "to ", input("until", { type: "datetime-local", "aria-label": "Created until" })),
        this.clearBtn,
      ),
    );
  }

  /** Put the route's filters into the inputs (the hash changed: back, a reload, Clear). */
  syncFilters() {
    const route = this.route();
    for (const [k, el] of Object.entries(this.inputs || {})) {
      if (document.activeElement !== el && el.value !== (route[k] || "")) el.value = route[k] || "";
    }
    const active = [...TEXT_FILTERS, ...TIME_FILTERS, "status"].some((k) => route[k]);
    this.clearBtn.hidden = !active;
  }

  async refresh() {
    const route = this.route();
    const { status } = route;
    const q = filterQuery(route, new URLSearchParams({ limit: String(PAGE) }));
    if (status) q.set("status", status);
    for (const seq of this.wantSeqs.values()) q.append("min_seq", String(seq));
    this.sentMs = Date.now();
    try {
      const data = await api(`api/runs?${q}`);
      if (filterKey(this.route()) !== filterKey(route)) return; // filters changed meanwhile
      this.runs = data.runs || [];
      this.counts = data.counts || {};
      this.nextBefore = data.next_before ?? null;
      this.render();
      if (this.onLoaded) this.onLoaded(this.runs);
    } catch (err) {
      this.onError(err);
    }
  }

  async loadMore() {
    if (this.nextBefore == null || this.loading) return;
    const route = this.route();
    const { status } = route;
    const q = filterQuery(route, new URLSearchParams({ limit: String(PAGE), before: String(this.nextBefore) }));
    if (status) q.set("status", status);
    this.loading = true;
    try {
      const data = await api(`api/runs?${q}`);
      const seen = new Set(this.runs.map((r) => r.run_id));
      this.runs.push(...(data.runs || []).filter((r) => !seen.has(r.run_id)));
      this.nextBefore = data.next_before ?? null;
      this.render();
    } catch (err) {
      this.onError(err);
    } finally {
      this.loading = false;
    }
  }

  /** Ask for the store at least at WAL seq `seq` (of its engine) from the next refresh on. */
  want(seq) {
    if (seq == null || seq <= 0) return;
    const engine = Math.floor((seq - 1) / ENGINE_SEQS);
    const had = this.wantSeqs.get(engine);
    if (had == null || seq > had) this.wantSeqs.set(engine, seq);
  }

  /**
   * Live events arrived for `runIds` (called once per animation frame batch);
   * `walSeqs` are the newest WAL seqs among them, one an engine.
   */
  touched(runIds, finished, walSeqs, waits = false) {
    // A run we have not listed (new, or hidden by the filter): ask once.
    const unknown = [...runIds].some((id) => !this.asked.has(id) && !this.runs.some((r) => r.run_id === id));
    runIds.forEach((id) => this.asked.add(id));
    // `waits`: a wait for a person began or ended (the store says `waiting` or not).
    if (unknown || finished || waits) {
      for (const seq of walSeqs) this.want(seq);
      this.refreshSoon();
    }
    this.renderSoon();
  }

  statusOf(run) {
    const lr = this.live.runs.get(run.run_id);
    if (!lr || !lr.status) return run.status;
    if (TERMINAL_RUN.has(run.status)) return run.status;
    // The feed says running for any live run: only the store knows it waits for a person.
    if (run.status === "waiting" && !TERMINAL_RUN.has(lr.status)) return run.status;
    if (run.status === "pending" && !TERMINAL_RUN.has(lr.status)) {
      // A run queued behind a concurrency limit had its `run.started` but waits for its slot.
      const slot = slotState(lr);
      if (slot === "queued") return "pending";
      if (slot === "granted") return "running";
    }
    if (lr.updatedMs >= this.sentMs - 500 || TERMINAL_RUN.has(lr.status)) return lr.status;
    return run.status;
  }

  render() {
    if (pressed()) return whenReleased(this.renderReleased); // a click may be under way (dom.js)
    const route = this.route();
    const { runId, status } = route;
    const filtered = [...TEXT_FILTERS, ...TIME_FILTERS].some((k) => route[k]);
    this.syncFilters();
    const total = RUN_STATUSES.reduce((n, s) => n + (this.counts[s] || 0), 0);
    const chip = (s, label, n) =>
      h(
        "a",
        {
          class: `chip tone-${s ? tone(s) : "all"}${(status || "") === (s || "") ? " active" : ""}`,
          href: "#",
          role: "tab",
          "aria-selected": String((status || "") === (s || "")),
          testid: `status-chip-${s || "all"}`,
          dataset: { status: s || "" },
          onclick: (e) => {
            e.preventDefault();
            this.navigate({ status: s || null }, { replace: true });
            this.runs = [];
            this.render();
            this.refresh();
          },
        },
        s ? h("span", { class: `dot tone-${tone(s)}` }) : null,
        label,
        h("span", { class: "count", testid: "chip-count" }, String(n ?? 0)),
      );
    fill(
      this.chips,
      chip(null, "All", total),
      RUN_STATUSES.map((s) => chip(s, s, this.counts[s])),
    );

    const now = Date.now() / 1000;
    const query = location.hash.split("?")[1];
    const keep = query ? `?${query}` : "";
    const rows = [];
    for (const run of this.runs) {
      const st = this.statusOf(run);
      if (status && st !== status && run.status !== status) continue;
      const lr = this.live.runs.get(run.run_id);
      const end = run.ended_at ?? (TERMINAL_RUN.has(st) ? (lr && lr.lastTs) : now);
      const dur = run.started_at != null ? duration(end - run.started_at) : "";
      rows.push(
        h(
          "li",
          {
            class: `run-row${run.run_id === runId ? " selected" : ""}`,
            testid: "run-row",
            dataset: { runId: run.run_id, status: st },
          },
          h(
            "a",
            {
              // The filters stay in the hash when a run is opened.
              href: `#/run/${encodeURIComponent(run.run_id)}${keep}`,
              class: "run-link",
            },
            h("span", { class: `status-dot tone-${tone(st)}${st === "running" ? " pulse" : ""}`, title: st }),
            h(
              "span",
              { class: "run-main" },
              h("span", { class: "run-name" }, run.name || run.run_id),
              st === "waiting" && (run.waiting_for || []).length
                ? h("span", { class: "run-row-waiting", testid: "run-row-waiting" }, `waits for ${run.waiting_for.map(waitLabel).join(", ")}`)
                : null,
              h(
                "span",
                { class: "run-meta" },
                `${runNo(run) ?? "#…"} · `,
                // The age; the local date, time and zone in its tooltip.
                timeEl(run.created_at, ago(run.created_at, now), { testid: "run-row-age" }),
              ),
            ),
            h(
              "span",
              { class: "run-side" },
              h("span", { class: `status-text tone-${tone(st)}`, testid: "run-row-status" }, st),
              h("span", { class: "run-meta", testid: "run-row-elapsed", title: "elapsed" }, dur),
            ),
          ),
        ),
      );
    }
    fill(this.list, rows);
    this.renderBulk(filtered);
    this.empty.hidden = rows.length > 0;
    fill(
      this.empty,
      filtered ? "No runs match these filters." : status ? `No ${status} runs.` : "No runs yet. Start one with “New run”.",
    );
    this.more.hidden = this.nextBefore == null;
  }

  /** How many runs the filter selects that bulk action `verb` acts on (the counts are the filter's). */
  bulkCount(verb) {
    const { status } = this.route();
    return BULK[verb].statuses.filter((s) => !status || s === status).reduce((n, s) => n + (this.counts[s] || 0), 0);
  }

  /** The bulk actions' bar: shown while a filter is on. */
  renderBulk(filtered) {
    const { status } = this.route();
    const on = filtered || !!status;
    if (this.bulk && !this.bulk.busy && this.bulk.key !== filterKey(this.route())) this.bulk = null; // another filter
    const b = this.bulk;
    const buttons = on
      ? Object.keys(BULK).map((verb) => {
          const n = this.bulkCount(verb);
          return n
            ? h(
                "button",
                {
                  class: `btn btn-sm ${verb === "cancel" ? "btn-danger" : ""}`,
                  testid: `bulk-${verb}`,
                  dataset: { count: String(n) },
                  disabled: !!(b && b.busy),
                  onclick: () => this.runBulk(verb),
                },
                BULK[verb].label(n),
              )
            : null;
        })
      : [];
    const report = b
      ? h(
          "span",
          { class: `small ${b.busy ? "muted" : b.refused.length ? "error-text" : "muted"}`, testid: "bulk-report", role: "status", dataset: { busy: String(b.busy), done: String(b.done), refused: String(b.refused.length) } },
          b.busy
            ? `${BULK[b.verb].doing}… ${b.done + b.refused.length}/${b.total}`
            : `${b.done} of ${b.total} ${BULK[b.verb].done}${b.refused.length ? `; ${b.refused.length} not: ${b.refused[0].message}` : ""}`,
        )
      : null;
    if (!on && !b) {
      this.bulkBar.hidden = true;
      return;
    }
    this.bulkBar.hidden = false;
    if (!buttons.some(Boolean) && !report) {
      this.bulkBar.hidden = true;
      return;
    }
    fill(this.bulkBar, h("span", { class: "muted small" }, "filtered:"), buttons, report);
  }

  /** Every run the filter selects in `statuses`, newest first, at most `max` (and whether there were more). */
  async bulkRuns(statuses, max) {
    const route = this.route();
    const ids = [];
    for (const status of statuses) {
      if (route.status && route.status !== status) continue;
      let before = null;
      do {
        const q = filterQuery(route, new URLSearchParams({ limit: String(BULK_PAGE), status }));
        if (before != null) q.set("before", String(before));
        const page = await api(`api/runs?${q}`);
        ids.push(...(page.runs || []).map((r) => r.run_id));
        before = page.next_before ?? null;
      } while (before != null && ids.length <= max);
    }
    return { ids: ids.slice(0, max), more: ids.length > max };
  }

  /** Ask, then do bulk action `verb` to every run the filter selects. */
  async runBulk(verb) {
    const action = BULK[verb];
    const n = this.bulkCount(verb);
    const route = this.route();
    const words = [...TEXT_FILTERS, ...TIME_FILTERS].filter((k) => route[k]).map((k) => `${k} “${route[k]}”`);
    const sure = await confirmDialog({
      title: `${action.label(n)}?`,
      message: [
        h("p", { testid: "bulk-confirm-count", dataset: { count: String(n) } }, `${action.label(n)} selected by the filter${words.length ? ` (${words.join(", ")}${route.status ? `, ${route.status}` : ""})` : route.status ? ` (${route.status})` : ""}.`),
        n > BULK_MAX ? h("p", { class: "error-text small" }, `Only the newest ${BULK_MAX} are acted on; run it again for the rest.`) : null,
        verb === "rerun" ? h("p", { class: "muted small" }, "Each starts a new run that reuses the steps that succeeded.") : null,
      ],
      confirm: action.label(n),
      danger: verb === "cancel",
    });
    if (!sure) return;
    this.bulk = { verb, busy: true, done: 0, refused: [], total: n, key: filterKey(route) };
    this.render();
    try {
      const { ids } = await this.bulkRuns(action.statuses, BULK_MAX);
      this.bulk.total = ids.length;
      let next = 0;
      const worker = async () => {
        while (next < ids.length) {
          const id = ids[next++];
          try {
            await action.run(id);
            this.bulk.done++;
          } catch (err) {
            this.bulk.refused.push({ run_id: id, message: err.message || String(err) });
          }
          this.renderSoon();
        }
      };
      await Promise.all(Array.from({ length: Math.min(BULK_CONCURRENCY, ids.length) }, worker));
    } catch (err) {
      this.onError(err);
    }
    const b = this.bulk;
    b.busy = false;
    toast(`${b.done} of ${b.total} runs ${action.done}${b.refused.length ? `; ${b.refused.length} not` : ""}`, b.refused.length ? "warn" : "ok");
    this.render();
    this.refresh();
  }

  /** Insert a run we just created (`seq`: its submission's WAL seq, the refresh waits for it). */
  added(runId, name, seq) {
    this.want(seq);
    if (this.runs.some((r) => r.run_id === runId)) return;
    const now = Date.now() / 1000;
    this.runs.unshift({
      run_id: runId,
      run_no: "…",
      name,
      status: "pending",
      created_at: now,
      started_at: null,
      ended_at: null,
    });
    this.render();
    this.refreshSoon();
  }

  tick() {
    if (this.runs.some((r) => !TERMINAL_RUN.has(this.statusOf(r)))) this.render();
  }
}
