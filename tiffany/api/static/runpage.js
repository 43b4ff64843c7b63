// The run page: summary and controls (cancel, verify replay), the timeline,
// the task tree, the steps with their inputs/outputs/errors, the selected
// task's activity, and the journal. Store state comes over HTTP and is
// patched live from the activity feed between (throttled) refreshes. Each
// refresh asks for the store at least as far as the WAL record of the
// newest event seen (`?min_seq=<wal_seq>`): the API answers once the store
// has projected it, so nothing here waits on a timer for the store.
// A step waiting for a signal offers a form to send it (fields made from the
// wait's payload schema: signalform.js); once the signal is journaled (202)
// the run is read again as of the signal's seq. A run whose live steps all
// wait for a person is `waiting`: its header says for what, and a step the
// engine holds for a tool or function says why.
// The plan's graph: every step, those not started too, a dynamic step's
// children marked with the step that added them (graph.js). An agent step's
// conversation: each turn's text, tool calls and tokens (conversation.js).
// A finished run can be re-run: from its failed steps ("Re-run from failure")
// or from any step ("Re-run from here"); once the new run is journaled (201)
// the page opens it as of the answer's seq. Steps a re-run took over from an
// earlier run say so, with a link to that run.
// Where a run comes from shows in its header: the parent run and step of a
// sub-plan's child run, the schedule and tick that started it; a run queued
// behind its plan's concurrency limit says so while it waits for its slot. A
// `plan.run` step links to its child run, one for each of its attempts.
// A workflow run (a `@workflow` generator function: its entry's kind is
// `workflow`) has no plan: its page shows the workflow's name, its task
// tree (the root task is the function, each child named by its function),
// each live task's current call (the store's `blocked_on`: the call it
// yielded and waits on), and the signals its tasks wait for, each with the
// form that sends it (signalform.js). A wait's schema is told to the engine
// as the code reaches it, not kept in the store: the page asks the engine
// (`GET /api/runs/{id}/waits`) whenever the waits change, and draws the
// form's fields from the schema (the JSON box until it is known, or when
// the wait declares none); the engine's refusal of a payload names the field.
// Its calls and steps are listed with the line of code that made each (the
// feed's, live; every one after "Verify replay"); a failed workflow run is
// re-run from its failed call ("Re-run from failure"), and, once verified,
// from any of its calls ("Re-run from tool_2"): a fork of its journal.
// A run whose steps (or a workflow's calls) use the memory (`memory.*`
// tools) has a Memory card: what each of them read or wrote, each item
// linked to its page (memory.js).

import { api, ApiError, rerunRun, runWaits, sendSignal } from "./api.js";
import {
  clock,
  compact,
  duration,
  fill,
  h,
  pressed,
  pretty,
  runNo,
  slotState,
  stamp,
  stateLabel,
  taskState,
  statusWord,
  TERMINAL_RUN,
  TERMINAL_TASK,
  throttle,
  timeEl,
  toast,
  tone,
  whenReleased,
} from "./dom.js";
import { Conversations, renderConversation } from "./conversation.js";
import { renderGraph } from "./graph.js";
import { memoryOfRun, renderRunMemory } from "./memory.js";
import { waitLabel } from "./inbox.js";
import { Journal } from "./journal.js";
import { mergeTasks, treeOrder } from "./live.js";
import { moreButton, renderTimeline } from "./timeline.js";
import { argsBlock, attemptsBlock, liveLinesOf } from "./steplog.js";
import { buildSignalForm } from "./signalform.js";
import { renderVerify } from "./verify.js";

/** Rows drawn at first in the tree, timeline and steps; "show more" adds MORE_ROWS. */
const FIRST_ROWS = 150;
const MORE_ROWS = 500;
const TASK_EVENTS = 60;
/** How many journal records before a cancelled run's last one are read for its cancel reason. */
const CANCEL_LOOKBACK = 1000;
const MAX_RENDER_GAP_MS = 1000;

export class RunPage {
  constructor(root, runId, { live, onError, onRunChanged, openRun = null, minSeq = null }) {
    this.root = root;
    this.runId = runId;
    this.live = live;
    this.onError = onError;
    this.onRunChanged = onRunChanged;
    // Open another run's page (`seq`: the WAL seq to read it at, from a 201).
    this.openRun = openRun || ((id) => (location.hash = `#/run/${encodeURIComponent(id)}`));
    this.detail = null;
    this.sentMs = 0;
    this.selected = null;
    this.collapsed = new Set();
    this.limits = { tree: FIRST_ROWS, timeline: FIRST_ROWS, steps: FIRST_ROWS };
    this.verify = null;
    // Signal forms by `${step_id}\n${name}`, kept across renders (typed text, focus).
    this.signalForms = new Map();
    // Steps whose args show as the plan's template rather than resolved.
    this.templates = new Set();
    // A re-run being asked for, and the last refusal: `from` is the step
    // (null: from the failed steps), so the error shows beside its control.
    this.rerun = { busy: false, from: null, error: null };
    this.closed = false;
    this.queued = false;
    // The WAL seq the next refresh asks the store to have reached: what
    // submitted the run, else the newest event the feed showed of it.
    this.wantSeq = minSeq ?? live.runs.get(runId)?.walSeq ?? null;
    this.refreshSoon = throttle(() => this.refresh(), 500);
    this.talks = new Conversations(runId, { onError, onLoaded: () => this.render() });
    this.renderReleased = () => this.render(); // the redraw a pressed pointer put off
    this.build();
    this.refresh();
    this.timer = setInterval(() => {
      if (this.isLive()) this.render();
    }, 250);
    this.poll = setInterval(() => {
      if (this.isLive()) this.refresh();
    }, 3000);
  }

  destroy() {
    this.closed = true;
    clearInterval(this.timer);
    clearInterval(this.poll);
  }

  status() {
    const d = this.detail;
    const lr = this.live.runs.get(this.runId);
    if (!d) return lr?.status || "pending";
    if (TERMINAL_RUN.has(d.status)) return d.status;
    // The feed says running for any live run: only the store knows it waits for a person.
    if (d.status === "waiting" && !(lr && TERMINAL_RUN.has(lr.status))) return d.status;
    if (d.status === "pending" && !(lr && TERMINAL_RUN.has(lr.status))) {
      // Queued behind a concurrency limit: the feed's `run.started` came at
      // submission; the run starts when its planner wakes with its slot.
      return slotState(lr) === "granted" ? "running" : "pending";
    }
    if (lr && lr.status && (lr.updatedMs >= this.sentMs - 500 || TERMINAL_RUN.has(lr.status))) return lr.status;
    return d.status;
  }

  isLive() {
    return !this.closed && this.detail && !TERMINAL_RUN.has(this.detail.status);
  }

