// A plan step's arguments and attempts on the run page.
//
// Arguments: resolved as the worker saw them (`${inputs.x}` and
// `${steps.ID.output...}` replaced from the run's inputs and the steps'
// recorded outputs: refs.js), the raw template behind a toggle.
// Attempts: every attempt of the step, each with its outcome, local start
// time, duration, error, and its standard output and error as text (a
// shell step's output, or the fields of its `tool.shell.exit` error). While
// the step runs, its `tool.output` events from the live feed are tailed.

import { compact, duration, h, pretty, statusWord, timeEl, tone } from "./dom.js";
import { hasRefs, RefError, resolve } from "./refs.js";

/** Lines of live output kept per step. */
export const LIVE_LINES = 200;

/**
 * The args block: resolved (or the template, when `showTemplate`), with a
 * toggle when the template holds references. `inputs`: the run's inputs;
 * `outputs`: step id -> recorded output (succeeded steps only).
 */
export function argsBlock(args, { inputs, outputs, showTemplate, onToggle }) {
  if (!args || !Object.keys(args).length) return null;
  if (!hasRefs(args)) return kvBlock("args", args, "step-args");
  let resolved = null;
  let problem = null;
  try {
    resolved = resolve(args, inputs || {}, outputs);
  } catch (err) {
    if (!(err instanceof RefError)) throw err;
    problem = err.message;
  }
  const template = showTemplate || resolved === null;
  const toggle = h(
    "button",
    {
      class: "btn btn-ghost btn-sm args-toggle",
      type: "button",
      testid: "args-toggle",
      disabled: resolved === null,
      "aria-pressed": String(template),
      title: template ? "Show the arguments as the worker resolved them" : "Show the plan's template, with its ${…} references",
      onclick: onToggle,
    },
    template ? "resolved" : "template",
  );
  return h(
    "div",
    { class: "kv", testid: "step-args", dataset: { view: template ? "template" : "resolved" } },
    h("div", { class: "kv-label" }, template ? "args (template)" : "args", h("br"), toggle),
    h(
      "div",
      null,
      h("pre", { class: "payload", testid: "step-args-value" }, pretty(template ? args : resolved)),
      problem ? h("div", { class: "muted small", testid: "step-args-pending" }, `not resolved yet: ${problem}`) : null,
    ),
  );
}

/** The mark of an attempt that started again after the engine crashed (at-least-once). */
function rerunMark(a) {
  if (!a || !a.rerun_after_crash) return null;
  return h(
    "span",
    {
      class: "status-text tone-warn small",
      testid: "attempt-rerun",
      title: "The engine crashed while this attempt ran: its tool was called again (at-least-once)",
    },
    "re-run after a crash",
  );
}

