// The live model: what the activity feed has told us about runs and tasks.
//
// PAL events carry run_id/ltid, except `spawned` (emitted before the task
// is registered with its run: run_id and ltid are null, data.parent is the
// engine task id of the parent). We index engine task ids to (run, ltid) as
// events arrive and resolve spawns through the parent, so the tree can show
// a task from its first event. The HTTP store lags the feed by ~0.2 s; views
// merge the two with `mergeTasks`, letting recent live changes win.

import { TERMINAL_TASK } from "./dom.js";

export const EVENT_RING = 5000;
const RUNS_TRACKED = 300;
const SEGMENTS_PER_TASK = 200;

export class Live {
  constructor() {
    this.events = []; // ring of recent events, oldest first
    this.index = new Map(); // engine task_id -> {run_id, ltid}
    this.spawns = new Map(); // engine task_id -> {ev, parentRun, parentLtid}
    this.runs = new Map(); // run_id -> {status, updatedMs, tasks: Map(ltid -> task), events}
  }

  run(runId) {
    let r = this.runs.get(runId);
    if (!r) {
      r = { runId, status: null, updatedMs: 0, tasks: new Map(), events: 0, lastTs: null, walSeq: 0 };
      this.runs.set(runId, r);
      if (this.runs.size > RUNS_TRACKED) {
        const oldest = this.runs.keys().next().value;
        this.runs.delete(oldest);
      }
    }
    return r;
  }

  /** Apply one event; return it with `run` set to its (resolved) run id. */
  apply(ev) {
    ev.run = ev.run_id;
    if (ev.kind === "spawned" && ev.ltid == null) {
      const parent = ev.data && ev.data.parent != null ? this.index.get(ev.data.parent) : null;
      ev.run = parent ? parent.run_id : null;
      this.spawns.set(ev.task_id, { ev, parent });
      if (this.spawns.size > 10000) this.spawns.delete(this.spawns.keys().next().value);
    } else if (ev.run_id != null && ev.ltid != null) {
      this.index.set(ev.task_id, { run_id: ev.run_id, ltid: ev.ltid });
      if (this.index.size > 50000) this.index.delete(this.index.keys().next().value);
      this.applyTask(ev);
    }
    if (ev.run != null) {
      const r = this.run(ev.run);
      r.events += 1;
      r.lastTs = ev.ts;
      if (ev.wal_seq > (r.walSeq || 0)) r.walSeq = ev.wal_seq; // the store's clock
      if (ev.kind === "run.started" || (r.status == null && ev.kind !== "run.finished")) {
        r.status = "running";
        r.updatedMs = Date.now();
      } else if (ev.kind === "run.finished") {
        const ok = ev.data && ev.data.ok;
        r.status = ok ? "succeeded" : ev.label === "cancelled" ? "cancelled" : "failed";
        r.updatedMs = Date.now();
      }
    }
    this.events.push(ev);
    if (this.events.length > EVENT_RING * 1.2) this.events.splice(0, this.events.length - EVENT_RING);
    return ev;
  }

  applyTask(ev) {
    const r = this.run(ev.run_id);
    let t = r.tasks.get(ev.ltid);
    if (!t) {
      const spawn = this.spawns.get(ev.task_id);
      if (spawn) {
        spawn.ev.run = ev.run_id; // the planner's own spawn learns its run now
        this.spawns.delete(ev.task_id);
      }
      t = {
        ltid: ev.ltid,
        parent_ltid: spawn && spawn.parent ? spawn.parent.ltid : null,
        name: ev.task,
        kind: ev.task_kind,
        step_id: stepOf(ev.task),
        state: "ready",
        blocked_on: null,
        started_at: spawn ? spawn.ev.ts : ev.ts,
        ended_at: null,
        error: null,
        segments: [],
        lastOutput: null,
        updatedMs: 0,
      };
      r.tasks.set(ev.ltid, t);
    }
    t.updatedMs = Date.now();
    const open = t.segments.length ? t.segments[t.segments.length - 1] : null;
    const closeOpen = () => {
      if (open && open.end == null) open.end = ev.ts;
    };
    switch (ev.kind) {
      case "step":
      case "tool.started":
        if (t.state !== "ready" || ev.kind === "step") t.state = "running";
        t.blocked_on = null;
        closeOpen();
        break;
      case "blocked":
        t.state = (ev.data && ev.data.state) || "blocked_sync";
        t.blocked_on = ev.label;
        closeOpen();
        if (t.segments.length < SEGMENTS_PER_TASK) t.segments.push({ start: ev.ts, end: null, label: ev.label });
        break;
      case "woke":
        t.state = "ready";
        t.blocked_on = null;
        closeOpen();
        break;
      case "exit":
        t.state = "done";
        t.blocked_on = null;
        t.ended_at = ev.ts;
        closeOpen();
        break;
      case "crash":
        t.state = "crashed";
        t.blocked_on = null;
        t.ended_at = ev.ts;
        t.error = ev.data || { message: ev.label };
        closeOpen();
        break;
      case "cancelled":
        t.state = "cancelled";
        t.blocked_on = null;
        t.ended_at = ev.ts;
        closeOpen();
        break;
      case "tool.output":
        t.lastOutput = (ev.data && (ev.data.text || ev.data.line)) || ev.label;
        break;
      default:
        break;
    }
  }

  /** Recent events, newest last, optionally only those of one run. */
  recent(runId = null) {
    return runId ? this.events.filter((e) => e.run === runId) : this.events;
  }
}

function stepOf(name) {
  const i = name ? name.indexOf(":") : -1;
  return i >= 0 ? name.slice(i + 1) : null;
}

/**
 * Merge the store's tasks (HTTP, lagging) with live ones. A live change made
 * after `sentMs - 500` (the request left, minus the store's lag) wins over
 * the store, except that a finished task in the store stays finished.
 */
export function mergeTasks(httpTasks, liveRun, sentMs) {
  const out = new Map();
  for (const t of httpTasks || []) out.set(t.ltid, { ...t, segments: [], lastOutput: null });
  if (liveRun) {
    for (const lt of liveRun.tasks.values()) {
      const t = out.get(lt.ltid);
      if (!t) {
        out.set(lt.ltid, { ...lt, result: null });
        continue;
      }
      t.segments = lt.segments;
      t.lastOutput = lt.lastOutput;
      if (t.started_at == null) t.started_at = lt.started_at;
      if (TERMINAL_TASK.has(t.state)) continue;
      if (lt.updatedMs >= sentMs - 500 || TERMINAL_TASK.has(lt.state)) {
        t.state = lt.state;
        t.blocked_on = lt.blocked_on;
        if (t.ended_at == null) t.ended_at = lt.ended_at;
        if (!t.error && lt.error) t.error = lt.error;
      }
    }
  }
  return [...out.values()].sort((a, b) => a.ltid - b.ltid);
}

/** Order tasks depth-first from their roots; each gets `depth`. */
export function treeOrder(tasks) {
  const kids = new Map();
  const ids = new Set(tasks.map((t) => t.ltid));
  const roots = [];
  for (const t of tasks) {
    if (t.parent_ltid != null && ids.has(t.parent_ltid)) {
      if (!kids.has(t.parent_ltid)) kids.set(t.parent_ltid, []);
      kids.get(t.parent_ltid).push(t);
    } else roots.push(t);
  }
  const out = [];
  const walk = (t, depth) => {
    out.push({ task: t, depth, children: (kids.get(t.ltid) || []).length });
    for (const c of kids.get(t.ltid) || []) walk(c, depth + 1);
  };
  roots.forEach((t) => walk(t, 0));
  return out;
}