  build() {
    this.headEl = h("section", { class: "card run-head", testid: "run-header" });
    this.verifyEl = h("div", { class: "verify-slot", testid: "verify-slot" });
    this.errorEl = h("div");
    this.timelineEl = h("div", { class: "timeline", testid: "timeline" });
    this.graphEl = h("div", { class: "graph", testid: "graph" });
    this.talkEl = h("div", { class: "talks" });
    this.treeEl = h("ul", { class: "tree", testid: "task-tree", role: "tree" });
    this.taskEl = h("div", { class: "task-detail", testid: "task-detail" });
    this.stepsEl = h("div", { class: "steps", testid: "steps" });
    this.ioEl = h("div", { class: "io" });
    this.workflowEl = h("div", { class: "workflow-body" });
    // The cards a plan run shows and a workflow run does not (and back): set once the kind is known.
    this.graphCard = card("Plan", this.graphEl, "graph-card", "steps and what they run after; click a step");
    this.stepsCard = card("Steps", this.stepsEl, "steps-card");
    this.tasksCard = card("Tasks", h("div", null, this.treeEl, this.taskEl), "tasks-card", "planner → workers → tools; click a task");
    this.callsEl = h("div", { class: "workflow-calls", testid: "workflow-calls" });
    this.workflowCard = card("Workflow", h("div", null, this.workflowEl, this.callsEl), "workflow-card", "a @workflow function: its tasks' calls and the signals they wait for");
    this.workflowCard.hidden = true;
    this.memoryEl = h("div", { class: "run-memory-body" });
    this.memoryCard = card("Memory", this.memoryEl, "memory-card", "what its memory.* steps read and wrote; click an item to open it");
    this.memoryCard.hidden = true;
    const journalEl = h("div", { class: "journal-wrap" });
    fill(
      this.root,
      h(
        "div",
        { class: "run-page", testid: "run-page", dataset: { runId: this.runId } },
        this.headEl,
        this.verifyEl,
        this.errorEl,
        this.graphCard,
        this.workflowCard,
        this.talkEl,
        card("Timeline", this.timelineEl, "timeline-card"),
        h("div", { class: "two-col" }, this.tasksCard, this.stepsCard),
        this.memoryCard,
        card("Inputs and outputs", this.ioEl, "io-card"),
        card("Journal", journalEl, "journal-card", "decoded WAL records; click a row for its payload"),
      ),
    );
    this.journal = new Journal(journalEl, this.runId, { onError: this.onError, minSeq: () => this.wantSeq });
    this.journal.load();
    this.renderHead();
  }

  /** Whether the feed has shown this run further than the store answered (the page shows older rows). */
  catchingUp() {
    const lr = this.live.runs.get(this.runId);
    if (!lr || !lr.walSeq) return false;
    if (!this.detail) return true;
    return this.storeSeq == null ? lr.walSeq > (this.detail.last_seq || 0) : lr.walSeq > this.storeSeq;
  }

  /** Ask for the store at least at WAL seq `seq` (from now on; null: nothing new). */
  want(seq) {
    if (seq != null && (this.wantSeq == null || seq > this.wantSeq)) this.wantSeq = seq;
  }

