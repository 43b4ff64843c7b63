// The timeline (Gantt) of a run's tasks: one row per task in tree order, a
// bar from started_at to ended_at (or now), blocked spans from the live
// feed shaded inside the bar. Plain divs positioned in percent.

import { duration, fill, h, taskState } from "./dom.js";

const STEPS_S = [
  0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900,
  1800, 3600, 7200, 14400, 43200, 86400,
];

function tickStep(span, want = 6) {
  for (const s of STEPS_S) if (span / s <= want) return s;
  return STEPS_S[STEPS_S.length - 1];
}

function tickLabel(s, step) {
  if (s === 0) return "0";
  if (s < 1) return `${+(s * 1000).toFixed(0)} ms`;
  if (step < 1) return `${+s.toFixed(3)} s`;
  if (step < 60) return `${+s.toFixed(step < 1 ? 2 : 0)} s`;
  if (step < 3600) return `${+(s / 60).toFixed(step % 60 ? 1 : 0)} min`;
  return `${+(s / 3600).toFixed(1)} h`;
}

/** A "show more" button under a capped list. */
export function moreButton(hidden, onMore, testid) {
  return h(
    "button",
    { class: "btn btn-ghost btn-sm more-rows", testid, onclick: onMore },
    `Show more (${hidden} not drawn)`,
  );
}

/**
 * A row's label from the task's fields, never from its name: a worker shows
 * its step, a tool task what it is known to run (`labels`: ltid -> label,
 * an agent's model and tool calls) or else its step's tool (`tools`: step
 * id -> tool), any other task its name.
 */
function rowLabel(task, tools, labels) {
  if (task.kind === "worker" && task.step_id) return task.step_id;
  if (labels && labels.has(task.ltid)) return labels.get(task.ltid);
  if (task.kind === "tool" && task.step_id && tools && tools.get(task.step_id)) {
    return tools.get(task.step_id);
  }
  return task.name;
}

/**
 * Render `rows` ({task, depth} in tree order) into `root`.
 * `now` (epoch s) closes the bars of tasks still running.
 */
export function renderTimeline(root, rows, { now, tools, labels, failedSteps, selected, onSelect, limit, onMore }) {
  const timed = rows.filter((r) => r.task.started_at != null);
  if (!timed.length) {
    fill(root, h("div", { class: "empty" }, "No task has started yet."));
    return;
  }
  let t0 = Infinity;
  let t1 = -Infinity;
  for (const { task } of timed) {
    t0 = Math.min(t0, task.started_at);
    t1 = Math.max(t1, task.ended_at ?? now, task.started_at);
  }
  const span = Math.max(t1 - t0, 0.001);
  const pct = (t) => `${(((t - t0) / span) * 100).toFixed(3)}%`;
  const width = (a, b) => `${Math.max(((b - a) / span) * 100, 0.25).toFixed(3)}%`;

  const step = tickStep(span);
  const ticks = [];
  for (let s = 0; s <= span + 1e-9; s += step) {
    ticks.push(h("span", { class: "tick", style: { left: pct(t0 + s) } }, h("span", { class: "tick-label" }, tickLabel(s, step))));
  }

  const shown = timed.slice(0, limit);
  const body = shown.map(({ task, depth }) => {
    const end = task.ended_at ?? now;
    const open = task.ended_at == null;
    const look = taskState(task, failedSteps);
    const st = look.state;
    const segs = (task.segments || [])
      .filter((sg) => sg.start >= task.started_at)
      .map((sg) => {
        const a = Math.max(sg.start, task.started_at);
        const b = Math.min(sg.end ?? end, end);
        const total = Math.max(end - task.started_at, 1e-6);
        return h("span", {
          class: "seg-blocked",
          title: `${sg.label} · ${duration(b - a)}`,
          style: {
            left: `${(((a - task.started_at) / total) * 100).toFixed(3)}%`,
            width: `${Math.max(((b - a) / total) * 100, 0).toFixed(3)}%`,
          },
        });
      });
    const label = rowLabel(task, tools, labels);
    return h(
      "div",
      {
        class: `gantt-row${selected === task.ltid ? " selected" : ""}`,
        testid: "gantt-row",
        dataset: { ltid: String(task.ltid), state: st },
        onclick: () => onSelect(task.ltid),
      },
      h(
        "div",
        { class: "gantt-label", style: { paddingLeft: `${8 + depth * 14}px` }, title: task.name },
        h("span", { class: `kind-badge tk-${task.kind}` }, task.kind[0].toUpperCase()),
        h("span", { class: "gantt-name" }, label),
      ),
      h(
        "div",
        { class: "gantt-track" },
        h(
          "div",
          {
            class: `gantt-bar tone-${look.tone}${open ? " open" : ""}`,
            testid: "gantt-bar",
            style: { left: pct(task.started_at), width: width(task.started_at, end) },
            title: `${task.name} · ${look.label}${task.blocked_on ? ` (${task.blocked_on})` : ""} · ${duration(end - task.started_at)}`,
          },
          segs,
        ),
        h(
          "span",
          { class: "gantt-dur", style: { left: `calc(${pct(end)} + 6px)` } },
          duration(end - task.started_at),
        ),
      ),
    );
  });

  fill(
    root,
    h(
      "div",
      { class: "gantt", testid: "gantt" },
      h("div", { class: "gantt-row gantt-axis" }, h("div", { class: "gantt-label muted small" }, "task"), h("div", { class: "gantt-track" }, ticks)),
      body,
      timed.length > shown.length ? moreButton(timed.length - shown.length, onMore, "timeline-more") : null,
    ),
    h(
      "div",
      { class: "gantt-legend muted small" },
      h("span", { class: "legend-swatch tone-live" }),
      "running ",
      h("span", { class: "legend-swatch tone-ok" }),
      "succeeded ",
      h("span", { class: "legend-swatch tone-bad" }),
      "failed ",
      h("span", { class: "legend-swatch hatched" }),
      "blocked (live) · total ",
      duration(span),
    ),
  );
}
