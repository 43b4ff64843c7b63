// A side-by-side line diff of two JSON values (expected vs actual), for
// replay divergences. LCS over lines; values are small (one dispatch).

import { h, pretty } from "./dom.js";

const MAX_LINES = 400;

function lines(v) {
  return pretty(v).split("\n").slice(0, MAX_LINES);
}

/** Pairs of [left, right, kind] rows; kind is "same", "del", "add" or "chg". */
export function diffLines(a, b) {
  const n = a.length;
  const m = b.length;
  const L = Array.from({ length: n + 1 }, () => new Uint16Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  let dels = [];
  let adds = [];
  const flush = () => {
    const k = Math.max(dels.length, adds.length);
    for (let x = 0; x < k; x++) {
      const l = dels[x];
      const r = adds[x];
      out.push([l ?? null, r ?? null, l != null && r != null ? "chg" : l != null ? "del" : "add"]);
    }
    dels = [];
    adds = [];
  };
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) {
      flush();
      out.push([a[i], b[j], "same"]);
      i++;
      j++;
    } else if (j < m && (i >= n || L[i][j + 1] >= L[i + 1][j])) {
      adds.push(b[j++]);
    } else {
      dels.push(a[i++]);
    }
  }
  flush();
  return out;
}

/** A two-column diff table: the journal's record (expected) vs the replay (actual). */
export function renderDiff(expected, actual, { left = "expected (journal)", right = "actual (replay)" } = {}) {
  const rows = diffLines(lines(expected), lines(actual));
  return h(
    "table",
    { class: "diff", testid: "divergence-diff" },
    h("thead", null, h("tr", null, h("th", { class: "diff-exp" }, left), h("th", { class: "diff-act" }, right))),
    h(
      "tbody",
      null,
      rows.map(([l, r, kind]) =>
        h(
          "tr",
          { class: `diff-${kind}` },
          h("td", { class: l == null ? "blank" : kind === "same" ? "" : "minus" }, h("code", null, l ?? "")),
          h("td", { class: r == null ? "blank" : kind === "same" ? "" : "plus" }, h("code", null, r ?? "")),
        ),
      ),
    ),
  );
}