  async refresh() {
    if (this.closed) return;
    const sent = Date.now();
    const asked = this.wantSeq;
    const q = asked != null ? `?min_seq=${asked}` : "";
    try {
      const d = await api(`api/runs/${encodeURIComponent(this.runId)}${q}`);
      if (this.closed) return;
      const wasLive = this.detail && !TERMINAL_RUN.has(this.detail.status);
      this.detail = d;
      this.sentMs = sent;
      // The store has projected at least this far (the answer waited for it).
      if (asked != null && (this.storeSeq == null || asked > this.storeSeq)) this.storeSeq = asked;
      if (wasLive && TERMINAL_RUN.has(d.status)) this.onRunChanged();
      // Follow the journal while the user is at its end (at most every 2 s).
      const followed = this.detail.last_seq != null && this.detail.last_seq > this.journal.after;
      if (this.journal.done && followed && Date.now() - (this.journalAt || 0) > 2000) {
        this.journalAt = Date.now();
        this.journal.load();
      }
      this.render();
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        // With min_seq the store had projected the run's records: it does not exist.
        fill(
          this.root,
          h("section", { class: "card empty-state", testid: "run-missing" }, h("h2", null, "Run not found"), h("p", { class: "muted" }, `No run ${this.runId} in the store.`)),
        );
        this.destroy();
        return;
      }
      this.onError(err);
    }
  }

  /** Live events of this run arrived (batched per frame). */
  onEvents(events) {
    if (this.closed) return;
    for (const e of events) this.want(e.wal_seq);
    if (events.some((e) => e.kind === "run.finished")) {
      this.refresh(); // at once: the answer waits until the store has the run's end
    } else {
      this.refreshSoon();
    }
    this.render();
  }

  /**
   * Schedule a render. Renders are batched per animation frame and spaced by
   * four times the cost of the last one, so a run with thousands of tasks
   * degrades to a few updates a second instead of freezing the page.
   */
  render() {
    if (this.queued || this.closed) return;
    this.queued = true;
    const draw = () =>
      requestAnimationFrame(() => {
        this.queued = false;
        if (this.closed) return;
        if (pressed()) return whenReleased(this.renderReleased); // a click may be under way (dom.js)
        const t0 = performance.now();
        this.renderHead();
        this.renderBody();
        // The next frame's time includes style, layout and paint of this one.
        requestAnimationFrame(() => {
          const t1 = performance.now();
          this.lastRenderAt = t1;
          this.renderGapMs = Math.min(MAX_RENDER_GAP_MS, Math.max(0, t1 - t0 - 17) * 3);
        });
      });
    const wait = (this.lastRenderAt || 0) + (this.renderGapMs || 0) - performance.now();
    if (wait > 0) setTimeout(draw, wait);
    else draw();
  }

  tasks() {
    return mergeTasks(this.detail ? this.detail.tasks : [], this.live.runs.get(this.runId), this.sentMs);
  }

  renderHead() {
    const d = this.detail || {};
    const st = this.status();
    const now = Date.now() / 1000;
    const end = d.ended_at ?? (TERMINAL_RUN.has(st) ? this.live.runs.get(this.runId)?.lastTs : now);
    const finished = TERMINAL_RUN.has(st);
    const meta = (k, v, testid) => (v == null || v === "" ? null : h("div", { class: "meta", testid }, h("dt", null, k), h("dd", null, v)));
    const parts = [
      h(
        "div",
        { class: "run-title" },
        h("h1", null, d.name || this.runId),
        h("span", { class: `pill tone-${tone(st)}${st === "running" ? " pulse" : ""}`, testid: "run-status", dataset: { status: st } }, st),
        st === "pending" ? queuedBadge(d.entry) : null,
        this.catchingUp()
          ? h(
              "span",
              {
                class: "pill pill-sm tone-wait catching-up",
                testid: "store-catching-up",
                title: "The live feed is ahead of the store: the steps, outputs and journal shown are being brought up to date",
              },
              "catching up",
            )
          : null,
        h("div", { class: "spacer" }),
        this.rerunError(null, "span"),
        this.canRerun() && ((d.steps || []).some((s) => s.status === "failed") || (isWorkflow(d) && d.status === "failed"))
          ? h(
              "button",
              {
                class: "btn btn-primary",
                testid: "rerun-failed",
                disabled: this.rerun.busy,
                title: isWorkflow(d)
                  ? "Start a new run that replays this one's calls up to the one it failed at (not made again) and runs that call and what follows"
                  : "Start a new run that reuses the steps that succeeded and runs the failed ones and what depends on them",
                onclick: () => this.doRerun(null),
              },
              this.rerun.busy && this.rerun.from == null ? "Re-running…" : "Re-run from failure",
            )
          : null,
        h(
          "button",
          {
            class: "btn",
            testid: "verify-button",
            disabled: this.verifying || !finished,
            title: finished ? "Replay the run from its journal and compare every dispatch" : "Verify needs a finished run",
            onclick: () => this.doVerify(),
          },
          this.verifying ? "Verifying…" : "Verify replay",
        ),
        h(
          "button",
          {
            class: `btn btn-danger${this.confirmCancel ? " armed" : ""}`,
            testid: "cancel-button",
            disabled: finished || this.cancelling,
            onclick: () => this.doCancel(),
          },
          this.cancelling ? "Cancelling…" : this.confirmCancel ? "Really cancel?" : "Cancel",
        ),
      ),
      runOrigin(d.entry),
      !finished && (d.waiting_for || []).length
        ? h(
            "div",
            { class: "run-waiting", testid: "run-waiting-for", dataset: { count: String(d.waiting_for.length) } },
            st === "waiting" ? "Needs someone: waits for " : "Meanwhile waiting for ",
            d.waiting_for.map(waitLabel).join(", "),
          )
        : null,
      h(
        "dl",
        { class: "run-meta-grid" },
        meta("run", h("code", { class: "copy", title: "click to copy", onclick: () => navigator.clipboard?.writeText(this.runId) }, this.runId), "run-id"),
        meta("no.", runNo(d)),
        meta("kind", d.kind, "run-kind"),
        isWorkflow(d) ? meta("workflow", h("code", null, String(d.entry.workflow)), "run-workflow") : null,
        d.entry && d.entry.rerun_of && d.entry.rerun_of.run_id
          ? meta("re-run of", runLink(d.entry.rerun_of.run_id), "run-rerun-of")
          : null,
        meta("started", timeEl(d.started_at ?? d.created_at), "run-started"),
        meta("ended", timeEl(d.ended_at), "run-ended"),
        meta("duration", d.started_at != null && end != null ? duration(end - d.started_at) : null, "run-duration"),
        meta("dispatches", d.dispatches != null ? String(d.dispatches) : null),
        meta("last seq", d.last_seq != null ? String(d.last_seq) : null),
        meta("model usage", usageText(d.usage), "run-usage"),
      ),
    ];
    // Rebuilt only when it shows something new: a header replaced between a
    // click's mousedown and mouseup swallows the click (re-run, verify, cancel).
    const html = parts.map((p) => (p instanceof Element ? p.outerHTML : String(p ?? ""))).join("");
    if (html === this.headHtml) return;
    this.headHtml = html;
    fill(this.headEl, ...parts);
  }

  renderBody() {
    const d = this.detail;
    if (!d) {
      fill(this.timelineEl, h("div", { class: "empty" }, "Loading…"));
      return;
    }
    const tasks = this.tasks();
    const rows = treeOrder(tasks);
    const now = Date.now() / 1000;
    const failedSteps = new Set((d.steps || []).filter((s) => s.status === "failed").map((s) => s.step_id));
    const workflow = isWorkflow(d);
    if (workflow !== this.shownAsWorkflow) this.showKind(workflow);
    if (workflow) {
      this.renderWorkflow(d, tasks);
      this.renderCalls(tasks);
    } else this.renderGraph(d, tasks);
    this.renderTalks(d);
    renderTimeline(this.timelineEl, rows, {
      now,
      tools: new Map((d.steps || []).map((s) => [s.step_id, s.tool])),
      labels: this.talks.labels(),
      failedSteps,
      selected: this.selected,
      onSelect: (lt) => this.select(lt),
      limit: this.limits.timeline,
      onMore: () => this.more("timeline"),
    });
    this.renderTree(rows, now, failedSteps);
    this.renderTask(tasks);
    if (!workflow) this.renderSteps(d, tasks);
    this.renderMemory(memoryOfRun(d));
    this.renderErrorAndIo(d);
  }

  /** The Memory card: the rows of memoryOfRun (hidden when the run has no memory step). */
  renderMemory(rows) {
    const sig = JSON.stringify(rows);
    if (sig === this.memorySig) return; // nothing new: keep the DOM
    this.memorySig = sig;
    this.memoryCard.hidden = !rows.length;
    if (rows.length) renderRunMemory(this.memoryEl, rows);
  }

  /** Show the cards of a workflow run (true) or of a plan run (false). */
  showKind(workflow) {
    this.shownAsWorkflow = workflow;
    this.graphCard.hidden = workflow;
    this.stepsCard.hidden = workflow;
    this.workflowCard.hidden = !workflow;
    this.stepsCard.parentElement.classList.toggle("one-col", workflow);
    const hint = this.tasksCard.querySelector(".card-head .muted");
    if (hint) hint.textContent = workflow ? "the workflow's function → the tasks it started; click a task" : "planner → workers → tools; click a task";
  }

  /**
   * A workflow run's card: its name, and each signal its tasks wait for
   * (oldest first, as the store lists them) with the task that waits and
   * the form that sends it. Rebuilt only when what it shows changed (a
   * form keeps its typed text and focus across renders).
   */
  renderWorkflow(d, tasks) {
    const runLive = !TERMINAL_RUN.has(d.status);
    const waits = runLive ? (d.waiting_for || []).filter((w) => w.kind === "signal" && typeof w.name === "string") : [];
    const names = new Map(tasks.map((t) => [t.ltid, t.name]));
    const waited = waits.map((w) => w.name).sort().join(",");
    if (waited && waited !== this.schemasFor) this.askSchemas(waited);
    const schemas = waited === this.schemasFor ? this.waitSchemas : null;
    const schemaOf = (name) => (schemas && schemas.has(name) ? schemas.get(name) : null);
    const sig = `${d.entry.workflow}|${JSON.stringify([d.inputs, d.outputs])}|${d.status}|${waits.map((w) => `${w.task}:${w.name}`).join(",")}|${waits.map((w) => names.get(w.task) || "").join(",")}|${waits.map((w) => JSON.stringify(schemaOf(w.name))).join(",")}`;
    if (sig === this.workflowSig) return;
    this.workflowSig = sig;
    const formKey = (w) => `task ${w.task}${schemaOf(w.name) ? " (schema)" : ""}`;
    const keys = new Set(waits.map((w) => `${formKey(w)}\n${w.name}`));
    for (const key of this.signalForms.keys()) if (!keys.has(key)) this.signalForms.delete(key);
    const active = document.activeElement;
    const focus = active && active !== document.body && this.workflowEl.contains(active) ? active : null;
    const caret = focus && focus.tagName === "TEXTAREA" ? [focus.selectionStart, focus.selectionEnd] : null;
    fill(
      this.workflowEl,
      h(
        "div",
        { class: "workflow-head" },
        h("span", { class: "pill pill-sm tone-idle", testid: "workflow-kind" }, "workflow"),
        " ",
        h(
          "span",
          { class: "workflow-call" },
          h("strong", { testid: "workflow-name" }, String(d.entry.workflow)),
          h("span", { testid: "workflow-inputs" }, `(${callArgs(d.inputs)})`),
          d.status === "succeeded" ? h("span", { class: "muted" }, " → ", h("span", { testid: "workflow-outputs" }, compact(d.outputs, 200))) : null,
        ),
      ),
      waits.length
        ? waits.map((w) =>
            h(
              "div",
              { class: "step workflow-wait tone-border-wait", testid: "workflow-wait", dataset: { signal: w.name, ltid: String(w.task ?? "") } },
              h(
                "div",
                { class: "step-head" },
                h("span", { class: "status-dot tone-wait" }),
                h("span", { class: "pill pill-sm tone-wait waiting-badge", testid: "step-waiting", dataset: { waiting: w.name } }, `waiting for ${w.name}`),
                w.task != null ? h("span", { class: "muted small" }, ` in task ${names.get(w.task) || "?"} #${w.task}`) : null,
              ),
              this.signalForm(formKey(w), w.name, schemaOf(w.name)),
            ),
          )
        : h("div", { class: "muted small", testid: "workflow-no-waits" }, runLive ? "No task waits for a signal." : "The run has ended."),
    );
    if (focus && focus.isConnected && document.activeElement !== focus) {
      focus.focus({ preventScroll: true });
      if (caret) focus.setSelectionRange(caret[0], caret[1]);
    }
  }

  /**
   * A workflow run's calls and steps with the line of the user's code that
   * made each: from the live feed (each `step` event of the workflow's tasks
   * carries `data.source`: only the calls made while this page listened),
   * or, once "Verify replay" ran, from the replay's report (`calls`: every
   * call, against the code as it is now). Lines are not journaled.
   */
  renderCalls(tasks) {
    const names = new Map(tasks.map((t) => [t.ltid, t.name]));
    const replayed = Array.isArray(this.verifyCalls) ? this.verifyCalls : null;
    const rows = replayed
      ? replayed.map((c) => ({ task: c.task, call: c.call, source: c.source, dispatch: c.dispatch }))
      : this.live.events
          .filter((e) => e.run === this.runId && e.kind === "step" && e.data && typeof e.data.source === "string")
          .map((e) => ({ task: e.ltid, call: e.label, source: e.data.source, dispatch: null }));
    // A finished run's replayed calls are numbered as the run numbers its
    // tool and child calls (tool_1, child_2: workflows/rerun.py), in order:
    // each can be re-run from (a fork of the journal before it).
    const rerunnable = replayed && this.canRerun();
    let k = 0;
    for (const r of rows) {
      const m = /^call (tool|child):/.exec(r.call || "");
      r.id = m ? `${m[1]}_${++k}` : null;
    }
    const rr = this.rerun;
    const sig = `${replayed ? "replay" : "live"}|${rows.length}|${rows.length ? rows[rows.length - 1].source : ""}|${rerunnable}|${rr.busy}|${rr.from}|${rr.error ? rr.error.message : ""}`;
    if (sig === this.callsSig) return;
    this.callsSig = sig;
    if (!rows.length) {
      fill(this.callsEl);
      return;
    }
    fill(
      this.callsEl,
      h(
        "div",
        { class: "workflow-calls-head small muted", testid: "workflow-calls-from", dataset: { from: replayed ? "replay" : "live" } },
        replayed ? `Calls and steps, from the replay (${rows.length}):` : `Calls and steps seen live (${rows.length}):`,
      ),
      h(
        "ol",
        { class: "workflow-call-list" },
        rows.slice(-CALLS_SHOWN).map((r) =>
          h(
            "li",
            { class: "workflow-call-row small", testid: "workflow-call", dataset: { ltid: String(r.task ?? ""), dispatch: r.dispatch != null ? String(r.dispatch) : "" } },
            h("code", { testid: "workflow-call-label" }, r.call),
            h("span", { class: "muted" }, ` in ${names.get(r.task) || "task"} #${r.task ?? "?"} at `),
            h("code", { class: "workflow-call-source", testid: "workflow-call-source", title: r.source }, shortSource(r.source)),
            rerunnable && r.id
              ? [
                  " ",
                  h(
                    "button",
                    {
                      class: "btn btn-sm btn-ghost step-rerun",
                      testid: "rerun-from-call",
                      dataset: { call: r.id },
                      disabled: rr.busy,
                      title: `Start a new run that replays the calls before ${r.id} (not made again) and runs ${r.id} and what follows`,
                      onclick: () => this.doRerun(r.id),
                    },
                    rr.busy && rr.from === r.id ? "Re-running…" : `Re-run from ${r.id}`,
                  ),
                  this.rerunError(r.id, "div"),
                ]
              : null,
          ),
        ),
      ),
    );
  }

  /**
   * Ask the engine for the schemas of the signals a workflow run waits for
   * (`waited`: their names, sorted and joined), once per set of names; the
   * card is drawn again when they come. A refusal (the run ended meanwhile)
   * leaves the JSON box.
   */
  async askSchemas(waited) {
    if (this.schemasAsked === waited) return;
    this.schemasAsked = waited;
    let schemas = new Map();
    try {
      const answer = await runWaits(this.runId);
      for (const s of answer.signals || []) schemas.set(s.name, s.schema && typeof s.schema === "object" ? s.schema : null);
    } catch {
      schemas = new Map();
    }
    if (this.schemasAsked !== waited) return;
    this.schemasFor = waited;
    this.waitSchemas = schemas;
    if (this.detail && isWorkflow(this.detail)) this.renderWorkflow(this.detail, this.tasks());
  }

  renderGraph(d, tasks) {
    const steps = d.steps || [];
    // A step pending in the store whose worker the feed shows live is running (as in the steps card).
    const workers = new Map(tasks.filter((t) => t.kind === "worker" && t.step_id).map((t) => [t.step_id, t]));
    const statusOf = (s) => {
      const w = s.status === "pending" ? workers.get(s.step_id) : null;
      return w && !TERMINAL_TASK.has(w.state) ? "running" : s.status;
    };
    const sig = steps.map((s) => `${s.step_id}:${statusOf(s)}:${s.waiting || ""}:${(s.after || []).join("+")}`).join(",");
    if (sig === this.graphSig) return;
    this.graphSig = sig;
    renderGraph(this.graphEl, steps, { statusOf, onSelect: (id) => this.showStep(id) });
  }

  /** Scroll to step `id`'s row and mark it a moment. */
  showStep(id) {
    const row = [...this.stepsEl.querySelectorAll("[data-testid=step-row]")].find((r) => r.dataset.stepId === id);
    if (!row) return;
    row.scrollIntoView({ block: "center", behavior: "smooth" });
    row.classList.remove("flash");
    void row.offsetWidth; // restart the animation
    row.classList.add("flash");
  }

  /** A card per agent step: its conversation. */
  renderTalks(d) {
    this.talks.sync(d);
    const agents = Conversations.steps(d);
    const outputs = Object.fromEntries((d.steps || []).filter((s) => s.status === "succeeded").map((s) => [s.step_id, s.output]));
    const key = `${this.talks.version}|${agents.map((s) => s.step_id).join(",")}`;
    if (key === this.talksKey) return; // keep open <details> while nothing changed
    this.talksKey = key;
    fill(
      this.talkEl,
      agents.map((s) => {
        const body = h("div");
        renderConversation(body, this.talks.get(s.step_id), { inputs: d.inputs, outputs });
        return card(`Conversation · ${s.step_id}`, body, "conversation-card", "the agent's turns: its text, the tools it called and what they returned");
      }),
    );
  }

  more(what) {
    this.limits[what] += MORE_ROWS;
    this.stepsSig = null;
    this.render();
  }

  select(ltid) {
    this.selected = this.selected === ltid ? null : ltid;
    this.journal.filter(this.selected);
    this.render();
  }

  renderTree(rows, now, failedSteps) {
    const d = this.detail;
    const workflow = isWorkflow(d);
    // The signals each task waits for (by ltid), as the store lists them.
    const signals = new Map();
    for (const w of (d && !TERMINAL_RUN.has(d.status) && d.waiting_for) || []) {
      if (w.kind !== "signal" || w.task == null) continue;
      if (!signals.has(w.task)) signals.set(w.task, []);
      signals.get(w.task).push(w.name);
    }
    const hidden = new Set();
    const out = [];
    let notDrawn = 0;
    for (const { task, depth, children } of rows) {
      if (task.parent_ltid != null && (hidden.has(task.parent_ltid) || this.collapsed.has(task.parent_ltid))) {
        hidden.add(task.ltid);
        continue;
      }
      if (out.length >= this.limits.tree) {
        notDrawn++;
        continue;
      }
      const st = task.state;
      const look = taskState(task, failedSteps);
      const end = task.ended_at ?? (TERMINAL_TASK.has(st) ? null : now);
      const isCollapsed = this.collapsed.has(task.ltid);
      out.push(
        h(
          "li",
          {
            class: `tree-node${this.selected === task.ltid ? " selected" : ""}`,
            testid: "task-node",
            role: "treeitem",
            tabindex: 0,
            onkeydown: (e) => {
              if (e.key === "Enter" || e.key === " ") {
                e.preventDefault();
                this.select(task.ltid);
              }
            },
            "aria-expanded": children ? String(!isCollapsed) : null,
            dataset: { ltid: String(task.ltid), state: look.state, kind: task.kind, name: task.name },
            style: { paddingLeft: `${6 + depth * 18}px` },
            onclick: () => this.select(task.ltid),
          },
          children
            ? h(
                "button",
                {
                  class: "twisty",
                  "aria-label": isCollapsed ? "expand" : "collapse",
                  onclick: (e) => {
                    e.stopPropagation();
                    if (isCollapsed) this.collapsed.delete(task.ltid);
                    else this.collapsed.add(task.ltid);
                    this.render();
                  },
                },
                isCollapsed ? "▸" : "▾",
              )
            : h("span", { class: "twisty-space" }),
          h("span", { class: `kind-badge tk-${task.kind}`, title: task.kind }, task.kind[0].toUpperCase()),
          h("span", { class: "tree-name" }, task.name, h("span", { class: "muted small" }, ` #${task.ltid}`)),
          h("span", { class: `pill pill-sm tone-${look.tone}`, testid: "task-state" }, look.label),
          task.blocked_on && !TERMINAL_TASK.has(st)
            ? h(
                "span",
                { class: "blocked-on", testid: "task-blocked-on", title: workflow ? "its current call: what it yielded and waits on" : "blocked on" },
                h("span", { class: "on" }, workflow ? "call" : "on"),
                task.blocked_on,
              )
            : null,
          signals.has(task.ltid) && !TERMINAL_TASK.has(st)
            ? h("span", { class: "pill pill-sm tone-wait", testid: "task-waiting", dataset: { waiting: signals.get(task.ltid).join(",") } }, `waits for ${signals.get(task.ltid).join(", ")}`)
            : null,
          task.lastOutput && !TERMINAL_TASK.has(st) ? h("span", { class: "muted small mono ellipsis" }, compact(task.lastOutput, 60)) : null,
          h("span", { class: "tree-dur muted small" }, task.started_at != null && end != null ? duration(end - task.started_at) : ""),
        ),
      );
    }
    if (notDrawn) out.push(h("li", null, moreButton(notDrawn, () => this.more("tree"), "tree-more")));
    fill(this.treeEl, out.length ? out : h("li", { class: "empty" }, "No tasks yet."));
  }

  renderTask(tasks) {
    const t = this.selected == null ? null : tasks.find((x) => x.ltid === this.selected);
    if (!t) {
      fill(this.taskEl);
      return;
    }
    const evs = this.live.events.filter((e) => e.run === this.runId && e.ltid === t.ltid).slice(-TASK_EVENTS);
    fill(
      this.taskEl,
      h(
        "div",
        { class: "task-card" },
        h("div", { class: "task-card-head" }, h("strong", null, t.name), h("span", { class: "muted small" }, ` ltid ${t.ltid} · ${t.kind} · ${stateLabel(t.state)}`)),
        t.error ? h("pre", { class: "payload error-text" }, pretty(t.error)) : null,
        t.result != null ? h("details", null, h("summary", null, "result"), h("pre", { class: "payload" }, pretty(t.result))) : null,
        h("div", { class: "muted small" }, evs.length ? `Live activity of this task (${evs.length}):` : "No live activity seen for this task since the page opened."),
        h(
          "ol",
          { class: "task-events" },
          evs.reverse().map((e) => h("li", null, h("time", { class: "t", title: stamp(e.ts) }, clock(e.ts)), " ", h("span", { class: "kind" }, e.kind), " ", e.label)),
        ),
      ),
    );
  }

  renderSteps(d, tasks) {
    const specs = new Map();
    const plan = d.entry && d.entry.plan;
    if (plan && Array.isArray(plan.steps)) for (const s of plan.steps) specs.set(s.id, s);
    const liveWorker = new Map(tasks.filter((t) => t.step_id).map((t) => [t.step_id, t]));
    const steps = d.steps || [];
    const status = (s) => {
      const w = liveWorker.get(s.step_id);
      return s.status === "pending" && w && !TERMINAL_TASK.has(w.state) ? "running" : s.status;
    };
    const runLive = !TERMINAL_RUN.has(d.status);
    const rr = this.rerun;
    const rerunSig = `${this.canRerun()}|${rr.busy}|${rr.from}|${rr.error ? `${rr.error.from}:${rr.error.message}` : ""}`;
    const live = new Map(steps.map((s) => [s.step_id, status(s) === "running" ? liveLinesOf(this.live.events, this.runId, s.step_id) : []]));
    const liveSig = [...live.values()].map((l) => l.length).join(",");
    // What the rows show, not when they were read: a row rebuilt between a
    // click's mousedown and mouseup swallows the click ("Re-run from here"),
    // and a refresh that brought nothing new (the live page's poll) rebuilt
    // them all. A step's `last_seq` moves whenever its row changes.
    const rows = steps.map((s) => `${status(s)}:${s.waiting || ""}:${s.last_seq}`).join(",");
    const sig = `${runLive}|${rerunSig}|${[...this.templates].join(",")}|${liveSig}|${rows}`;
    if (sig === this.stepsSig) return; // nothing new: keep the DOM (and open <details>)
    this.stepsSig = sig;
    if (!steps.length) {
      fill(this.stepsEl, h("div", { class: "empty" }, "This run has no plan steps."));
      return;
    }
    const shown = steps.slice(0, this.limits.steps);
    const waitingFor = (s) => (runLive ? signalWaited(s) : null);
    const rerunnable = this.canRerun();
    const forms = new Set(shown.filter(waitingFor).map((s) => `${s.step_id}\n${waitingFor(s)}`));
    // What the workers resolved references from: the run's inputs and the recorded outputs.
    const outputs = Object.fromEntries(steps.filter((s) => s.status === "succeeded").map((s) => [s.step_id, s.output]));
    for (const key of this.signalForms.keys()) if (!forms.has(key)) this.signalForms.delete(key);
    // Rebuilding the rows moves a signal form: keep its focus and caret.
    const active = document.activeElement;
    const focus = active && active !== document.body && this.stepsEl.contains(active) ? active : null;
    const caret = focus && focus.tagName === "TEXTAREA" ? [focus.selectionStart, focus.selectionEnd] : null;
    fill(
      this.stepsEl,
      steps.length > shown.length ? h("div", { class: "muted small" }, `${steps.length} steps`) : null,
      shown.map((s) => {
        const st = status(s);
        const spec = specs.get(s.step_id) || {};
        const end = s.ended_at;
        const attempts = (s.attempts || []).length;
        const awaited = waitingFor(s);
        const held = runLive && st === "running" && s.waiting && !awaited ? s.waiting : null;
        const reused = reusedFrom(s);
        return h(
          "div",
          { class: `step tone-border-${tone(st)}`, testid: "step-row", dataset: { stepId: s.step_id, status: st } },
          h(
            "div",
            { class: "step-head" },
            h("span", { class: `status-dot tone-${tone(st)}` }),
            h("strong", { class: "mono" }, s.step_id),
            h("span", { class: "tool-tag" }, s.tool),
            (s.after || spec.after || []).length ? h("span", { class: "muted small" }, `after ${(s.after || spec.after).join(", ")}`) : null,
            s.added_by
              ? h("span", { class: "pill pill-sm tone-wait added-badge", testid: "step-added-by", dataset: { addedBy: s.added_by } }, `added by ${s.added_by}`)
              : null,
            s.dynamic ? h("span", { class: "pill pill-sm tone-idle", testid: "step-dynamic", title: "Its output adds steps to the plan" }, "dynamic") : null,
            awaited
              ? h("span", { class: "pill pill-sm tone-wait waiting-badge", testid: "step-waiting", dataset: { waiting: awaited } }, `waiting for ${awaited}`)
              : null,
            held ? h("span", { class: "pill pill-sm tone-wait held-badge", testid: "step-held", title: held }, `held: ${held}`) : null,
            h("div", { class: "spacer" }),
            attempts > 1 ? h("span", { class: "muted small", title: "attempts" }, `${attempts} attempts`) : null,
            h("span", { class: "muted small" }, !reused && s.started_at != null && end != null ? duration(end - s.started_at) : ""),
            h("span", { class: `status-text tone-${tone(st)}`, testid: "step-status" }, st),
            rerunnable
              ? h(
                  "button",
                  {
                    class: "btn btn-sm btn-ghost step-rerun",
                    testid: "rerun-from",
                    dataset: { stepId: s.step_id },
                    disabled: this.rerun.busy,
                    title: `Start a new run from step ${s.step_id}: the steps it does not lead to are reused`,
                    onclick: () => this.doRerun(s.step_id),
                  },
                  this.rerun.busy && this.rerun.from === s.step_id ? "Re-running…" : "Re-run from here",
                )
              : null,
          ),
          reused
            ? h(
                "div",
                { class: "step-reused muted small", testid: "step-reused", dataset: { runId: reused.run_id, seq: String(reused.seq ?? "") } },
                "reused from ",
                runLink(reused.run_id),
                reused.seq != null ? ` · seq ${reused.seq}` : null,
              )
            : null,
          // A reused plan.run step's child ran under the earlier run (linked above).
          s.tool === "plan.run" && !reused && attempts ? childRuns(this.runId, s.step_id, attempts) : null,
          rerunnable ? this.rerunError(s.step_id, "div") : null,
          h(
            "div",
            { class: "step-io" },
            argsBlock(spec.args, {
              inputs: d.inputs,
              outputs,
              showTemplate: this.templates.has(s.step_id),
              onToggle: () => {
                if (this.templates.has(s.step_id)) this.templates.delete(s.step_id);
                else this.templates.add(s.step_id);
                this.render();
              },
            }),
            s.output != null ? kv("output", s.output, "step-output") : null,
            // A succeeded step's error is an earlier attempt's: listed with its attempt.
            s.error != null && st !== "succeeded" ? kv(st === "failed" ? "error" : "why", withoutTraceback(s.error), "step-error", st === "failed" ? "error-text" : "") : null,
            st === "failed" ? tracebackBlock(s.error) : null,
          ),
          reused ? null : attemptsBlock(s, { running: st === "running", liveLines: live.get(s.step_id) || [] }),
          awaited ? this.signalForm(s.step_id, awaited, spec.args && spec.args.schema) : null,
        );
      }),
      steps.length > shown.length ? moreButton(steps.length - shown.length, () => this.more("steps"), "steps-more") : null,
    );
    if (focus && focus.isConnected && document.activeElement !== focus) {
      focus.focus({ preventScroll: true });
      if (caret) focus.setSelectionRange(caret[0], caret[1]);
    }
  }

  /** The (kept) form sending signal `name` to the run, for step `stepId` waiting on it (`schema`: its payload's). */
  signalForm(stepId, name, schema = null) {
    const key = `${stepId}\n${name}`;
    let form = this.signalForms.get(key);
    if (!form) {
      form = buildSignalForm(name, {
        schema: schema && typeof schema === "object" ? schema : null,
        send: (payload) => sendSignal(this.runId, name, payload),
        onSent: (answer) => {
          // Read our own write: the store as of at least the signal's record.
          this.want(answer.seq);
          this.refresh();
        },
      });
      this.signalForms.set(key, form);
    }
    return form;
  }

  /** Whether the run can be re-run: the store has it finished. */
  canRerun() {
    return !!this.detail && TERMINAL_RUN.has(this.detail.status);
  }

  /** The last re-run refusal when it came from `from`'s control (null: the header's), else null. */
  rerunError(from, tag) {
    const e = this.rerun.error;
    if (!e || e.from !== from) return null;
    return h(tag, { class: "rerun-error error-text small", testid: "rerun-error", role: "alert" }, e.message);
  }

  /** Re-run this run from step `from` (null: from its failed steps), then open the new run. */
  async doRerun(from) {
    if (this.rerun.busy) return;
    this.rerun = { busy: true, from, error: null };
    this.render();
    try {
      const answer = await rerunRun(this.runId, { fromStep: from });
      this.rerun = { busy: false, from: null, error: null };
      if (this.closed) return;
      this.openRun(answer.run_id, answer.seq, this.detail && this.detail.name);
    } catch (err) {
      this.rerun = { busy: false, from: null, error: { from, message: `Not re-run: ${err.message || err}` } };
    }
    this.render();
  }

  renderErrorAndIo(d) {
    if (d.status === "cancelled") this.loadCancelReason();
    fill(
      this.errorEl,
      d.status === "cancelled"
        ? this.cancelledCard(d)
        : d.error
          ? h(
              "section",
              { class: "card error-card", testid: "run-error" },
              h("h3", null, "Run failed"),
              h(
                "div",
                null,
                h("p", { class: "error-message" }, (d.error && (d.error.message || d.error.repr)) || compact(d.error, 300)),
                h("details", null, h("summary", null, "error details"), h("pre", { class: "payload error-text" }, pretty(d.error))),
              ),
            )
          : null,
    );
    const key = JSON.stringify([d.inputs, d.outputs, d.status]);
    if (key === this.ioKey) return; // keep <details> state while nothing changed
    this.ioKey = key;
    fill(
      this.ioEl,
      h("div", { class: "io-grid" }, kv("inputs", d.inputs ?? {}, "run-inputs"), kv("outputs", d.outputs ?? (TERMINAL_RUN.has(d.status) ? null : "…"), "run-outputs")),
    );
  }

  /**
   * A cancelled run, told neutrally: who asked (the reason journaled with
   * the cancel, e.g. "cancelled over HTTP"), when, and the kernel's words
   * (which name engine task ids, not this run's tree) only under "details".
   */
  cancelledCard(d) {
    const reason = this.cancelReason;
    return h(
      "section",
      { class: "card cancel-card", testid: "run-error", dataset: { status: "cancelled" } },
      h("h3", null, "Run cancelled"),
      h(
        "p",
        { class: "cancel-reason", testid: "run-cancel-reason" },
        reason ? `Cancelled: ${reason}` : reason === null ? "Cancelled before it finished." : "…",
        d.ended_at != null ? [" · ", timeEl(d.ended_at)] : null,
      ),
      d.error ? h("details", null, h("summary", null, "kernel detail"), h("pre", { class: "payload" }, pretty(d.error))) : null,
    );
  }

  /** Find why the run was cancelled: the journal's cancel wake-up, near the run's end (once). */
  async loadCancelReason() {
    if (this.cancelReason !== undefined || this.cancelAsked) return;
    this.cancelAsked = true;
    const last = this.detail.last_seq || 0;
    const q = new URLSearchParams({ after: String(Math.max(0, last - CANCEL_LOOKBACK)), limit: String(CANCEL_LOOKBACK) });
    try {
      const page = await api(`api/runs/${encodeURIComponent(this.runId)}/events?${q}`);
      const wake = (page.records || []).find((r) => r.type === "WAKE" && r.data && r.data.cause === "cancel");
      this.cancelReason = wake && typeof wake.data.value === "string" && wake.data.value ? wake.data.value : null;
    } catch {
      this.cancelReason = null;
    }
    this.stepsSig = null;
    this.render();
  }

  async doCancel() {
    if (!this.confirmCancel) {
      // First click arms the button; a second within a few seconds cancels.
      this.confirmCancel = true;
      this.renderHead();
      setTimeout(() => {
        this.confirmCancel = false;
        this.renderHead();
      }, 4000);
      return;
    }
    this.confirmCancel = false;
    this.cancelling = true;
    this.renderHead();
    try {
      await api(`api/runs/${encodeURIComponent(this.runId)}/cancel`, { method: "POST" });
      toast("Cancel requested", "warn");
      this.refreshSoon();
    } catch (err) {
      toast(err instanceof ApiError && err.status === 409 ? `Not cancelled: ${err.message}` : `Cancel failed: ${err.message}`, "bad");
    } finally {
      this.cancelling = false;
      this.renderHead();
    }
  }

  async doVerify() {
    this.verifying = true;
    this.renderHead();
    fill(this.verifyEl, h("section", { class: "card verify-card", testid: "verify-result" }, h("div", { class: "muted" }, "Replaying the journal…")));
    try {
      const v = await api(`api/runs/${encodeURIComponent(this.runId)}/verify`, { method: "POST" });
      renderVerify(this.verifyEl, v);
      if (Array.isArray(v.calls) && v.calls.length && isWorkflow(this.detail)) {
        this.verifyCalls = v.calls;
        this.renderCalls(this.tasks());
      }
    } catch (err) {
      fill(
        this.verifyEl,
        h("section", { class: "card verify-card tone-border-bad", testid: "verify-result", dataset: { status: "error" } }, h("strong", null, "Verify failed: "), err.message),
      );
    } finally {
      this.verifying = false;
      this.renderHead();
    }
  }
}

