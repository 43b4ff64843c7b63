// The live activity tail: the newest events first, pausable, filtered by
// run: the run page open (it follows it), a run picked, or all. By default it
// shows run-level events, told as sentences (run started / ended, step
// started / finished / failed / retried, waiting for a signal and receiving
// it, a model call's tokens, tool output); the kernel's detail (dispatches,
// blocked, woke, the tasks that are not steps) is behind the "kernel detail"
// toggle, where the per-dispatch `step` events can be hidden again. The DOM
// holds at most TAIL_ROWS rows; new events are added once per animation frame.

import { clock, compact, fill, h, runNo, stamp, statusWord, tone } from "./dom.js";

export const TAIL_ROWS = 250;

/**
 * A run-level event told as a sentence: `{text, tone}`, or null for the
 * kernel's detail. Steps are the plan's (a worker task and its step id).
 * `waits`: what each task (`run:ltid`) waits for, kept across the events
 * told in order, so a worker woken from a signal wait says it received it.
 */
export function runLevel(ev, waits = null) {
  const d = ev.data || {};
  const step = ev.step_id || d.step || (ev.task_kind === "worker" && ev.task ? ev.task.replace(/^worker:/, "") : null);
  switch (ev.kind) {
    case "run.started":
      return { text: "run started", tone: "live" };
    case "run.finished": {
      const word = d.ok ? "succeeded" : statusWord(ev.label);
      return { text: `run ${word}`, tone: tone(word) };
    }
    case "retry":
      return { text: `step ${step} retried (attempt ${d.attempt} failed; next in ${d.delay_s ?? 0} s)`, tone: "warn" };
    case "tool.output":
      return { text: `step ${step}: ${d.message ?? d.text ?? d.line ?? compact(d, 120)}`, tone: d.level === "warning" ? "warn" : "idle" };
    case "tool.finished":
      return d.ok ? null : { text: `step ${step} attempt failed: ${(d.error && d.error.message) || ev.label}`, tone: "bad" };
    case "llm.usage": {
      const usd = d.cost_usd ? ` · $${Number(d.cost_usd).toFixed(4)}` : "";
      return step ? { text: `step ${step}: model call, ${d.total_tokens ?? "?"} tokens${usd}`, tone: "idle" } : null;
    }
    default:
      break;
  }
  if (ev.task_kind !== "worker" || !step) return null;
  if (waits && (ev.kind === "exit" || ev.kind === "crash" || ev.kind === "cancelled")) waits.delete(`${ev.run}:${ev.ltid}`);
  switch (ev.kind) {
    case "spawned":
      return { text: `step ${step} started`, tone: "live" };
    case "exit": // d.ok: the step's outcome (its worker ends well either way)
      return d.ok === false ? { text: `step ${step} failed`, tone: "bad" } : { text: `step ${step} finished`, tone: "ok" };
    case "crash":
      return { text: `step ${step} failed: ${ev.label}`, tone: "bad" };
    case "cancelled":
      return { text: `step ${step} cancelled`, tone: "idle" };
    case "blocked": {
      const signal = /signal/.test(ev.label || "");
      if (waits && signal) waits.set(`${ev.run}:${ev.ltid}`, ev.label);
      else if (waits) waits.delete(`${ev.run}:${ev.ltid}`);
      return signal ? { text: `step ${step} ${ev.label}`, tone: "wait" } : null;
    }
    case "woke": {
      const was = waits && waits.get(`${ev.run}:${ev.ltid}`);
      if (waits) waits.delete(`${ev.run}:${ev.ltid}`);
      const m = was && was.match(/signal\s+(\S+)/);
      return m ? { text: `step ${step} received signal ${m[1]}`, tone: "live" } : null;
    }
    default:
      return null;
  }
}

const KIND_TONE = {
  spawned: "live",
  step: "idle",
  blocked: "wait",
  woke: "live",
  exit: "ok",
  crash: "bad",
  cancelled: "idle",
  "tool.started": "live",
  "tool.output": "idle",
  "tool.finished": "ok",
  retry: "warn",
  "llm.usage": "idle",
  "run.started": "live",
  "run.finished": "ok",
};