/** Every attempt of a step (and, while it runs, its live output), newest last. */
export function attemptsBlock(step, { running, liveLines }) {
  const all = (step.attempts || []).filter((a) => a && !a.reused);
  // An attempt without `ok` is the one running (the store marks a re-run as it starts).
  const attempts = all.filter((a) => a.ok !== undefined);
  const current = all.find((a) => a.ok === undefined) || null;
  const last = attempts.length ? attempts[attempts.length - 1] : null;
  const items = attempts.map((a) => {
    const ok = a.ok === true;
    const word = ok ? "succeeded" : "failed";
    // The successful attempt's output is the step's; a failed one's is in its error's fields.
    const source = ok && a === last ? step.output : a.error;
    return h(
      "li",
      { class: `attempt tone-border-${tone(word)}`, testid: "attempt", dataset: { attempt: String(a.attempt), status: word } },
      h(
        "div",
        { class: "attempt-head" },
        h("strong", null, `attempt ${a.attempt}`),
        h("span", { class: `status-text tone-${tone(word)}`, testid: "attempt-status" }, word),
        rerunMark(a),
        a.started_at != null ? timeEl(a.started_at) : null,
        a.started_at != null && a.ended_at != null ? h("span", { class: "muted small" }, duration(a.ended_at - a.started_at)) : null,
      ),
      !ok && a.error
        ? h("div", { class: "attempt-error error-text", testid: "attempt-error" }, errorLine(a.error))
        : null,
      logView(source),
    );
  });
  if (running) {
    const n = current && current.attempt ? current.attempt : attempts.length + 1;
    items.push(
      h(
        "li",
        { class: "attempt tone-border-live", testid: "attempt", dataset: { attempt: String(n), status: "running" } },
        h(
          "div",
          { class: "attempt-head" },
          h("strong", null, `attempt ${n}`),
          h("span", { class: "status-text tone-live", testid: "attempt-status" }, statusWord("running")),
          rerunMark(current),
        ),
        h(
          "pre",
          { class: "log live-log", testid: "step-live-log", "aria-live": "polite" },
          liveLines.length ? liveLines.join("\n") : "waiting for output…",
        ),
      ),
    );
  }
  if (!items.length) return null;
  const rerun = all.some((a) => a.rerun_after_crash);
  // One attempt that succeeded with no log (and ran once) adds nothing to the step's row.
  if (items.length === 1 && !running && !rerun && last.ok === true && !logView(step.output)) return null;
  return h(
    "details",
    {
      class: "attempts",
      testid: "step-attempts",
      // Open when there is something to read: a failure, a re-run, a log, live output.
      open: running || rerun || attempts.some((a) => a.ok !== true) || !!logView(step.output) || undefined,
    },
    h("summary", null, `${items.length} attempt${items.length > 1 ? "s" : ""}`, running ? " · running" : ""),
    h("ol", { class: "attempt-list" }, items),
  );
}

/**
 * A step's live output lines from the feed's `tool.output` events. A shell
 * line comes as `{stream, text, partial}`: `partial` says the stream's next
 * text goes on the same line (a long line's pieces, or output that waited
 * for its newline). Any other event (a notice of lines held back) ends them.
 */
export function liveLinesOf(events, runId, stepId) {
  const out = [];
  const open = new Map(); // stream -> index in `out` of its unfinished line
  for (const e of events) {
    if (e.run !== runId || e.kind !== "tool.output" || !e.data || e.data.step !== stepId) continue;
    const d = e.data;
    if (d.stream && typeof d.text === "string") {
      let at = open.get(d.stream);
      if (at === undefined) at = out.push(d.text) - 1;
      else out[at] += d.text;
      if (d.partial) open.set(d.stream, at);
      else open.delete(d.stream);
      continue;
    }
    open.clear();
    const text = d.text ?? d.line ?? d.message ?? (d.child_run ? `child run ${d.child_run}` : compact(d, 200));
    out.push(`${d.level && d.level !== "info" ? `[${d.level}] ` : ""}${text}`);
  }
  return out.slice(-LIVE_LINES);
}

function errorLine(err) {
  const type = err.code || err.type;
  return `${type ? `${type}: ` : ""}${err.message || compact(err, 300)}`;
}

/** stdout and stderr of `value` (an output or an error's fields) as text, or null if it has none. */
function logView(value) {
  if (!value || typeof value !== "object") return null;
  const streams = ["stdout", "stderr"].filter((k) => typeof value[k] === "string");
  if (!streams.length) return null;
  return h(
    "div",
    { class: "log-view", testid: "step-log" },
    streams.map((k) =>
      h(
        "div",
        { class: `log-stream log-${k}` },
        h(
          "div",
          { class: "log-label muted small" },
          k,
          value[`${k}_truncated`] ? " (cut at the output limit)" : "",
          value[k] === "" ? " (empty)" : "",
        ),
        value[k] === "" ? null : h("pre", { class: "log", testid: `log-${k}` }, value[k]),
      ),
    ),
  );
}

function kvBlock(label, value, testid) {
  return h("div", { class: "kv", testid }, h("div", { class: "kv-label" }, label), h("pre", { class: "payload", testid: "step-args-value" }, pretty(value)));
}
