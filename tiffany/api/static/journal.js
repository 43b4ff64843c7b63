// The journal records of a run (decoded WAL records), as a table with
// expandable payloads, paged forward with `after`.

import { api } from "./api.js";
import { compact, fill, h, pretty } from "./dom.js";

const PAGE = 200;
const MAX_ROWS = 5000;

const TYPE_TONE = {
  RUN_START: "live",
  RUN_END: "ok",
  SPAWN: "live",
  DISPATCH: "idle",
  OUTCOME: "idle",
  STEP_START: "live",
  WAKE: "wait",
  TASK_EXIT: "ok",
  CANCEL: "warn",
};

export class Journal {
  constructor(root, runId, { onError, minSeq = () => null }) {
    this.root = root;
    this.runId = runId;
    this.onError = onError;
    this.minSeq = minSeq; // the WAL seq the store must have projected (the run page's)
    this.after = 0;
    this.done = false;
    this.count = 0;
    this.loading = false;
    this.ltidFilter = null;
    this.body = h("tbody", { testid: "journal-rows" });
    this.more = h("button", { class: "btn btn-ghost btn-sm", testid: "journal-more", onclick: () => this.load() }, "Load more");
    this.status = h("span", { class: "muted small", testid: "journal-status" });
    fill(
      root,
      h(
        "table",
        { class: "journal", testid: "journal" },
        h("thead", null, h("tr", null, h("th", { class: "num" }, "seq"), h("th", null, "type"), h("th", { class: "num" }, "task"), h("th", null, "data"))),
        this.body,
      ),
      h("div", { class: "journal-foot" }, this.status, this.more),
    );
  }

  /** Load the next page (or, once at the end, anything new since). */
  async load() {
    if (this.loading || this.count >= MAX_ROWS) return;
    this.loading = true;
    this.more.disabled = true;
    try {
      const q = new URLSearchParams({ after: String(this.after), limit: String(PAGE) });
      const want = this.minSeq();
      if (want != null) q.set("min_seq", String(want));
      const data = await api(`api/runs/${encodeURIComponent(this.runId)}/events?${q}`);
      const recs = data.records || [];
      const frag = document.createDocumentFragment();
      for (const rec of recs) {
        if (this.count >= MAX_ROWS) break;
        frag.append(...this.rows(rec));
        this.after = Math.max(this.after, rec.seq);
        this.count++;
      }
      this.body.append(frag);
      this.done = data.next_after == null;
      if (data.next_after != null) this.after = Math.max(this.after, data.next_after);
      this.applyFilter();
    } catch (err) {
      // Read with the run page's min_seq; without one (a bare link) an unknown run is a 404.
      if (err.status !== 404) this.onError(err);
      this.done = true;
    } finally {
      this.loading = false;
      this.more.disabled = false;
      this.status.textContent = `${this.count} record${this.count === 1 ? "" : "s"}${this.count >= MAX_ROWS ? " (display limit)" : ""}`;
      this.more.textContent = this.done ? "Check for new records" : "Load more";
    }
  }

  rows(rec) {
    const payload = h("tr", { class: "payload-row", hidden: true }, h("td", { colspan: 4 }, h("pre", { class: "payload", testid: "journal-payload" }, pretty(rec.data))));
    const row = h(
      "tr",
      {
        class: "journal-row",
        testid: "journal-row",
        tabindex: 0,
        "aria-expanded": "false",
        dataset: { seq: String(rec.seq), type: rec.type, ltid: rec.ltid == null ? "" : String(rec.ltid) },
        onclick: () => toggle(),
        onkeydown: (e) => {
          if (e.key === "Enter" || e.key === " ") {
            e.preventDefault();
            toggle();
          }
        },
      },
      h("td", { class: "num mono" }, String(rec.seq)),
      h("td", null, h("span", { class: `rtype tone-${TYPE_TONE[rec.type] || "idle"}` }, rec.type)),
      h("td", { class: "num mono" }, rec.ltid == null ? "" : String(rec.ltid)),
      h("td", { class: "mono data-cell" }, h("span", { class: "caret" }, "▸"), " ", compact(rec.data, 160)),
    );
    const toggle = () => {
      payload.hidden = !payload.hidden;
      row.setAttribute("aria-expanded", String(!payload.hidden));
      row.classList.toggle("open", !payload.hidden);
    };
    return [row, payload];
  }

  /** Show only the records of task `ltid` (null: all). */
  filter(ltid) {
    this.ltidFilter = ltid;
    this.applyFilter();
  }

  applyFilter() {
    const want = this.ltidFilter == null ? null : String(this.ltidFilter);
    for (const row of this.body.querySelectorAll(".journal-row")) {
      const show = want == null || row.dataset.ltid === want;
      row.hidden = !show;
      if (!show) row.nextElementSibling.hidden = true;
    }
  }
}
