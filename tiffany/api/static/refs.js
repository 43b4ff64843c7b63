// References in plan arguments, resolved as the worker resolved them:
// `${inputs.x}` and `${steps.ID.output.path}`. The twin of
// tiffany/agents/refs.py `resolve` (the API process may not import the
// agents layer, and the journal keeps a step's template, not its resolved
// arguments); tests/api/test_dashboard_browser.py runs both on the same
// cases and requires the same answers.
//
// A string that is exactly one reference resolves to the value itself (a
// list stays a list); a reference inside a longer string is interpolated as
// text (JSON for containers). Paths walk dict keys and list indexes.

const REF = /\$\{\s*([^}]+?)\s*\}/g;
const WHOLE = /^\$\{\s*([^}]+?)\s*\}$/;
const PART = /([^.[\]]+)|\[(\d+)\]/g;

/** A reference that does not resolve (the worker's RefError). */
export class RefError extends Error {}

function parse(expr) {
  const parts = [];
  for (const m of expr.matchAll(PART)) parts.push(m[2] !== undefined ? Number(m[2]) : m[1]);
  if (parts.length < 2 || (parts[0] !== "inputs" && parts[0] !== "steps")) {
    throw new RefError(`bad reference \${${expr}}: use inputs.NAME or steps.ID.output...`);
  }
  const [scope, name] = [String(parts[0]), String(parts[1])];
  let rest = parts.slice(2);
  if (scope === "steps") {
    if (!rest.length || rest[0] !== "output") {
      throw new RefError(`bad reference \${${expr}}: step references read steps.ID.output`);
    }
    rest = rest.slice(1);
  }
  return { text: expr, scope, name, path: rest };
}

const isMapping = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

function walk(value, path, ref) {
  for (const p of path) {
    let next;
    if (isMapping(value)) next = has(value, String(p)) ? value[String(p)] : undefined;
    else if (Array.isArray(value) && typeof p === "number") next = p < value.length ? value[p] : undefined;
    else if (typeof value === "string" && typeof p === "number") next = p < value.length ? value[p] : undefined;
    if (next === undefined) throw new RefError(`\${${ref.text}}: no ${JSON.stringify(p)} in the referenced value`);
    value = next;
  }
  return value;
}

function lookup(ref, inputs, outputs) {
  const scope = ref.scope === "inputs" ? inputs : outputs;
  if (!has(scope, ref.name)) {
    throw new RefError(
      ref.scope === "inputs" ? `\${${ref.text}}: unknown input "${ref.name}"` : `\${${ref.text}}: step "${ref.name}" has no output`,
    );
  }
  return walk(scope[ref.name], ref.path, ref);
}

/** Python's json.dumps (", " and ": " separators, ASCII escapes) for interpolated containers. */
function pyJson(v) {
  if (v === null) return "null";
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (isMapping(v)) return `{${Object.entries(v).map(([k, x]) => `${pyJson(k)}: ${pyJson(x)}`).join(", ")}}`;
  if (typeof v === "string") return JSON.stringify(v).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  if (typeof v === "number" && Number.isInteger(v) && !Object.is(v, -0)) return String(v);
  if (typeof v === "number") return Number.isFinite(v) ? pyFloat(v) : v > 0 ? "Infinity" : v < 0 ? "-Infinity" : "NaN";
  return JSON.stringify(v);
}

function pyFloat(v) {
  const s = String(v);
  return /[.e]/.test(s) ? s.replace(/e([+-])(\d)$/, "e$10$2") : `${s}.0`;
}

/** `value` with every reference replaced; throws RefError where one does not resolve. */
export function resolve(value, inputs, outputs) {
  if (typeof value === "string") {
    const t = value.trim();
    const whole = t.startsWith("${") ? t.match(WHOLE) : null;
    if (whole) return lookup(parse(whole[1]), inputs, outputs);
    return value.replace(REF, (_, expr) => {
      const v = lookup(parse(expr), inputs, outputs);
      return typeof v === "string" ? v : pyJson(v);
    });
  }
  if (Array.isArray(value)) return value.map((v) => resolve(v, inputs, outputs));
  if (isMapping(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, resolve(v, inputs, outputs)]));
  return value;
}

/** Whether `value` holds a `${...}` reference anywhere. */
export function hasRefs(value) {
  if (typeof value === "string") return value.includes("${");
  if (Array.isArray(value)) return value.some(hasRefs);
  if (isMapping(value)) return Object.values(value).some(hasRefs);
  return false;
}