/** `path/to/mod.py:12 (fn)` as `mod.py:12 (fn)` (the whole path is the element's title). */
function shortSource(source) {
  const m = /^(.*?)([^/\\]+:\d+(?: \(.*\))?)$/.exec(String(source));
  return m ? m[2] : String(source);
}

/** The most calls the workflow card lists (the newest ones). */
const CALLS_SHOWN = 200;

/** Whether run detail `d` is a workflow run (a `@workflow` function), not a plan run. */
function isWorkflow(d) {
  return !!d && !!d.entry && d.entry.kind === "workflow" && typeof d.entry.workflow === "string";
}

/** A workflow's inputs as its call's keyword arguments: `repo="x", limit=3`. */
function callArgs(inputs) {
  if (!inputs || typeof inputs !== "object") return "";
  return Object.entries(inputs)
    .map(([k, v]) => `${k}=${compact(JSON.stringify(v) ?? "null", 80)}`)
    .join(", ");
}

/** Where a re-run took step `step` from: `{run_id, seq}`, else null. */
function reusedFrom(step) {
  const first = (step.attempts || [])[0];
  const r = first && first.reused;
  return r && typeof r.run_id === "string" ? r : null;
}

/** A link to run `runId`'s page. */
function runLink(runId, testid = "run-link", dataset = {}) {
  return h("a", { class: "mono", href: `#/run/${encodeURIComponent(runId)}`, testid, dataset: { runId, ...dataset } }, runId);
}

