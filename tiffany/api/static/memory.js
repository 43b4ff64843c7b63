// The memory page: what runs remembered (GET api/memory...: the
// MemoryStore's items in namespaces, tiffany/api/routes/memory.py).
//   #/memory                      the namespaces
//   #/memory/<ns>                 its items, a page at a time, by key
//   #/memory/<ns>?search=<text>   the best hits of a search, with their scores
//   #/memory/<ns>/<key>           an item: its value, who wrote it, its
//                                 neighbours drawn as a small graph, its
//                                 links and its versions; it can be deleted
// (a key is one hash segment, encoded: it may hold "/"). And, for the run
// page, the memory a run read and wrote: its `memory.*` steps, each with
// what it touched, linked to the items (`memoryOfRun`, `renderRunMemory`).
//
// The neighbours' graph draws as graph.js draws a plan (SVG built with the
// same helper, no layout library): the item in the middle, the items that
// link to it on the left, those it links to on the right, each edge named
// by its relation; a click on a neighbour opens it.

import { api, ApiError } from "./api.js";
import { compact, confirmDialog, fill, h, pretty, statusWord, timeEl, toast, tone } from "./dom.js";
import { svg } from "./graph.js";
import { resolve } from "./refs.js";

const PAGE = 50;
const SEARCH_K = 20;
/** Characters of a value shown in a row (the item page shows it whole). */
const PREVIEW = 120;
/** The neighbours' graph: a box, the gap between the columns and rows, in pixels. */
const NODE_W = 160;
const NODE_H = 44;
const COL_GAP = 120;
const ROW_GAP = 12;
const PAD = 12;
const KEY_CHARS = 19;
/** Characters of an edge's relations shown beside it. */
const RELATION_CHARS = 16;

const SHORT = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });

/** The hash of the memory page, a namespace's, or an item's (`search`: a namespace's search). */
export function memoryHash(ns = null, key = null, search = null) {
  let path = "#/memory";
  if (ns != null) path += `/${encodeURIComponent(ns)}`;
  if (ns != null && key != null) path += `/${encodeURIComponent(key)}`;
  return search ? `${path}?search=${encodeURIComponent(search)}` : path;
}

/** Epoch seconds of an ISO-8601 time (null if none). */
function epoch(iso) {
  const t = iso ? Date.parse(iso) : NaN;
  return Number.isFinite(t) ? t / 1000 : null;
}