export class Tail {
  constructor(root, { live, runName, openRun, onFilter }) {
    this.root = root;
    this.live = live;
    this.runName = runName; // run_id -> {short, long} display names
    this.openRun = openRun;
    this.onFilter = onFilter;
    this.paused = false;
    this.hideSteps = false;
    this.kernel = false; // kernel detail shown
    this.runFilter = null;
    this.following = false; // the filter is the open run page's run
    this.told = new WeakMap(); // event -> its sentence (null: kernel detail)
    this.waits = new Map(); // what each task waits for (runLevel)
    this.missed = 0;
    this.pending = [];
    this.build();
  }

  build() {
    this.pauseBtn = h(
      "button",
      { class: "btn btn-ghost btn-sm", testid: "tail-pause", "aria-pressed": "false", onclick: () => this.setPaused(!this.paused) },
      "Pause",
    );
    this.filterSel = h("select", {
      class: "select-sm",
      testid: "tail-run-filter",
      "aria-label": "Filter activity by run",
      onchange: () => {
        this.setFilter(this.filterSel.value || null);
        this.onFilter(this.runFilter);
      },
    });
    this.stepsBox = h("input", {
      type: "checkbox",
      testid: "tail-hide-steps",
      onchange: () => {
        this.hideSteps = this.stepsBox.checked;
        this.rebuild();
      },
    });
    this.kernelBox = h("input", {
      type: "checkbox",
      testid: "tail-kernel",
      onchange: () => {
        this.kernel = this.kernelBox.checked;
        this.stepsLabel.hidden = !this.kernel;
        this.rebuild();
      },
    });
    this.stepsLabel = h("label", { class: "check small", hidden: true }, this.stepsBox, "hide dispatches");
    this.note = h("span", { class: "muted small", testid: "tail-note" });
    this.list = h("ol", { class: "tail-list", testid: "activity-tail", "aria-live": "off" });
    this.emptyEl = h("div", { class: "empty", testid: "tail-empty" }, "Waiting for activity…");
    fill(
      this.root,
      h(
        "div",
        { class: "pane-head" },
        h("h2", null, "Activity"),
        h("span", { class: "live-dot", title: "live feed" }),
        h("div", { class: "spacer" }),
        this.pauseBtn,
      ),
      h(
        "div",
        { class: "tail-controls" },
        this.filterSel,
        h("label", { class: "check small", title: "Show every kernel event: dispatches, blocks, wake-ups, all tasks" }, this.kernelBox, "kernel detail"),
        this.stepsLabel,
        this.note,
      ),
      h("div", { class: "tail-scroll" }, this.list, this.emptyEl),
    );
    this.updateFilterOptions([]);
  }

  /** Refill the run filter's options from the known runs. */
  updateFilterOptions(runs) {
    if (runs) this.known = runs;
    const cur = this.runFilter;
    const label = (r) => `${this.following && r.run_id === cur ? "This run: " : ""}${r.name || r.run_id} ${runNo(r) ?? ""}`;
    const opts = [h("option", { value: "" }, "All runs")];
    let seen = false;
    for (const r of (this.known || []).slice(0, 100)) {
      if (r.run_id === cur) seen = true;
      opts.push(h("option", { value: r.run_id }, label(r)));
    }
    if (cur && !seen) opts.push(h("option", { value: cur }, label({ run_id: cur })));
    fill(this.filterSel, opts);
    this.filterSel.value = cur || "";
  }

  /** Refresh the run tags of the rows shown (run numbers arrive with the runs list). */
  relabel() {
    for (const tag of this.list.querySelectorAll(".run-tag")) {
      const label = this.runName(tag.parentElement.dataset.runId);
      tag.textContent = label.short;
      tag.title = label.long;
    }
  }

  /** Show run `runId`'s events (null: every run's); `following`: it is the open run page's. */
  setFilter(runId, { following = false } = {}) {
    if (runId === this.runFilter && following === this.following) return;
    const changed = runId !== this.runFilter;
    this.runFilter = runId;
    this.following = following;
    this.root.dataset.following = String(following);
    this.root.dataset.runFilter = runId || "";
    this.updateFilterOptions();
    if (changed) this.rebuild();
  }