/** The child run a `plan.run` step's attempt `attempt` (from 1) starts (tiffany/agents/tools/subplan.py). */
function childRunId(runId, stepId, attempt) {
  return `${runId}.${stepId}.${attempt}`;
}

/** Links to the child runs of `plan.run` step `stepId`: one an attempt. */
function childRuns(runId, stepId, attempts) {
  const links = [];
  for (let n = 1; n <= attempts; n++) {
    if (n > 1) links.push(", ");
    links.push(runLink(childRunId(runId, stepId, n), "step-child", { attempt: String(n) }));
  }
  return h("div", { class: "step-children muted small", testid: "step-children" }, attempts > 1 ? "child runs " : "child run ", links);
}

/** The run's model usage (its llm and agent steps): "1,234 tokens · $0.0012", or null if none. */
function usageText(usage) {
  if (!usage || (usage.tokens == null && usage.usd == null)) return null;
  const parts = [];
  if (usage.tokens != null) parts.push(`${Number(usage.tokens).toLocaleString()} tokens`);
  if (usage.usd != null) parts.push(`$${Number(usage.usd).toFixed(4)}`);
  return parts.join(" · ");
}

/** "queued: concurrency key K (limit N)" for a run whose entry has a concurrency limit, else null. */
function queuedBadge(entry) {
  const c = entry && entry.concurrency;
  if (!c || c.key == null) return null;
  return h(
    "span",
    {
      class: "pill tone-wait queued-badge",
      testid: "run-queued",
      dataset: { key: String(c.key), limit: String(c.limit ?? "") },
      title: "Waiting for a slot: runs with this key beyond the limit wait their turn, first come first served",
    },
    `queued: concurrency key ${c.key} (limit ${c.limit})`,
  );
}

