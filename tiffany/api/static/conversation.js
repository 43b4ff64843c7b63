// An agent step's conversation on the run page: the goal, then each turn (the
// model's text, its tokens and cost, the tool calls it asked for with their
// arguments and what they returned), then the answer. Read from
// GET /api/runs/{id}/steps/{step}/conversation (the journaled model and tool
// calls: tiffany/store/conversation.py), again whenever the step's row
// changes, and while the step runs, whenever the run's does.
// The tasks of the conversation also name the timeline's rows (`labels`):
// a model call is "model · turn N", a tool call its tool, where the task
// row alone could only say the step's tool ("agent").

import { api } from "./api.js";
import { compact, fill, h, pretty, statusWord, tone } from "./dom.js";
import { RefError, resolve } from "./refs.js";

/** Longest text of a tool result or arguments shown open (longer: folded). */
const OPEN_CHARS = 600;

export class Conversations {
  constructor(runId, { onError, onLoaded }) {
    this.runId = runId;
    this.onError = onError;
    this.onLoaded = onLoaded; // a conversation arrived: redraw
    this.byStep = new Map(); // step id -> {key, data, loading}
    this.version = 0; // moves with each conversation read (the page redraws on a change)
  }

  /** The agent steps of the run detail `d`. */
  static steps(d) {
    return (d.steps || []).filter((s) => s.tool === "agent");
  }

  /** Fetch the conversations whose step (or, while it runs, whose run) changed since the last read. */
  sync(d) {
    for (const s of Conversations.steps(d)) {
      if (s.status === "pending") continue; // nothing said yet
      const running = s.status === "running";
      const key = running ? `run:${d.last_seq}` : `step:${s.status}:${s.last_seq}`;
      const have = this.byStep.get(s.step_id) || { key: null, data: null, loading: false };
      this.byStep.set(s.step_id, have);
      if (have.key === key || have.loading) continue;
      have.loading = true;
      api(`api/runs/${encodeURIComponent(this.runId)}/steps/${encodeURIComponent(s.step_id)}/conversation`)
        .then((data) => {
          have.data = data;
          have.key = key;
          this.version++;
        })
        .catch((err) => {
          have.key = key; // not asked again until the step changes
          this.onError(err);
        })
        .finally(() => {
          have.loading = false;
          this.onLoaded();
        });
    }
  }

  /** ltid -> a timeline label for the tasks of the conversations read. */
  labels() {
    const out = new Map();
    for (const { data } of this.byStep.values()) {
      for (const t of (data && data.turns) || []) {
        out.set(t.ltid, `model · turn ${t.turn}`);
        for (const c of t.tool_calls) if (c.ltid != null) out.set(c.ltid, c.tool);
      }
    }
    return out;
  }

  /** The conversation of step `stepId` (null: not read yet). */
  get(stepId) {
    const have = this.byStep.get(stepId);
    return have ? have.data : null;
  }
}

/** "107 tokens · $0.0012" (null: no usage). */
export function tokensText(usage, usd) {
  const n = usage && (usage.total_tokens ?? usage.tokens);
  const parts = [];
  if (n != null) parts.push(`${Number(n).toLocaleString()} tokens`);
  if (usd != null) parts.push(`$${Number(usd).toFixed(4)}`);
  return parts.length ? parts.join(" · ") : null;
}

/** A JSON value: on one line when short, open when a few lines, folded under its summary when long. */
function value(label, v, testid) {
  const short = compact(v, 200);
  const text = short.length <= 90 && !short.endsWith("…") ? short : pretty(v);
  const pre = h("pre", { class: "payload" }, text);
  return h(
    "div",
    { class: "kv", testid },
    h("div", { class: "kv-label" }, label),
    text.length > OPEN_CHARS ? h("details", null, h("summary", null, compact(v, 90)), pre) : pre,
  );
}

