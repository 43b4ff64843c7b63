// The form that sends a signal to a step waiting for it (signal.wait).
//
// A wait that declares a payload schema (its `schema` argument: a JSON
// Schema object whose properties are strings, numbers, booleans or enums)
// gets a field per property, the required ones marked, each with its
// description; any other wait gets a JSON text box (blank sends null).
// "Send" sends what the form holds; "Approve" sends it with `approved: true`
// (shown when the schema has an `approved` boolean, or when there is no
// schema: then it sends `{"approved": true}`). A required field left empty
// is refused here, beside the field, and nothing is sent; the server's
// refusal (422, each field by its JSON pointer) shows beside the field it
// names. A field named `by` is filled with the name given last (kept in
// this browser), so a second approval is one click.

import { h, parseJsonField } from "./dom.js";

/** What "Approve" sends to a wait that declares no schema. */
const APPROVE_PAYLOAD = { approved: true };
/** Where the name given in a `by` field is kept between approvals (this browser). */
const USER_KEY = "tiffany.user";
/** The field "Approve" sets. */
const APPROVED = "approved";

let formNo = 0;

/**
 * The fields a schema asks for, or null when the form cannot draw it (then
 * the JSON box): `[{key, kind, required, spec}]`, kind one of string,
 * number, integer, boolean, enum.
 */
export function schemaFields(schema) {
  if (!schema || typeof schema !== "object") return null;
  const props = schema.properties;
  if (schema.type !== "object" || !props || typeof props !== "object") return null;
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const fields = [];
  for (const [key, spec] of Object.entries(props)) {
    if (!spec || typeof spec !== "object") return null;
    let kind = null;
    if (Array.isArray(spec.enum)) kind = "enum";
    else if (["string", "number", "integer", "boolean"].includes(spec.type)) kind = spec.type;
    else if (typeof spec.const === "boolean") kind = "boolean";
    if (!kind) return null;
    fields.push({ key, kind, required: required.has(key), spec });
  }
  return fields.length ? fields : null;
}

/**
 * A form sending signal `name`: `schema` (the wait's, or null), `send(payload)`
 * resolving to the 202's answer, `onSent(answer)` after it.
 */
export function buildSignalForm(name, { schema = null, send, onSent }) {
  const n = ++formNo;
  const fields = schemaFields(schema);
  const error = h("div", { id: `signal-error-${n}`, class: "signal-error error-text small", testid: "signal-error", role: "alert", hidden: true });
  const note = h("span", { class: "signal-note muted small", testid: "signal-note", role: "status" });
  const sendButton = h("button", { type: "submit", class: "btn btn-primary btn-sm", testid: "signal-send" }, "Send");
  const body = fields ? fieldsBody(n, fields) : jsonBody(n, name, (text) => showError(text));
  const approvable = !schema || (fields || []).some((f) => f.key === APPROVED && f.kind === "boolean");
  const approveButton = approvable
    ? h(
        "button",
        {
          type: "button",
          class: "btn btn-sm",
          testid: "signal-approve",
          title: fields ? `Send ${name} with ${APPROVED}: true` : `Send ${name} with ${JSON.stringify(APPROVE_PAYLOAD)}`,
          onclick: () => {
            if (!fields) return submit(APPROVE_PAYLOAD);
            const read = body.read({ [APPROVED]: true });
            if (read) submit(read);
          },
        },
        "Approve",
      )
    : null;

  function showError(text) {
    error.hidden = !text;
    error.textContent = text || "";
  }

  async function submit(value) {
    showError(null);
    body.clearErrors();
    note.textContent = "Sending…";
    sendButton.disabled = true;
    if (approveButton) approveButton.disabled = true;
    try {
      const answer = await send(value);
      note.textContent = answer.warning ? `Sent (seq ${answer.seq}); ${answer.warning}` : `Sent (seq ${answer.seq}).`;
      if (value && typeof value === "object" && typeof value.by === "string" && value.by) {
        localStorage.setItem(USER_KEY, value.by);
      }
      onSent(answer);
    } catch (err) {
      note.textContent = "";
      // A 422 naming fields (the schema's refusal): each beside its field.
      const items = Array.isArray(err.detail) ? err.detail : [];
      const placed = items.filter((i) => body.fieldError(i.pointer, i.msg));
      showError(placed.length === items.length && items.length ? "Not sent: see the fields above." : `Not sent: ${err.message || err}`);
    } finally {
      sendButton.disabled = false;
      if (approveButton) approveButton.disabled = false;
    }
  }

  return h(
    "form",
    {
      class: "signal-form",
      testid: "signal-form",
      dataset: { signal: name, schema: fields ? "fields" : "json" },
      "aria-label": `Send signal ${name}`,
      novalidate: true,
      onsubmit: (ev) => {
        ev.preventDefault();
        const read = body.read({});
        if (read !== undefined) submit(read);
      },
    },
    body.el,
    h("div", { class: "signal-actions" }, sendButton, approveButton, note),
    error,
  );
}