  /** The sentence of `ev` (null: kernel detail), told once, in the order events came. */
  tell(ev) {
    let told = this.told.get(ev);
    if (told === undefined) {
      told = runLevel(ev, this.waits);
      this.told.set(ev, told);
    }
    return told;
  }

  setPaused(p) {
    this.paused = p;
    this.pauseBtn.textContent = p ? "Resume" : "Pause";
    this.pauseBtn.setAttribute("aria-pressed", String(p));
    this.root.classList.toggle("paused", p);
    if (!p) this.rebuild();
    this.updateNote();
  }

  accepts(ev) {
    if (this.runFilter && ev.run !== this.runFilter) return false;
    if (!this.kernel) return this.tell(ev) !== null;
    if (this.hideSteps && ev.kind === "step") return false;
    return true;
  }

  /** New events (already applied to the live model); called per frame. */
  push(events) {
    for (const e of events) this.tell(e); // in order: a wake-up is told after its wait
    const mine = events.filter((e) => this.accepts(e));
    if (!mine.length) return;
    if (this.paused) {
      this.missed += mine.length;
      this.updateNote();
      return;
    }
    const frag = document.createDocumentFragment();
    const start = Math.max(0, mine.length - TAIL_ROWS);
    for (let i = mine.length - 1; i >= start; i--) frag.append(this.row(mine[i]));
    this.list.prepend(frag);
    while (this.list.childElementCount > TAIL_ROWS) this.list.lastElementChild.remove();
    this.updateNote();
  }

  rebuild() {
    this.missed = 0;
    const all = this.live.events;
    const rows = [];
    for (let i = all.length - 1; i >= 0 && rows.length < TAIL_ROWS; i--) {
      if (this.accepts(all[i])) rows.push(this.row(all[i]));
    }
    fill(this.list, rows);
    this.updateNote();
  }

  updateNote() {
    const n = this.list.childElementCount;
    this.note.textContent = this.paused
      ? `paused${this.missed ? ` · ${this.missed} new` : ""}`
      : n
        ? `${n}${n >= TAIL_ROWS ? "+" : ""} events`
        : "";
    this.emptyEl.hidden = n > 0;
    // The feed holds what happened since the page opened: a run filtered on
    // that was quiet since (a finished run) has its history in its timeline.
    this.emptyEl.textContent = this.runFilter
      ? "Nothing from this run since the page opened: its steps are in the run's timeline."
      : "Waiting for activity…";
  }

  row(ev) {
    const runLabel = ev.run ? this.runName(ev.run) : null;
    const told = this.tell(ev);
    return h(
      "li",
      {
        class: `tail-row kind-${ev.kind.replace(".", "-")}${told ? " run-level" : ""}`,
        testid: "tail-row",
        dataset: { kind: ev.kind, level: told ? "run" : "kernel", runId: ev.run || "", seq: String(ev.seq), engine: String(ev.engine ?? 0) },
        title: `engine ${ev.engine ?? 0} · seq ${ev.seq} · WAL ${ev.wal_seq} · task ${ev.task_id}${ev.ltid != null ? ` (ltid ${ev.ltid})` : ""}${
          ev.data && Object.keys(ev.data).length ? `\n${compact(ev.data, 400)}` : ""
        }`,
        onclick: ev.run ? () => this.openRun(ev.run) : null,
      },
      h("time", { class: "t", title: stamp(ev.ts) }, clock(ev.ts)),
      h("span", { class: `kind tone-${told ? told.tone : KIND_TONE[ev.kind] || tone(ev.kind)}` }, ev.kind),
      told
        ? h("span", { class: "what", testid: "tail-what", title: told.text }, told.text)
        : h(
            "span",
            { class: "what", testid: "tail-what" },
            h("span", { class: `task tk-${ev.task_kind}` }, ev.task || `task ${ev.task_id}`),
            " ",
            h("span", { class: "label" }, ev.label),
          ),
      runLabel && !this.runFilter ? h("span", { class: "run-tag", title: runLabel.long }, runLabel.short) : null,
    );
  }
}