/** Where a run comes from: the run and step that started it (a sub-plan), the schedule and tick. */
function runOrigin(entry) {
  const parent = entry && entry.parent;
  const sched = entry && entry.schedule;
  const items = [];
  if (parent && typeof parent.run_id === "string") {
    items.push(
      h(
        "span",
        { class: "origin", testid: "run-parent", dataset: { runId: parent.run_id, step: String(parent.step ?? "") } },
        "child of ",
        runLink(parent.run_id),
        parent.step != null ? [" · step ", h("code", null, String(parent.step))] : null,
      ),
    );
  }
  if (sched && sched.id != null) {
    items.push(
      h(
        "span",
        { class: "origin", testid: "run-schedule", dataset: { scheduleId: String(sched.id), tick: String(sched.tick ?? "") } },
        "scheduled: ",
        h("code", null, String(sched.id)),
        sched.tick != null ? [" tick ", h("time", { datetime: String(sched.tick) }, String(sched.tick))] : null,
      ),
    );
  }
  return items.length ? h("div", { class: "run-origin muted small" }, items) : null;
}

/** The signal a step waits for (its `waiting` is "signal NAME"), else null. */
function signalWaited(step) {
  const w = step.waiting;
  return typeof w === "string" && w.startsWith("signal ") ? w.slice("signal ".length) : null;
}