/** The JSON text box of a wait with no schema the form can draw (its errors: `showError`'s). */
function jsonBody(n, name, showError) {
  const payload = h("textarea", {
    id: `signal-payload-${n}`,
    class: "code-input signal-payload",
    rows: 2,
    spellcheck: false,
    placeholder: "null",
    testid: "signal-payload",
    "aria-describedby": `signal-error-${n}`,
  });
  payload.value = "{}";
  const mark = (text) => {
    showError(text);
    payload.classList.toggle("invalid", !!text);
    payload.setAttribute("aria-invalid", text ? "true" : "false");
  };
  return {
    el: h(
      "div",
      { class: "signal-fields" },
      h("label", { for: payload.id, class: "small" }, "Payload for ", h("code", null, name), h("span", { class: "muted" }, " (JSON; blank sends null)")),
      payload,
    ),
    /** The payload, or undefined (refused here: invalid JSON). */
    read(extra) {
      mark(null);
      const parsed = parseJsonField(payload.value);
      if (parsed.error !== undefined) {
        mark(`Invalid JSON: ${parsed.error}`);
        payload.focus();
        return undefined;
      }
      return Object.keys(extra).length ? { ...(parsed.value || {}), ...extra } : parsed.value;
    },
    clearErrors: () => mark(null),
    /** The box has no fields: the refusal shows as the form's error. */
    fieldError: () => false,
  };
}

/** A field per property of the schema. */
function fieldsBody(n, fields) {
  const inputs = new Map();
  const errors = new Map();
  const rows = fields.map((f) => {
    const id = `signal-${n}-${f.key}`;
    const spec = f.spec;
    let input;
    if (f.kind === "boolean") {
      input = h("input", { id, type: "checkbox", class: "signal-check" });
      input.checked = spec.const === true || spec.default === true;
    } else if (f.kind === "enum") {
      input = h(
        "select",
        { id, class: "text-input input-sm" },
        f.required ? null : h("option", { value: "" }, "—"),
        spec.enum.map((v, i) => h("option", { value: String(i) }, typeof v === "string" ? v : JSON.stringify(v))),
      );
    } else {
      input = h("input", {
        id,
        class: "text-input input-sm",
        type: f.kind === "string" ? "text" : "number",
        step: f.kind === "integer" ? "1" : f.kind === "number" ? "any" : null,
        placeholder: spec.description || "",
        autocomplete: f.key === "by" ? "name" : "off",
      });
      if (f.key === "by" && f.kind === "string") input.value = localStorage.getItem(USER_KEY) || "";
      else if (spec.default != null) input.value = String(spec.default);
    }
    input.dataset.testid = "signal-input";
    input.dataset.field = f.key;
    if (f.required) input.setAttribute("aria-required", "true");
    const err = h("div", { class: "signal-field-error error-text small", testid: "signal-field-error", dataset: { field: f.key }, role: "alert", hidden: true });
    input.setAttribute("aria-describedby", `${id}-error`);
    err.id = `${id}-error`;
    inputs.set(f.key, input);
    errors.set(f.key, err);
    return h(
      "div",
      { class: `signal-field signal-field-${f.kind}`, testid: "signal-field", dataset: { field: f.key } },
      h("label", { for: id }, f.key, f.required ? h("span", { class: "required", title: "required" }, " *") : null),
      input,
      f.kind === "boolean" && spec.description ? h("span", { class: "muted small" }, spec.description) : null,
      err,
    );
  });

  function mark(key, text) {
    const err = errors.get(key);
    const input = inputs.get(key);
    if (!err) return false;
    err.hidden = !text;
    err.textContent = text || "";
    input.classList.toggle("invalid", !!text);
    input.setAttribute("aria-invalid", text ? "true" : "false");
    return true;
  }

  return {
    el: h("div", { class: "signal-fields", testid: "signal-fields" }, rows),
    /** The payload from the fields (with `extra` over them), or undefined: a field is refused here. */
    read(extra) {
      const out = {};
      let first = null;
      for (const f of fields) {
        mark(f.key, null);
        const input = inputs.get(f.key);
        if (f.key in extra) {
          out[f.key] = extra[f.key];
          continue;
        }
        let value;
        if (f.kind === "boolean") value = input.checked;
        else if (f.kind === "enum") value = input.value === "" ? undefined : f.spec.enum[Number(input.value)];
        else if (f.kind === "string") value = input.value === "" ? undefined : input.value;
        else {
          const raw = input.value.trim();
          value = raw === "" ? undefined : Number(raw);
          if (value !== undefined && !Number.isFinite(value)) {
            mark(f.key, "not a number");
            first = first || input;
            continue;
          }
        }
        if (value === undefined) {
          if (f.required) {
            mark(f.key, `${f.key} is required`);
            first = first || input;
          }
          continue;
        }
        out[f.key] = value;
      }
      if (first) {
        first.focus();
        return undefined;
      }
      return out;
    },
    clearErrors() {
      for (const f of fields) mark(f.key, null);
    },
    /** Show the server's refusal of field `pointer` ("/by") beside it; false if it is no field here. */
    fieldError(pointer, msg) {
      const key = typeof pointer === "string" ? pointer.split("/")[1] : null;
      return key != null && key !== "" && mark(key.replace(/~1/g, "/").replace(/~0/g, "~"), msg);
    },
  };
}
