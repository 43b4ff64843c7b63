// The replay verification report: the verdict and, for a divergence, the
// journal's record against what the replay did, as a side-by-side diff.

import { renderDiff } from "./diff.js";
import { compact, fill, h, pretty, tone } from "./dom.js";

/** The verdict of a report: identical, diverged, problems (or its status). */
export function verdictOf(v) {
  // `tiffany replay --verify --json` says `ok`; a `status` verdict is accepted too.
  if (v.divergence || v.status === "diverged") return "diverged";
  if (v.ok === false) return "problems";
  if (v.ok || v.identical || v.status === "identical") return "identical";
  return v.status;
}

/** Render the report `v` of POST /api/runs/{id}/verify into `el`. */
export function renderVerify(el, v) {
  const div = v.divergence;
  const verdict = verdictOf(v);
  const skip = new Set(["expected", "actual", "message", "stack", "code"]);
  const rest = div ? Object.fromEntries(Object.entries(div).filter(([k]) => !skip.has(k))) : null;
  fill(
    el,
    h(
      "section",
      { class: `card verify-card tone-border-${tone(verdict)}`, testid: "verify-result", dataset: { status: verdict } },
      h(
        "div",
        { class: "verify-head" },
        h("h3", null, "Replay verification"),
        h("span", { class: `pill tone-${tone(verdict)}`, testid: "verify-status" }, verdict),
        h(
          "span",
          { class: "muted small" },
          [v.dispatches != null ? `${v.dispatches} dispatches` : null, v.records != null ? `${v.records} records` : null, v.status && v.status !== verdict ? `run ${v.status}` : null]
            .filter(Boolean)
            .join(" · "),
        ),
        h("div", { class: "spacer" }),
        h("button", { class: "btn btn-ghost btn-sm", onclick: () => fill(el), "aria-label": "close" }, "✕"),
      ),
      verdict === "identical" ? h("p", { class: "muted" }, "The replay issued the same dispatches, in the same order, with the same arguments as the journal.") : null,
      div
        ? h(
            "div",
            { class: "divergence", testid: "divergence" },
            h(
              "p",
              null,
              h("strong", null, `First divergence (${div.what || "dispatch"})`),
              div.dispatch != null ? [" at dispatch ", h("code", null, String(div.dispatch))] : null,
              div.seq != null && div.seq >= 0 ? [", journal seq ", h("code", null, String(div.seq))] : null,
              div.task != null ? [", task ", h("code", null, `${div.task_name || ""} #${div.task}`)] : null,
              div.ltid != null ? [", task ", h("code", null, String(div.ltid))] : null,
            ),
            div.message ? h("p", { class: "muted small mono" }, div.message) : null,
            renderDiff(div.expected, div.actual),
            Array.isArray(div.stack) && div.stack.length
              ? h("details", null, h("summary", null, "where the replay was (task stack)"), h("pre", { class: "payload" }, div.stack.join("\n")))
              : null,
            rest && Object.keys(rest).length ? h("details", null, h("summary", null, "all fields"), h("pre", { class: "payload" }, pretty(rest))) : null,
          )
        : null,
      v.problems && v.problems.length
        ? h("ul", { class: "problems", testid: "verify-problems" }, v.problems.map((p) => h("li", null, typeof p === "string" ? p : compact(p, 300))))
        : null,
    ),
  );
}
