// The tools page (#/tools): what a plan step may call on this server, from
// GET /api/tools (the engine's answer): each enabled tool with its
// description, whether its result is journaled as one durable step, its
// arguments (name, type, required, default, description: the JSON Schema a
// submission is checked against) and its output's schema; the tools this
// server has but does not run, with how to enable one; the functions the
// `python` tool may call. A search box narrows the list by name or text.

import { api } from "./api.js";
import { fill, h, pretty } from "./dom.js";

/** A JSON Schema type as a short text: "string", "integer | null", "array of string", "Usage". */
export function typeText(schema) {
  if (!schema || typeof schema !== "object") return "any";
  if (schema.$ref) return schema.$ref.split("/").pop();
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (schema.anyOf || schema.oneOf) return (schema.anyOf || schema.oneOf).map(typeText).join(" | ");
  if (schema.type === "array") return `array of ${typeText(schema.items)}`;
  if (schema.type === "object" && schema.additionalProperties && typeof schema.additionalProperties === "object") {
    return `object of ${typeText(schema.additionalProperties)}`;
  }
  if (Array.isArray(schema.type)) return schema.type.join(" | ");
  return schema.type || "any";
}

/** Documentation text with its ``code`` and `code` spans as <code> (no HTML is parsed). */
export function docText(text) {
  const out = [];
  const re = /``([^`]+)``|`([^`]+)`/g;
  let at = 0;
  for (const m of String(text || "").matchAll(re)) {
    if (m.index > at) out.push(text.slice(at, m.index));
    out.push(h("code", null, m[1] ?? m[2]));
    at = m.index + m[0].length;
  }
  if (at < String(text || "").length) out.push(String(text).slice(at));
  return out;
}

/** A table of a schema's properties (null when it has none). */
function fields(schema, testid) {
  const props = (schema && schema.properties) || {};
  const names = Object.keys(props);
  if (!names.length) return null;
  const required = new Set((schema && schema.required) || []);
  return h(
    "table",
    { class: "schema-table", testid },
    h("thead", null, h("tr", null, h("th", null, "field"), h("th", null, "type"), h("th", null, "default"), h("th", null, "description"))),
    h(
      "tbody",
      null,
      names.map((n) => {
        const p = props[n];
        return h(
          "tr",
          { testid: "schema-field", dataset: { field: n, required: String(required.has(n)) } },
          h("td", { class: "field-name" }, h("code", null, n), required.has(n) ? h("span", { class: "req", title: "required" }, " *") : null),
          h("td", { class: "mono small" }, typeText(p)),
          h("td", { class: "mono small" }, "default" in p ? JSON.stringify(p.default) : ""),
          h("td", { class: "small" }, docText(p.description || "")),
        );
      }),
    ),
  );
}

function toolCard(t) {
  return h(
    "article",
    { class: "tool-card", testid: "tool-card", dataset: { tool: t.name, durable: String(!!t.durable) } },
    h(
      "div",
      { class: "tool-head" },
      h("code", { class: "tool-name" }, t.name),
      h(
        "span",
        {
          class: `pill pill-sm tone-${t.durable ? "ok" : "idle"}`,
          title: t.durable ? "Its result is journaled as one durable step: a replay never calls it again" : "It runs inside the step's worker task, journaled call by call",
        },
        t.durable ? "durable step" : "in the worker",
      ),
    ),
    h("p", { class: "tool-desc" }, docText(t.description)),
    h("div", { class: "tool-section small muted" }, "args", h("span", { class: "req" }, " *"), " required"),
    fields(t.args, "tool-args") || h("div", { class: "muted small" }, "No arguments."),
    h(
      "details",
      { class: "tool-output" },
      h("summary", null, "output"),
      fields(t.output, "tool-output-fields"),
      h("details", null, h("summary", { class: "small" }, "JSON Schema of args and output"), h("pre", { class: "payload" }, pretty({ args: t.args, output: t.output }))),
    ),
  );
}

/** Render the tools page into `root` (read once; the search box narrows what is shown). */
export async function renderTools(root, { onError }) {
  const list = h("div", { class: "tool-list", testid: "tool-list" });
  const search = h("input", { type: "search", class: "text-input input-sm tool-search", placeholder: "filter tools", "aria-label": "Filter tools", testid: "tool-filter" });
  const extra = h("div");
  fill(
    root,
    h(
      "section",
      { class: "card", testid: "tools-page" },
      h("div", { class: "card-head" }, h("h2", null, "Tools"), h("span", { class: "muted small" }, "what a plan step's ", h("code", null, "tool"), " may name on this server"), h("div", { class: "spacer" }), search),
      h("div", null, h("div", { class: "empty" }, "Asking the engine…")),
    ),
    extra,
  );
  let doc;
  try {
    doc = await api("api/tools");
  } catch (err) {
    onError(err);
    fill(root.querySelector(".card > div:last-child"), h("div", { class: "empty error-text" }, `The engine did not answer: ${err.message || err}`));
    return;
  }
  fill(root.querySelector(".card > div:last-child"), list);
  const show = () => {
    const q = search.value.trim().toLowerCase();
    const tools = (doc.tools || []).filter((t) => !q || t.name.toLowerCase().includes(q) || (t.description || "").toLowerCase().includes(q));
    fill(list, tools.length ? tools.map(toolCard) : h("div", { class: "empty" }, "No tool matches."));
  };
  search.addEventListener("input", show);
  show();
  const disabled = doc.disabled || [];
  const fns = doc.python_functions || [];
  fill(
    extra,
    disabled.length
      ? h(
          "section",
          { class: "card", testid: "tools-disabled" },
          h("div", { class: "card-head" }, h("h2", null, "Not enabled on this server")),
          h(
            "div",
            null,
            h("ul", { class: "plain-list" }, disabled.map((n) => h("li", { testid: "tool-disabled", dataset: { tool: n } }, h("code", null, n), h("span", { class: "muted small" }, " start the server with ", h("code", null, `--enable-tool ${n}`))))),
          ),
        )
      : null,
    h(
      "section",
      { class: "card", testid: "tools-python" },
      h("div", { class: "card-head" }, h("h2", null, "Python functions"), h("span", { class: "muted small" }, "what the ", h("code", null, "python"), " tool may call")),
      h(
        "div",
        null,
        fns.length
          ? h("ul", { class: "plain-list" }, fns.map((n) => h("li", { testid: "python-function" }, h("code", null, n))))
          : h("div", { class: "muted small" }, "None registered (", h("code", null, "--import MODULE"), " or ", h("code", null, "TIFFANY_TOOL_MODULES"), " loads a module's ", h("code", null, "@python_tool"), " functions)."),
      ),
    ),
  );
}
