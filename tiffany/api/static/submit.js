// The submit form: a plan as JSON or YAML text (typed, pasted or from a
// file), inputs as JSON; shows the server's 422 field errors beside it.

import { api, ApiError } from "./api.js";
import { fill, h, toast } from "./dom.js";

const EXAMPLE = `{
  "name": "ui-demo",
  "steps": [
    {"id": "a", "tool": "sleep", "args": {"seconds": 0.5}},
    {"id": "b", "tool": "sleep", "args": {"seconds": 0.5}, "after": ["a"]},
    {"id": "c", "tool": "sleep", "args": {"seconds": 0.25}, "after": ["a"]}
  ]
}`;

const MAX_FILE_BYTES = 2 * 1024 * 1024;

/** Render the form into `root`; `onCreated(runId, name)` after a 201. */
export function renderSubmit(root, { onCreated }) {
  const plan = h("textarea", {
    id: "plan-text",
    class: "code-input",
    rows: 14,
    spellcheck: false,
    placeholder: "Paste a plan (JSON or YAML)…",
    testid: "plan-input",
    "aria-describedby": "submit-errors",
  });
  const inputs = h("textarea", {
    id: "inputs-text",
    class: "code-input",
    rows: 3,
    spellcheck: false,
    placeholder: "{}",
    testid: "inputs-input",
  });
  const key = h("input", {
    id: "idem-key",
    type: "text",
    class: "text-input",
    placeholder: "optional",
    autocomplete: "off",
    testid: "idempotency-input",
  });
  const file = h("input", {
    type: "file",
    accept: ".json,.yaml,.yml,application/json,text/yaml",
    class: "visually-hidden",
    id: "plan-file",
    testid: "plan-file",
  });
  const errors = h("div", { id: "submit-errors", class: "form-errors", testid: "submit-errors", role: "alert", hidden: true });
  const button = h("button", { type: "submit", class: "btn btn-primary", testid: "submit-button" }, "Start run");
  const fileName = h("span", { class: "muted small" });

  file.addEventListener("change", async () => {
    const f = file.files && file.files[0];
    if (!f) return;
    if (f.size > MAX_FILE_BYTES) {
      showErrors([{ loc: "plan", msg: `file is ${Math.round(f.size / 1024)} KiB; the limit is 2 MiB` }]);
      return;
    }
    plan.value = await f.text();
    fileName.textContent = f.name;
    showErrors([]);
  });

  function showErrors(list) {
    errors.hidden = list.length === 0;
    fill(
      errors,
      list.length ? h("p", { class: "form-errors-title" }, list.length === 1 ? "The plan has a problem:" : `The plan has ${list.length} problems:`) : null,
      h(
        "ul",
        null,
        list.map((e) =>
          h(
            "li",
            { testid: "field-error", dataset: { loc: e.loc || "" } },
            e.loc ? h("code", { class: "loc" }, e.loc) : null,
            " ",
            h("span", null, e.msg),
          ),
        ),
      ),
    );
    plan.classList.toggle("invalid", list.some((e) => !String(e.loc || "").startsWith("inputs")));
    inputs.classList.toggle("invalid", list.some((e) => String(e.loc || "").startsWith("inputs")));
  }

  async function submit(ev) {
    ev.preventDefault();
    const text = plan.value.trim();
    if (!text) {
      showErrors([{ loc: "plan", msg: "paste a plan or choose a file" }]);
      return;
    }
    let doc = text;
    if (text.startsWith("{")) {
      try {
        doc = JSON.parse(text);
      } catch (err) {
        showErrors([{ loc: "plan", msg: `invalid JSON: ${err.message}` }]);
        return;
      }
    }
    let inp = {};
    if (inputs.value.trim()) {
      try {
        inp = JSON.parse(inputs.value);
      } catch (err) {
        showErrors([{ loc: "inputs", msg: `invalid JSON: ${err.message}` }]);
        return;
      }
      if (!inp || typeof inp !== "object" || Array.isArray(inp)) {
        showErrors([{ loc: "inputs", msg: "must be a JSON object" }]);
        return;
      }
    }
    const headers = key.value.trim() ? { "Idempotency-Key": key.value.trim() } : {};
    button.disabled = true;
    button.textContent = "Starting…";
    try {
      const res = await api("api/runs", { method: "POST", body: { plan: doc, inputs: inp }, headers });
      showErrors([]);
      const name = (doc && doc.name) || (String(text).match(/^name:\s*(.+)$/m) || [])[1] || res.run_id;
      toast(`Started ${name}`, "ok");
      onCreated(res.run_id, name, res.seq ?? null);
    } catch (err) {
      showErrors(errorList(err));
    } finally {
      button.disabled = false;
      button.textContent = "Start run";
    }
  }

  fill(
    root,
    h(
      "section",
      { class: "card submit-card", testid: "submit-view" },
      h(
        "div",
        { class: "card-head" },
        h("h2", null, "Start a run"),
        h("span", { class: "muted small" }, "A plan is a DAG of tool steps, JSON or YAML."),
      ),
      h(
        "form",
        { class: "submit-form", testid: "submit-form", onsubmit: submit, novalidate: true },
        h(
          "div",
          { class: "field" },
          h(
            "div",
            { class: "field-head" },
            h("label", { for: "plan-text" }, "Plan"),
            h(
              "span",
              { class: "field-tools" },
              fileName,
              h("label", { for: "plan-file", class: "btn btn-ghost btn-sm", tabindex: 0 }, "Upload file…"),
              file,
              h(
                "button",
                {
                  type: "button",
                  class: "btn btn-ghost btn-sm",
                  testid: "example-button",
                  onclick: () => {
                    plan.value = EXAMPLE;
                    showErrors([]);
                  },
                },
                "Example",
              ),
            ),
          ),
          plan,
        ),
        h(
          "div",
          { class: "field-row" },
          h("div", { class: "field grow" }, h("label", { for: "inputs-text" }, "Inputs (JSON object)"), inputs),
          h("div", { class: "field" }, h("label", { for: "idem-key" }, "Idempotency key"), key),
        ),
        errors,
        h("div", { class: "form-actions" }, button),
      ),
    ),
  );
}

/** ["steps", 2, "after", 0] -> "steps[2].after[0]" (strings pass through). */
export function formatLoc(loc) {
  if (!Array.isArray(loc)) return loc == null ? "" : String(loc);
  let out = "";
  for (const part of loc) {
    if (part === "body" && out === "") continue;
    if (typeof part === "number") out += `[${part}]`;
    else out += out ? `.${part}` : String(part);
  }
  return out;
}

function errorList(err) {
  if (err instanceof ApiError) {
    if (err.status === 413) return [{ loc: "plan", msg: "the request is too large for the server" }];
    if (Array.isArray(err.detail)) {
      return err.detail.map((d) => ({ loc: formatLoc(d.loc), msg: d.msg || JSON.stringify(d) }));
    }
    if (err.status === 401) return [{ loc: "", msg: "the server needs an API token" }];
    return [{ loc: "", msg: `${err.status ? `HTTP ${err.status}: ` : ""}${err.message}` }];
  }
  return [{ loc: "", msg: String(err) }];
}