function cut(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

function runRef(runId, stepId) {
  if (!runId) return h("span", { class: "muted" }, "not a run");
  return h(
    "span",
    null,
    h("a", { class: "mono", href: `#/run/${encodeURIComponent(runId)}`, testid: "memory-run-link", dataset: { runId } }, runId),
    stepId ? h("span", { class: "muted small" }, ` · step ${stepId}`) : null,
  );
}

function itemLink(ns, key, testid = "memory-item-link") {
  return h("a", { class: "mono", href: memoryHash(ns, key), testid, dataset: { namespace: ns, key } }, key);
}

export class MemoryPage {
  constructor(root, { onError }) {
    this.root = root;
    this.onError = onError;
    this.closed = false;
    this.route = {};
    this.namespaces = [];
    this.build();
    this.loadNamespaces();
  }

  destroy() {
    this.closed = true;
  }

  build() {
    this.nsEl = h("nav", { class: "memory-namespaces", testid: "memory-namespaces", "aria-label": "Namespaces" });
    this.mainEl = h("div", { class: "memory-main", testid: "memory-main" });
    fill(
      this.root,
      h(
        "section",
        { class: "card memory-page", testid: "memory-page" },
        h(
          "div",
          { class: "card-head" },
          h("h2", null, "Memory"),
          h("span", { class: "muted small" }, "what runs remembered: items in namespaces, searchable, linked"),
        ),
        h("div", { class: "memory-layout" }, this.nsEl, this.mainEl),
      ),
    );
  }

  /** Show `route` ({memNs, memKey, search}): the namespaces stay, the main area follows. */
  show(route) {
    const same = this.route.memNs === route.memNs && this.route.memKey === route.memKey && this.route.search === route.search;
    this.route = route;
    this.renderNamespaces();
    if (!same || !this.mainEl.firstChild) {
      this.loadMain();
      // Runs write memory meanwhile: the counts are read again at each move.
      if (this.loaded) this.loadNamespaces();
    }
  }

  async loadNamespaces() {
    try {
      const doc = await api("api/memory");
      if (this.closed) return;
      this.namespaces = doc.namespaces || [];
      this.loaded = true;
      this.renderNamespaces();
      if (this.route.memNs == null) this.loadMain();
    } catch (err) {
      this.onError(err);
    }
  }

  renderNamespaces() {
    if (!this.namespaces.length) {
      fill(this.nsEl, h("div", { class: "empty", testid: "memory-no-namespaces" }, "No memory yet."));
      return;
    }
    fill(
      this.nsEl,
      h(
        "ul",
        { class: "memory-ns-list" },
        this.namespaces.map((n) =>
          h(
            "li",
            null,
            h(
              "a",
              {
                href: memoryHash(n.namespace),
                class: "memory-ns",
                testid: "memory-namespace",
                dataset: { namespace: n.namespace },
                "aria-current": n.namespace === this.route.memNs ? "page" : null,
              },
              h("span", { class: "mono memory-ns-name" }, n.namespace),
              h("span", { class: "muted small", title: `${n.bytes} bytes` }, `${n.items}`),
            ),
          ),
        ),
      ),
    );
  }

  loadMain() {
    const { memNs, memKey, search } = this.route;
    if (memNs == null) return this.renderHome();
    if (memKey != null) return this.loadItem(memNs, memKey);
    return this.loadNamespace(memNs, search);
  }

  renderHome() {
    const total = this.namespaces.reduce((a, n) => a + n.items, 0);
    fill(
      this.mainEl,
      h(
        "div",
        { class: "memory-home", testid: "memory-home" },
        this.namespaces.length
          ? h("p", null, `${total} item${total === 1 ? "" : "s"} in ${this.namespaces.length} namespace${this.namespaces.length === 1 ? "" : "s"}. Pick one to list or search it.`)
          : h("p", { class: "muted" }, "Runs write memory with the memory.put and memory.link tools; what they wrote shows here."),
      ),
    );
  }

  /** A namespace: the search box, then the hits of its search or its items. */
  async loadNamespace(ns, search) {
    const input = h("input", {
      type: "search",
      class: "text-input memory-search-input",
      name: "search",
      placeholder: `search ${ns}`,
      "aria-label": `Search ${ns}`,
      testid: "memory-search-input",
      maxlength: 1000,
      value: search || "",
    });
    const form = h(
      "form",
      {
        class: "memory-search",
        testid: "memory-search",
        role: "search",
        onsubmit: (e) => {
          e.preventDefault();
          const text = input.value.trim();
          location.hash = memoryHash(ns, null, text || null);
        },
      },
      input,
      h("button", { class: "btn btn-primary btn-sm", type: "submit", testid: "memory-search-button" }, "Search"),
      search ? h("a", { class: "small", href: memoryHash(ns), testid: "memory-search-clear" }, "clear") : null,
    );
    const body = h("div", { class: "memory-body" }, h("div", { class: "empty" }, "Loading…"));
    fill(this.mainEl, h("div", { class: "memory-ns-head" }, h("h3", { class: "mono" }, ns), form), body);
    try {
      if (search) {
        const q = new URLSearchParams({ q: search, k: String(SEARCH_K) });
        const doc = await api(`api/memory/${encodeURIComponent(ns)}/search?${q}`);
        if (!this.closed && this.route.memNs === ns) this.renderHits(body, ns, search, doc);
      } else {
        const doc = await api(`api/memory/${encodeURIComponent(ns)}?limit=${PAGE}`);
        if (!this.closed && this.route.memNs === ns) this.renderItems(body, ns, doc.items, doc.next);
      }
    } catch (err) {
      fill(body, h("div", { class: "empty error-text", testid: "memory-error" }, err.message || String(err)));
      if (!(err instanceof ApiError && err.status === 422)) this.onError(err);
    }
  }

  renderItems(body, ns, items, next) {
    if (!items.length) {
      fill(body, h("div", { class: "empty", testid: "memory-empty" }, `Nothing in ${ns}.`));
      return;
    }
    const rows = h("tbody", null, items.map((it) => itemRow(it)));
    const more = next
      ? h(
          "button",
          {
            class: "btn btn-ghost btn-sm",
            testid: "memory-more",
            onclick: async () => {
              try {
                const q = new URLSearchParams({ limit: String(PAGE), after: next });
                const doc = await api(`api/memory/${encodeURIComponent(ns)}?${q}`);
                this.renderItems(body, ns, [...items, ...doc.items], doc.next);
              } catch (err) {
                this.onError(err);
              }
            },
          },
          "More items",
        )
      : null;
    fill(
      body,
      h(
        "table",
        { class: "schema-table memory-table", testid: "memory-items" },
        h("thead", null, h("tr", null, h("th", null, "key · version · updated"), h("th", null, "written by"), h("th", null, "value"))),
        rows,
      ),
      more,
    );
  }

  renderHits(body, ns, search, doc) {
    const e = doc.embedder || {};
    const info = h(
      "div",
      { class: "muted small memory-search-info", testid: "memory-search-info", dataset: { mode: doc.mode || "", asOf: String(doc.as_of ?? "") } },
      `${doc.items.length} hit${doc.items.length === 1 ? "" : "s"} for “${cut(search, 80)}” · ${doc.mode}`,
      e.id ? ` · vectors: ${e.id} (${e.kind}, ${e.dims} dims)` : null,
    );
    if (!doc.items.length) {
      fill(body, info, h("div", { class: "empty", testid: "memory-no-hits" }, "Nothing matches."));
      return;
    }
    const best = Math.max(...doc.items.map((i) => i.score), 1e-9);
    fill(
      body,
      info,
      h(
        "ol",
        { class: "memory-hits", testid: "memory-hits" },
        doc.items.map((it, i) =>
          h(
            "li",
            { class: "memory-hit", testid: "memory-hit", dataset: { key: it.key, score: String(it.score), rank: String(i + 1) } },
            h(
              "div",
              { class: "memory-hit-head" },
              itemLink(ns, it.key),
              h("span", { class: "memory-score", title: `score ${it.score}` }, h("span", { class: "memory-score-bar", style: { width: `${Math.max(4, (100 * it.score) / best)}%` } })),
              h("span", { class: "mono small muted", testid: "memory-hit-score" }, it.score.toFixed(4)),
            ),
            h("div", { class: "memory-preview small" }, compact(it.value, PREVIEW * 2)),
          ),
        ),
      ),
    );
  }

  /** An item: value, provenance, neighbours (graph), links, versions. */
  async loadItem(ns, key) {
    fill(this.mainEl, h("div", { class: "empty" }, "Loading…"));
    let it;
    try {
      it = await api(`api/memory/${encodeURIComponent(ns)}/${encodeURIComponent(key)}`);
    } catch (err) {
      if (this.closed) return;
      const gone = err instanceof ApiError && err.status === 404;
      fill(
        this.mainEl,
        crumbs(ns, key),
        h("div", { class: `empty${gone ? "" : " error-text"}`, testid: gone ? "memory-item-missing" : "memory-error" }, err.message || String(err)),
      );
      if (!gone) this.onError(err);
      return;
    }
    if (this.closed || this.route.memKey !== key || this.route.memNs !== ns) return;
    const graph = h("div", { class: "memory-graph", testid: "memory-graph" });
    fill(
      this.mainEl,
      h(
        "div",
        { class: "memory-item", testid: "memory-item", dataset: { namespace: it.namespace, key: it.key, version: String(it.version) } },
        h(
          "div",
          { class: "memory-item-head" },
          crumbs(ns, key),
          h("span", { class: "pill pill-sm tone-idle" }, `version ${it.version}`),
          h("div", { class: "spacer" }),
          h("button", { class: "btn btn-sm btn-danger", testid: "memory-delete", onclick: () => this.remove(it) }, "Delete"),
        ),
        h(
          "dl",
          { class: "memory-meta" },
          meta("written by", runRef(it.run_id, it.step_id)),
          meta("updated", timeEl(epoch(it.updated_at)) || "-"),
          meta("created", timeEl(epoch(it.created_at)) || "-"),
          it.expires_at ? meta("expires", timeEl(epoch(it.expires_at))) : null,
        ),
        h("h4", null, "Value"),
        h("pre", { class: "payload memory-value", testid: "memory-value" }, pretty(it.value)),
        it.text != null && it.text !== it.value ? h("details", { class: "small" }, h("summary", null, "indexed text"), h("pre", { class: "payload", testid: "memory-text" }, it.text)) : null,
        h("h4", null, "Neighbours ", h("span", { class: "muted small" }, "items linked to it, either way; click one to open it")),
        graph,
        h("h4", null, "Links", it.link_count > (it.links || []).length ? h("span", { class: "muted small" }, ` the first ${it.links.length} of ${it.link_count}`) : null),
        linksTable(it.links || []),
        h("h4", null, "Versions", it.versions > (it.history || []).length ? h("span", { class: "muted small", testid: "memory-versions-cut" }, ` the newest ${it.history.length} of ${it.versions}`) : null),
        historyList(it.history || []),
      ),
    );
    renderNeighbours(graph, it, it.neighbors || []);
  }

  async remove(it) {
    const sure = await confirmDialog({
      title: "Delete this item?",
      message: [h("p", null, "Item ", h("code", null, it.key), " of ", h("code", null, it.namespace), " will be gone from the memory: runs no longer find it."), h("p", { class: "muted small" }, "Its versions stay in its history.")],
      confirm: "Delete item",
    });
    if (!sure) return;
    try {
      const key = crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
      await api(`api/memory/${encodeURIComponent(it.namespace)}/${encodeURIComponent(it.key)}`, { method: "DELETE", headers: { "Idempotency-Key": `dashboard-${key}` } });
      toast(`Deleted ${it.namespace} / ${it.key}`, "ok");
      this.loadNamespaces();
      location.hash = memoryHash(it.namespace);
    } catch (err) {
      toast(`Not deleted: ${err.message || err}`, "bad");
    }
  }
}

function crumbs(ns, key) {
  return h("h3", { class: "memory-crumbs" }, h("a", { class: "mono", href: memoryHash(ns), testid: "memory-crumb-namespace" }, ns), h("span", { class: "muted" }, " / "), h("span", { class: "mono", testid: "memory-item-key" }, key));
}

function meta(label, value) {
  return h("div", { class: "meta" }, h("dt", null, label), h("dd", null, value));
}

function itemRow(it) {
  const at = epoch(it.updated_at);
  return h(
    "tr",
    { testid: "memory-item-row", dataset: { key: it.key } },
    // The key with its version and time under it: three columns fit the
    // page's middle pane, where five squeezed the value to a word a line.
    h(
      "td",
      null,
      itemLink(it.namespace, it.key),
      h(
        "div",
        { class: "muted small nowrap" },
        h("span", { class: "mono", testid: "memory-item-version" }, `v${it.version}`),
        " · ",
        at != null ? timeEl(at, SHORT.format(new Date(at * 1000))) : "-",
      ),
    ),
    h("td", { class: "small memory-writer" }, it.run_id ? runRef(it.run_id, it.step_id) : h("span", { class: "muted" }, "-")),
    h("td", { class: "small memory-preview" }, compact(it.value, PREVIEW)),
  );
}

function linksTable(links) {
  if (!links.length) return h("div", { class: "muted small", testid: "memory-no-links" }, "No links.");
  const ref = (r) => h("span", null, h("span", { class: "muted small" }, `${r.namespace} / `), itemLink(r.namespace, r.key));
  return h(
    "table",
    { class: "schema-table memory-table", testid: "memory-links" },
    h("thead", null, h("tr", null, h("th", null, "subject"), h("th", null, "relation"), h("th", null, "object"), h("th", null, "written"))),
    h(
      "tbody",
      null,
      links.map((l) =>
        h(
          "tr",
          { testid: "memory-link", dataset: { relation: l.relation } },
          h("td", null, ref(l.subject)),
          h("td", { class: "mono small" }, l.relation),
          h("td", null, ref(l.object)),
          h("td", { class: "small" }, timeEl(epoch(l.at)) || "-"),
        ),
      ),
    ),
  );
}

function historyList(history) {
  if (!history.length) return h("div", { class: "muted small" }, "No versions recorded.");
  return h(
    "ol",
    { class: "memory-history", testid: "memory-history" },
    history.map((v) =>
      h(
        "li",
        { class: `memory-version${v.deleted ? " deleted" : ""}`, testid: "memory-version", dataset: { version: String(v.version), deleted: String(!!v.deleted) } },
        h(
          "div",
          { class: "memory-version-head small" },
          h("strong", null, v.deleted ? "deleted" : `v${v.version}`),
          " ",
          timeEl(epoch(v.at)),
          " · ",
          runRef(v.run_id, v.step_id),
          v.op ? h("span", { class: "muted mono", title: "the write's exactly-once key" }, ` · ${cut(v.op, 60)}`) : null,
        ),
        v.deleted ? null : h("div", { class: "memory-preview small" }, compact(v.value, PREVIEW * 2)),
      ),
    ),
  );
}

/**
 * Draw an item and its neighbours: those that link to it on the left, those
 * it links to on the right (a neighbour linked both ways sits on the right,
 * an edge each way), each edge named by its relations. Several links between
 * the same two items are one edge with their relations joined.
 */
export function renderNeighbours(root, item, neighbours) {
  const nearest = neighbours.filter((n) => (n.depth || 1) === 1);
  if (!nearest.length) {
    fill(root, h("div", { class: "muted small", testid: "memory-no-neighbours" }, "No neighbours: nothing links to it, and it links to nothing."));
    return;
  }
  // One node per item, per side; its relations joined.
  const sides = { in: new Map(), out: new Map() };
  for (const n of nearest) {
    const side = sides[n.direction === "in" ? "in" : "out"];
    const id = `${n.namespace}\u0000${n.key}`;
    const node = side.get(id) || { ...n, relations: [] };
    if (!node.relations.includes(n.relation)) node.relations.push(n.relation);
    side.set(id, node);
  }
  const left = [...sides.in.values()];
  const right = [...sides.out.values()];
  const rows = Math.max(left.length, right.length, 1);
  const height = PAD * 2 + rows * NODE_H + (rows - 1) * ROW_GAP;
  const colX = [PAD, PAD + NODE_W + COL_GAP, PAD + 2 * (NODE_W + COL_GAP)];
  const width = colX[2] + NODE_W + PAD;
  const centre = { x: colX[1], y: (height - NODE_H) / 2 };
  const place = (list) => {
    const top = (height - (list.length * NODE_H + (list.length - 1) * ROW_GAP)) / 2;
    return list.map((n, i) => ({ n, x: 0, y: top + i * (NODE_H + ROW_GAP) }));
  };
  const placedLeft = place(left).map((p) => ({ ...p, x: colX[0] }));
  const placedRight = place(right).map((p) => ({ ...p, x: colX[2] }));

  // An edge's relations are written beside its neighbour's end, where edges do not cross.
  const edge = (x1, y1, x2, y2, relations, dataset, labelAt) => {
    const dx = (x2 - x1) / 2;
    const label = cut(relations.join(", "), RELATION_CHARS);
    const [lx, ly, anchor] = labelAt === "start" ? [x1 + 6, y1 - 5, "start"] : [x2 - 8, y2 - 5, "end"];
    return svg(
      "g",
      { class: "medge", testid: "memory-edge", dataset },
      svg("title", null, relations.join(", ")),
      svg("path", { class: "gedge", d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2 - 3},${y2}`, "marker-end": "url(#marrow)" }),
      svg("text", { class: "medge-label", x: lx, y: ly, "text-anchor": anchor }, label),
    );
  };
  const edges = [
    ...placedLeft.map((p) =>
      edge(p.x + NODE_W, p.y + NODE_H / 2, centre.x, centre.y + NODE_H / 2, p.n.relations, { relation: p.n.relations.join(","), from: p.n.key, to: item.key, direction: "in" }, "start"),
    ),
    ...placedRight.map((p) =>
      edge(centre.x + NODE_W, centre.y + NODE_H / 2, p.x, p.y + NODE_H / 2, p.n.relations, { relation: p.n.relations.join(","), from: item.key, to: p.n.key, direction: "out" }, "end"),
    ),
  ];
  const open = (n) => (location.hash = memoryHash(n.namespace, n.key));
  const node = (n, x, y, { self = false, direction = null } = {}) =>
    svg(
      "g",
      {
        class: `gnode mnode tone-${self ? "live" : "idle"}${self ? " mnode-self" : ""}`,
        transform: `translate(${x},${y})`,
        tabindex: self ? null : 0,
        role: self ? "img" : "link",
        "aria-label": `${n.namespace} / ${n.key}`,
        testid: self ? "memory-node-self" : "memory-node",
        dataset: { namespace: n.namespace, key: n.key, direction: direction || "" },
        onclick: self ? null : () => open(n),
        onkeydown: self
          ? null
          : (e) => {
              if (e.key === "Enter" || e.key === " ") {
                e.preventDefault();
                open(n);
              }
            },
      },
      svg("title", null, `${n.namespace} / ${n.key}\n${compact(n.value, 200)}`),
      svg("rect", { class: "gbox", width: NODE_W, height: NODE_H, rx: 7 }),
      svg("text", { class: "gmeta", x: 10, y: 16 }, cut(n.namespace, 28)),
      svg("text", { class: "gid", x: 10, y: 33 }, cut(n.key, KEY_CHARS)),
    );
  const picture = svg(
    "svg",
    { class: "graph-svg", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `${item.key} and ${left.length + right.length} neighbours` },
    svg("defs", null, svg("marker", { id: "marrow", viewBox: "0 0 8 8", refX: 7, refY: 4, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, svg("path", { class: "garrow", d: "M0,0 L8,4 L0,8 z" }))),
    svg("g", { class: "gedges" }, edges),
    svg(
      "g",
      { class: "gnodes" },
      node(item, centre.x, centre.y, { self: true }),
      placedLeft.map((p) => node(p.n, p.x, p.y, { direction: "in" })),
      placedRight.map((p) => node(p.n, p.x, p.y, { direction: "out" })),
    ),
  );
  fill(
    root,
    h("div", { class: "graph-scroll" }, picture),
    h("div", { class: "graph-legend muted small" }, h("span", { testid: "memory-linked-from" }, `← linked from ${left.length}`), h("span", { testid: "memory-links-to" }, `links to ${right.length} →`)),
  );
}

// -- a run's memory, for the run page ------------------------------------------------------

/**
 * The task of a memory call: a workflow's (`tool:memory.put:tool_3`,
 * tiffany/workflows/calls.py: the tool, the call's id) or an agent step's
 * (`tool:remember:chat`, tiffany/agents/tools/agent.py: the function, the step).
 */
const CALL_TASK = /^tool:(memory\.[a-z_]+|remember|recall):(.+)$/;
/** The memory tool an agent's function calls. */
const AGENT_FUNCTIONS = { remember: "memory.put", recall: "memory.search" };

/** The memory tools that change the memory; the others read it. */
const WRITES = new Set(["put", "link", "delete"]);

/** `{namespace, key}` of a reference given as an object or a `[namespace, key]` pair; null if neither. */
function refOf(value) {
  if (Array.isArray(value) && value.length === 2) return { namespace: String(value[0]), key: String(value[1]) };
  if (value && typeof value === "object" && value.namespace != null && value.key != null) return { namespace: String(value.namespace), key: String(value.key) };
  return null;
}

/**
 * What a run's `memory.*` steps read and wrote: one row a step, in the
 * plan's order (a workflow's calls: in the order it made them), with its
 * operation, whether it wrote, and the items it touched (from its output
 * when it has one: a put's key made from its op, a search's hits, the item
 * a get found; else from its plan arguments, resolved as the worker did).
 */
export function memoryOfRun(d) {
  const specs = new Map();
  const plan = d.entry && d.entry.plan;
  if (plan && Array.isArray(plan.steps)) for (const s of plan.steps) specs.set(s.id, s);
  const outputs = Object.fromEntries((d.steps || []).filter((s) => s.status === "succeeded").map((s) => [s.step_id, s.output]));
  // A plan's steps; a workflow's calls and an agent's remember / recall are
  // tasks (`tool:memory.put:tool_3`, `tool:remember:chat`), their result the output.
  const calls = [...(d.steps || [])];
  const stepIds = new Set(calls.map((s) => s.step_id));
  for (const t of d.tasks || []) {
    const m = typeof t.name === "string" ? t.name.match(CALL_TASK) : null;
    if (!m) continue;
    const agentTool = AGENT_FUNCTIONS[m[1]];
    if (!agentTool && stepIds.has(m[2])) continue; // a plan step's own task: the step says it
    calls.push({
      step_id: agentTool ? `${m[2]} · ${m[1]}` : m[2],
      tool: agentTool || m[1],
      status: t.status || statusWord(t.state),
      output: t.result,
    });
  }
  const rows = [];
  for (const s of calls) {
    const tool = s.tool || (specs.get(s.step_id) || {}).tool || "";
    if (!tool.startsWith("memory.")) continue;
    const op = tool.slice("memory.".length);
    let args = (specs.get(s.step_id) || {}).args || {};
    try {
      args = resolve(args, d.inputs || {}, outputs);
    } catch {
      // not resolvable yet (a step upstream has not run): the template is shown
    }
    const out = s.output && typeof s.output === "object" ? s.output : null;
    // A workflow's call has no plan args here: its output says what it touched.
    const found = out && out.item && typeof out.item === "object" ? out.item : null;
    const firstHit = out && Array.isArray(out.items) && out.items.length ? out.items[0] : null;
    const ns =
      (out && typeof out.namespace === "string" && out.namespace) ||
      args.namespace ||
      (found && found.namespace) ||
      (op === "search" && firstHit && firstHit.namespace) ||
      null;
    const touched = [];
    let detail = null;
    if (op === "link") {
      for (const r of [refOf(out && out.subject) || refOf(args.subject), refOf(out && out.object) || refOf(args.object)]) if (r) touched.push(r);
      detail = args.relation || (out && out.relation) || null;
    } else if (op === "search" || op === "neighbors") {
      const hits = out && Array.isArray(out.items) ? out.items : [];
      for (const it of hits) if (it && it.key != null) touched.push({ namespace: it.namespace || ns, key: String(it.key) });
      detail = op === "search" ? (args.query ?? args.q ?? null) : args.key != null ? `of ${args.key}` : null;
      if (op === "neighbors" && args.key != null && ns) touched.unshift({ namespace: ns, key: String(args.key), self: true });
    } else {
      const key = (out && out.key != null && out.key) || args.key || (found && found.key);
      // What a get did not find, or a delete removed, has no page to link to.
      const gone = (op === "get" && out && out.found === false) || (op === "delete" && out && out.deleted === true);
      if (ns && key != null) touched.push({ namespace: ns, key: String(key), gone });
      // memory.get answers {found, item, as_of} (tiffany/agents/tools/memory.py).
      if (op === "get" && out) detail = out.found === false || (out.found == null && !out.item) ? "not found" : out.item && out.item.version != null ? `found v${out.item.version}` : "found";
      if (op === "delete" && out && "deleted" in out) detail = out.deleted ? "deleted" : "nothing to delete";
    }
    rows.push({ stepId: s.step_id, op, tool, write: WRITES.has(op), status: s.status, namespace: ns, touched, detail });
  }
  return rows;
}

/** Draw `rows` (memoryOfRun's) into `root`: a table, a row a step, its items linked. */
export function renderRunMemory(root, rows) {
  fill(
    root,
    h(
      "table",
      { class: "schema-table memory-table", testid: "run-memory" },
      h("thead", null, h("tr", null, h("th", null, "step"), h("th", null, "op"), h("th", null, "namespace"), h("th", null, "items"), h("th", null, ""))),
      h(
        "tbody",
        null,
        rows.map((r) =>
          h(
            "tr",
            { testid: "run-memory-row", dataset: { stepId: r.stepId, op: r.op, write: String(r.write), status: r.status } },
            h("td", { class: "mono small" }, h("span", { class: `status-dot tone-${tone(r.status)}` }), " ", r.stepId),
            h("td", null, h("span", { class: `pill pill-sm tone-${r.write ? "wait" : "live"}`, title: r.write ? "wrote the memory" : "read the memory" }, `${r.write ? "wrote" : "read"} · ${r.op}`)),
            h("td", { class: "mono small" }, r.namespace ? h("a", { href: memoryHash(r.namespace), testid: "run-memory-namespace" }, r.namespace) : "-"),
            h(
              "td",
              { class: "small" },
              r.touched.length
                ? r.touched.slice(0, 8).map((t, i) => [i ? ", " : null, t.namespace !== r.namespace ? h("span", { class: "muted" }, `${t.namespace} / `) : null, t.gone ? h("span", { class: "mono muted", testid: "run-memory-gone", dataset: { key: t.key }, title: "not in the memory now" }, t.key) : itemLink(t.namespace, t.key, "run-memory-item")])
                : h("span", { class: "muted" }, r.status === "succeeded" ? "none" : "-"),
              r.touched.length > 8 ? h("span", { class: "muted" }, ` and ${r.touched.length - 8} more`) : null,
            ),
            h("td", { class: "small muted" }, r.detail != null ? (r.op === "search" ? `“${cut(String(r.detail), 60)}”` : String(r.detail)) : ""),
          ),
        ),
      ),
    ),
  );
}