function card(title, body, testid, hint) {
  return h(
    "section",
    { class: "card", testid },
    h("div", { class: "card-head" }, h("h2", null, title), hint ? h("span", { class: "muted small" }, hint) : null),
    body,
  );
}

/** `err` without its `traceback` (shown beside it, by `tracebackBlock`). */
function withoutTraceback(err) {
  if (!err || typeof err !== "object" || !Array.isArray(err.traceback)) return err;
  const { traceback, traceback_omitted, ...rest } = err;
  return rest;
}

/**
 * A failed python step's traceback: the frames of the user's code it went
 * through, most recent call last, each `file:line in function` over its
 * source line (monospace); collapsible, open at first. Null without frames.
 */
function tracebackBlock(err) {
  const frames = err && Array.isArray(err.traceback) ? err.traceback : [];
  if (!frames.length) return null;
  const omitted = Number(err.traceback_omitted) || 0;
  return h(
    "div",
    { class: "kv traceback", testid: "step-traceback" },
    h("div", { class: "kv-label", title: "traceback" }, "trace"),
    h(
      "details",
      { open: true },
      h("summary", null, `most recent call last · ${frames.length} ${frames.length === 1 ? "frame" : "frames"}`),
      h(
        "div",
        { class: "payload traceback-frames mono" },
        omitted ? h("div", { class: "muted small" }, `… ${omitted} earlier frames left out`) : null,
        frames.map((f) =>
          h(
            "div",
            { class: "traceback-frame", testid: "traceback-frame", dataset: { file: String(f.file ?? ""), line: String(f.line ?? "") } },
            h("div", { class: "traceback-where error-text" }, `${f.file}:${f.line}`, h("span", { class: "muted" }, ` in ${f.function}`)),
            f.code ? h("div", { class: "traceback-code", testid: "traceback-code" }, f.code) : null,
          ),
        ),
      ),
    ),
  );
}

function kv(label, value, testid, cls = "") {
  const short = compact(value, 1000);
  const text = short.length <= 72 && !short.endsWith("…") ? short : pretty(value);
  const long = text.split("\n").length > 12 || text.length > 800;
  const pre = h("pre", { class: `payload ${cls}` }, text);
  return h(
    "div",
    { class: "kv", testid },
    h("div", { class: "kv-label" }, label),
    long ? h("details", null, h("summary", null, compact(value, 80)), pre) : pre,
  );
}
