// The plan's graph on the run page: every step of the run, those not started
// too, as an SVG of boxes and edges laid out in layers (a step's column is
// one past the furthest step it runs after: the longest path from a root),
// left to right. A box's colour is its status's tone (the run page's), a step
// not started is grey and dashed, a dynamic step says it adds steps, and a
// step it added says "added by <step>", its edge from that step drawn in the
// accent colour, dashed. The graph comes from the API (each step's `after`,
// `added_by`, `dynamic`: tiffany/store/graph.py); nothing is parsed here.
//
// Rejected: a layout library (dagre, elkjs): no build step and no network at
// run time; a column per layer with one barycenter pass keeps plans of a few
// hundred steps readable, and a larger one is listed, not drawn.

import { h, fill, tone } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
/** A step's box, and the gaps between columns and rows, in pixels. */
const NODE_W = 176;
const NODE_H = 56;
const GAP_X = 56;
const GAP_Y = 14;
const PAD = 12;
/** Characters of a step id that fit in a box (12.5 px monospace). */
const ID_CHARS = 20;
/** Beyond this many steps the graph is not drawn (the steps card lists them). */
export const GRAPH_MAX_STEPS = 400;
/** Barycenter passes that order each column by where its parents are. */
const ORDER_PASSES = 2;

/** An SVG element: svg("rect", {x: 1, class: "n"}, ...children) (memory.js draws with it too). */
export function svg(tag, attrs = null, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "testid") el.dataset.testid = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) if (c != null) el.append(c instanceof Node ? c : String(c));
  return el;
}