function toolCall(c) {
  const st = c.status || (c.ok === false ? "failed" : c.ok === true ? "succeeded" : "pending");
  const word = c.ltid == null && c.ok === false ? "refused" : statusWord(st);
  return h(
    "div",
    {
      class: `tool-call tone-border-${tone(word === "refused" ? "failed" : word)}`,
      testid: "tool-call",
      dataset: { tool: c.tool || "", status: word, ltid: c.ltid == null ? "" : String(c.ltid) },
    },
    h(
      "div",
      { class: "call-head" },
      h("span", { class: "call-arrow", "aria-hidden": "true" }, "→"),
      h("span", { class: "tool-tag" }, c.tool || "?"),
      c.id ? h("span", { class: "muted small mono" }, c.id) : null,
      h("div", { class: "spacer" }),
      h("span", { class: `pill pill-sm tone-${tone(word === "refused" ? "failed" : word)}`, testid: "tool-call-status" }, word),
    ),
    value("args", c.arguments ?? {}, "tool-call-args"),
    c.error != null
      ? value("error", c.error, "tool-call-error")
      : c.result != null
        ? value("result", c.result, "tool-call-result")
        : c.ltid == null && c.ok === false
          ? h("div", { class: "muted small" }, "Not run: the model was told why (a tool this step was not given, or arguments the tool refused).")
          : null,
  );
}

function turnBlock(t) {
  const st = statusWord(t.status);
  return h(
    "section",
    { class: "turn", testid: "agent-turn", dataset: { turn: String(t.turn), attempt: String(t.attempt), status: st } },
    h(
      "div",
      { class: "turn-head" },
      h("span", { class: "turn-no" }, `Turn ${t.turn}`),
      t.model ? h("span", { class: "muted small" }, t.model) : null,
      h("div", { class: "spacer" }),
      h("span", { class: "muted small", testid: "turn-usage" }, tokensText(t.usage, t.cost_usd) || ""),
      st !== "succeeded" ? h("span", { class: `pill pill-sm tone-${tone(st)}` }, st) : null,
    ),
    t.text != null && t.text !== ""
      ? h("div", { class: "bubble bubble-model", testid: "turn-text" }, t.text)
      : t.text == null && st === "running"
        ? h("div", { class: "bubble bubble-model muted" }, "…")
        : null,
    t.error != null ? h("pre", { class: "payload error-text" }, pretty(t.error)) : null,
    t.tool_calls.length ? h("div", { class: "tool-calls" }, t.tool_calls.map(toolCall)) : null,
  );
}

/**
 * The conversation `c` of an agent step. `inputs`, `outputs`: the run's
 * inputs and its steps' recorded outputs, to resolve the goal's references.
 */
export function renderConversation(root, c, { inputs, outputs }) {
  if (!c) {
    fill(root, h("div", { class: "empty" }, "Loading the conversation…"));
    return;
  }
  const args = c.args || {};
  let goal = args.goal;
  try {
    goal = resolve(args.goal, inputs || {}, outputs || {});
  } catch (err) {
    if (!(err instanceof RefError)) throw err;
  }
  const attempts = [...new Set(c.turns.map((t) => t.attempt))];
  const blocks = [];
  for (const a of attempts) {
    if (attempts.length > 1) blocks.push(h("div", { class: "attempt-sep muted small" }, `Attempt ${a}`));
    blocks.push(...c.turns.filter((t) => t.attempt === a).map(turnBlock));
  }
  const total = tokensText(c.usage, c.cost_usd);
  fill(
    root,
    h(
      "div",
      { class: "conversation", testid: "conversation", dataset: { stepId: c.step_id, status: c.status } },
      goal != null
        ? h(
            "div",
            { class: "turn turn-goal" },
            h("div", { class: "turn-head" }, h("span", { class: "turn-no" }, "Goal"), args.tools ? h("span", { class: "muted small" }, `tools: ${args.tools.join(", ") || "none"}`) : null),
            h("div", { class: "bubble bubble-user", testid: "conversation-goal" }, typeof goal === "string" ? goal : pretty(goal)),
          )
        : null,
      blocks.length ? blocks : h("div", { class: "empty" }, "No model call yet."),
      c.answer != null
        ? h(
            "div",
            { class: "turn turn-answer" },
            h("div", { class: "turn-head" }, h("span", { class: "turn-no" }, "Answer"), h("div", { class: "spacer" }), total ? h("span", { class: "muted small", testid: "conversation-usage" }, `${c.turns.length} turns · ${total}`) : null),
            h("div", { class: "bubble bubble-answer", testid: "conversation-answer" }, c.answer),
          )
        : null,
    ),
  );
}
