// HTTP and websocket access to the Tiffany API: the token, JSON fetches and
// the live activity feed (with resume by `since` and backoff on reconnect).

const TOKEN_KEY = "tiffany.token";

/** Take `?token=` or `#token=` from the address once, keep it in sessionStorage. */
export function adoptTokenFromUrl() {
  const url = new URL(location.href);
  let token = url.searchParams.get("token");
  if (token) url.searchParams.delete("token");
  const hash = url.hash.replace(/^#/, "");
  const m = hash.match(/(^|[&?])token=([^&]*)/);
  if (m) {
    token = decodeURIComponent(m[2]);
    url.hash = hash.replace(m[0], "").replace(/^[&?]/, "");
  }
  if (token) {
    setToken(token);
    history.replaceState(null, "", url.toString());
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** An HTTP error with the decoded body (`detail` for FastAPI errors). */
export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.detail !== undefined ? body.detail : body;
    const message = body && typeof body.message === "string" ? body.message : null;
    super(message || (typeof detail === "string" ? detail : `HTTP ${status}`));
    this.status = status;
    this.body = body;
    this.detail = detail;
    this.code = body && body.code;
  }
}

const unauthorizedListeners = new Set();
/** Call `fn` whenever a request is refused for want of a (good) token. */
export function onUnauthorized(fn) {
  unauthorizedListeners.add(fn);
}

/** Fetch JSON from a path relative to the page (works behind a prefix). */
export async function api(path, { method = "GET", body, headers = {}, signal } = {}) {
  const h = { Accept: "application/json", ...headers };
  const token = getToken();
  if (token) h.Authorization = `Bearer ${token}`;
  if (body !== undefined) h["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(path, {
      method,
      headers: h,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, { detail: `network error: ${err.message}` });
  }
  let data = null;
  const text = await res.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text.slice(0, 500) };
    }
  }
  if (!res.ok) {
    if (res.status === 401) unauthorizedListeners.forEach((fn) => fn());
    throw new ApiError(res.status, data);
  }
  return data;
}

/**
 * Send signal `name` to a run with a JSON `payload` (null: no payload).
 * Resolves to the 202's `{run_id, name, seq, signal_id}` once the signal is
 * journaled: read the run with `?min_seq=<seq>` to see it.
 */
export function sendSignal(runId, name, payload = null, { idempotencyKey } = {}) {
  const headers = idempotencyKey ? { "Idempotency-Key": idempotencyKey } : {};
  return api(`api/runs/${encodeURIComponent(runId)}/signals/${encodeURIComponent(name)}`, {
    method: "POST",
    body: payload,
    headers,
  });
}

/**
 * The signals running run `runId`'s tasks wait for now, each with its wait's
 * payload schema, as the engine holding the run knows them:
 * `{run_id, signals: [{name, schema}]}` (a workflow's schemas are not in the store).
 */
export function runWaits(runId) {
  return api(`api/runs/${encodeURIComponent(runId)}/waits`);
}

/**
 * Re-run finished run `runId` as a new run: from step `fromStep` (and what
 * depends on it), or by default from its failed steps (an empty body). The
 * steps not downstream of the restart point are reused from the earlier run.
 * `inputs` override the run's inputs. Resolves to the 201's `{run_id, seq,
 * created}` once the new run is journaled: read it with `?min_seq=<seq>`.
 */
export function rerunRun(runId, { fromStep = null, inputs = null } = {}) {
  const body = {};
  if (fromStep != null) body.from_step = fromStep;
  if (inputs != null) body.inputs = inputs;
  return api(`api/runs/${encodeURIComponent(runId)}/rerun`, {
    method: "POST",
    body: Object.keys(body).length ? body : undefined,
  });
}

const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 15000;
const SILENCE_TIMEOUT_MS = 60000;

/**
 * The live activity feed over `ws/activity`.
 *
 * Keeps the last seq seen and resumes with `since=` after a drop, so the page
 * keeps its place. `gone` (resume too old) calls `onGone` (reload over HTTP)
 * and reconnects without `since`; `cutoff` reconnects from its `last_seq`.
 * An `error` frame `feed.since_beyond` (then close 4422: the server never
 * sent that seq, e.g. its data dir was replaced) is met as `gone` is.
 */
export class Feed {
  constructor({ onEvent, onStatus, onGone }) {
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.onGone = onGone;
    this.lastSeq = null;
    this.ws = null;
    this.backoff = BACKOFF_MIN_MS;
    this.timer = null;
    this.watchdog = null;
    this.stopped = false;
  }

  url() {
    const u = new URL("ws/activity", document.baseURI);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    if (this.lastSeq != null) u.searchParams.set("since", String(this.lastSeq));
    else u.searchParams.set("tail", "250"); // a fresh page shows the recent past
    // Many events a message: a busy engine's feed stays cheap for the API and the page.
    u.searchParams.set("batch", "true");
    const token = getToken();
    if (token) u.searchParams.set("token", token);
    return u.toString();
  }

  start() {
    this.stopped = false;
    this.connect();
  }

  /** Drop the connection and connect again now (e.g. after a new token). */
  restart() {
    this.backoff = BACKOFF_MIN_MS;
    clearTimeout(this.timer);
    if (this.ws) {
      this.ws.onclose = null;
      this.ws.close();
      this.ws = null;
    }
    this.connect();
  }

  connect() {
    clearTimeout(this.timer);
    this.onStatus("connecting");
    let ws;
    try {
      ws = new WebSocket(this.url());
    } catch (err) {
      this.schedule();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      this.backoff = BACKOFF_MIN_MS;
      this.onStatus("live");
      this.kick();
    };
    ws.onmessage = (msg) => {
      this.kick();
      let frame;
      try {
        frame = JSON.parse(msg.data);
      } catch {
        return;
      }
      if (Array.isArray(frame)) {
        for (const f of frame) {
          this.handle(f);
          if (this.ws !== ws) break; // a control frame reconnected
        }
      } else this.handle(frame);
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      clearTimeout(this.watchdog);
      if (ev.code === 4401 || ev.code === 1008) unauthorizedListeners.forEach((fn) => fn());
      if (ev.code === 4422) this.lastSeq = null; // since beyond the feed: start afresh
      if (!this.stopped) this.schedule();
    };
    ws.onerror = () => {};
  }

  handle(frame) {
    if (frame.type === "ping") return;
    if (frame.type === "gone" || (frame.type === "error" && frame.code === "feed.since_beyond")) {
      this.lastSeq = null;
      this.onGone && this.onGone(frame);
      this.reconnectNow();
      return;
    }
    if (frame.type === "cutoff") {
      if (frame.last_seq != null) this.lastSeq = frame.last_seq;
      this.reconnectNow();
      return;
    }
    if (typeof frame.seq !== "number") return;
    if (this.lastSeq != null && frame.seq <= this.lastSeq) return; // duplicate after a resume
    this.lastSeq = frame.seq;
    this.onEvent(frame);
  }

  reconnectNow() {
    const ws = this.ws;
    this.ws = null;
    if (ws) {
      ws.onclose = null;
      ws.close();
    }
    this.timer = setTimeout(() => this.connect(), 50);
  }

  schedule() {
    const delay = this.backoff * (0.75 + Math.random() * 0.5);
    this.backoff = Math.min(this.backoff * 2, BACKOFF_MAX_MS);
    this.onStatus("reconnecting", delay);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  // A connection silent for a minute (not even pings) is presumed dead.
  kick() {
    clearTimeout(this.watchdog);
    this.watchdog = setTimeout(() => {
      if (this.ws) this.ws.close();
    }, SILENCE_TIMEOUT_MS);
  }
}