function cut(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

/**
 * Each step's column (longest path from a step that runs after nothing) and
 * its row within the column. `steps`: [{step_id, after, position}].
 */
export function layout(steps) {
  const byId = new Map(steps.map((s) => [s.step_id, s]));
  const layer = new Map();
  const visiting = new Set();
  const depth = (id) => {
    if (layer.has(id)) return layer.get(id);
    if (visiting.has(id)) return 0; // a cycle (the plan check refuses them): cut it
    visiting.add(id);
    let d = 0;
    for (const p of byId.get(id).after || []) if (byId.has(p)) d = Math.max(d, depth(p) + 1);
    visiting.delete(id);
    layer.set(id, d);
    return d;
  };
  const columns = [];
  for (const s of steps) {
    const d = depth(s.step_id);
    (columns[d] ||= []).push(s.step_id);
  }
  for (let i = 0; i < columns.length; i++) columns[i] ||= [];
  const row = new Map();
  const place = () => columns.forEach((col) => col.forEach((id, i) => row.set(id, i)));
  place();
  for (let pass = 0; pass < ORDER_PASSES; pass++) {
    for (const col of columns.slice(1)) {
      const centre = (id) => {
        const ps = (byId.get(id).after || []).filter((p) => row.has(p));
        return ps.length ? ps.reduce((a, p) => a + row.get(p), 0) / ps.length : row.get(id);
      };
      const key = new Map(col.map((id) => [id, centre(id)]));
      col.sort((a, b) => key.get(a) - key.get(b) || byId.get(a).position - byId.get(b).position);
      col.forEach((id, i) => row.set(id, i));
    }
  }
  return { columns, layer, row };
}

/**
 * The edges worth drawing: step id -> the steps of its `after` that no other
 * of them already leads to (a transitive reduction). A dynamic step's child
 * runs after its parent and after a sibling the parent also added: the edge
 * from the parent says nothing the sibling's does not, and crosses it. The
 * box says "added by" either way; its tooltip lists the whole `after`.
 */
export function directEdges(steps) {
  const byId = new Map(steps.map((s) => [s.step_id, s]));
  const ancestors = new Map();
  const visiting = new Set();
  const anc = (id) => {
    if (ancestors.has(id)) return ancestors.get(id);
    const out = new Set();
    if (visiting.has(id)) return out; // a cycle: cut it
    visiting.add(id);
    for (const p of byId.get(id).after || []) {
      if (!byId.has(p)) continue;
      out.add(p);
      for (const a of anc(p)) out.add(a);
    }
    visiting.delete(id);
    ancestors.set(id, out);
    return out;
  };
  const drawn = new Map();
  for (const s of steps) {
    const parents = (s.after || []).filter((p) => byId.has(p));
    drawn.set(
      s.step_id,
      parents.filter((p) => !parents.some((q) => q !== p && anc(q).has(p))),
    );
  }
  return drawn;
}

/**
 * Draw the graph of `steps` into `root`. `statusOf(step)`: the status the
 * run page shows; `onSelect(stepId)`: a box was clicked.
 */
export function renderGraph(root, steps, { statusOf, onSelect }) {
  if (!steps.length) {
    fill(root, h("div", { class: "empty" }, "This run has no plan steps."));
    return;
  }
  if (steps.length > GRAPH_MAX_STEPS) {
    fill(root, h("div", { class: "empty", testid: "graph-too-large" }, `${steps.length} steps: more than ${GRAPH_MAX_STEPS}, not drawn (the steps are listed below).`));
    return;
  }
  const { columns, layer, row } = layout(steps);
  const tallest = Math.max(...columns.map((c) => c.length));
  const pos = new Map();
  for (const s of steps) {
    const col = columns[layer.get(s.step_id)];
    const offset = ((tallest - col.length) * (NODE_H + GAP_Y)) / 2;
    pos.set(s.step_id, {
      x: PAD + layer.get(s.step_id) * (NODE_W + GAP_X),
      y: PAD + offset + row.get(s.step_id) * (NODE_H + GAP_Y),
    });
  }
  const width = PAD * 2 + columns.length * NODE_W + (columns.length - 1) * GAP_X;
  const height = PAD * 2 + tallest * NODE_H + (tallest - 1) * GAP_Y;

  const edges = [];
  const drawn = directEdges(steps);
  for (const s of steps) {
    const to = pos.get(s.step_id);
    for (const p of drawn.get(s.step_id)) {
      const from = pos.get(p);
      if (!from) continue;
      const added = s.added_by === p;
      const x1 = from.x + NODE_W;
      const y1 = from.y + NODE_H / 2;
      const x2 = to.x - 3;
      const y2 = to.y + NODE_H / 2;
      const dx = Math.max(GAP_X / 2, (x2 - x1) / 3);
      edges.push(
        svg("path", {
          class: `gedge${added ? " gedge-added" : ""}`,
          d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`,
          "marker-end": `url(#${added ? "garrow-added" : "garrow"})`,
          testid: "graph-edge",
          dataset: { from: p, to: s.step_id, added: added ? "true" : "false" },
        }),
      );
    }
  }

  const nodes = steps.map((s) => {
    const st = statusOf(s);
    const started = !(st === "pending" || st === "skipped");
    // A running step that waits (for a signal, or its tool's engine) says on what.
    const waits = st === "running" && typeof s.waiting === "string" && s.waiting ? s.waiting : null;
    const look = waits ? "wait" : tone(st);
    const { x, y } = pos.get(s.step_id);
    const third = s.added_by ? `added by ${s.added_by}` : s.dynamic ? "adds steps" : null;
    return svg(
      "g",
      {
        class: `gnode tone-${look}${started ? "" : " not-started"}${s.added_by ? " added" : ""}`,
        transform: `translate(${x},${y})`,
        tabindex: 0,
        role: "button",
        "aria-label": `step ${s.step_id}: ${st}${third ? `, ${third}` : ""}`,
        testid: "graph-node",
        dataset: {
          stepId: s.step_id,
          status: st,
          started: String(started),
          dynamic: String(!!s.dynamic),
          addedBy: s.added_by || "",
        },
        onclick: () => onSelect(s.step_id),
        onkeydown: (e) => {
          if (e.key === "Enter" || e.key === " ") {
            e.preventDefault();
            onSelect(s.step_id);
          }
        },
      },
      svg("title", null, `${s.step_id} · ${s.tool || "?"} · ${st}${s.after && s.after.length ? `\nafter ${s.after.join(", ")}` : ""}${third ? `\n${third}` : ""}`),
      svg("rect", { class: "gbox", width: NODE_W, height: NODE_H, rx: 7 }),
      svg("circle", { class: "gdot", cx: 13, cy: 17, r: 4.5 }),
      svg("text", { class: "gid", x: 24, y: 21 }, cut(s.step_id, ID_CHARS)),
      svg("text", { class: "gmeta", x: 12, y: 37 }, `${cut(s.tool || "?", 14)} · ${waits ? cut(waits, 12) : started ? st : "not started"}`),
      third ? svg("text", { class: `gnote${s.added_by ? " gnote-added" : ""}`, x: 12, y: 50, testid: s.added_by ? "graph-added-by" : "graph-dynamic" }, cut(third, 26)) : null,
    );
  });

  const arrow = (id, cls) =>
    svg("marker", { id, viewBox: "0 0 8 8", refX: 7, refY: 4, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, svg("path", { class: cls, d: "M0,0 L8,4 L0,8 z" }));
  const picture = svg(
    "svg",
    { class: "graph-svg", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `plan graph: ${steps.length} steps` },
    svg("defs", null, arrow("garrow", "garrow"), arrow("garrow-added", "garrow garrow-added")),
    svg("g", { class: "gedges" }, edges),
    svg("g", { class: "gnodes" }, nodes),
  );
  const legend = h(
    "div",
    { class: "graph-legend muted small" },
    [
      ["ok", "succeeded"],
      ["live", "running"],
      ["wait", "waiting"],
      ["bad", "failed"],
    ].map(([t, label]) => h("span", { class: `legend-item tone-${t}` }, h("span", { class: "legend-box" }), label)),
    h("span", { class: "legend-item tone-idle" }, h("span", { class: "legend-box dashed" }), "not started"),
    h("span", { class: "legend-item" }, h("span", { class: "legend-edge added" }), "added by a dynamic step"),
  );
  fill(root, h("div", { class: "graph-scroll" }, picture), legend);
}
