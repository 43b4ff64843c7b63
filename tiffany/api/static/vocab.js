// The status vocabulary, as the server defines it (GET api/meta, from
// tiffany/wire/status.py): which statuses a run and a step have, which are
// final, and how a task's state is said. The dashboard keeps no copy: this
// module reads it once, before any other module runs (a top-level await),
// and every module takes it from here (through dom.js). Only CSS classes
// stay keyed by status here (dom.js, `tone`).

/** Longest wait between two tries while the server does not answer, in ms. */
const MAX_RETRY_MS = 4000;

async function load() {
  // The page came from this server: it answers unless it is restarting.
  for (let wait = 250; ; wait = Math.min(wait * 2, MAX_RETRY_MS)) {
    try {
      const res = await fetch("api/meta", { headers: { Accept: "application/json" } });
      if (res.ok) return await res.json();
    } catch {
      // network error: try again
    }
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
}

const meta = await load();

/** A run's statuses, in order (`waiting`: every live step waits for a person). */
export const RUN_STATUSES = Object.freeze([...meta.run_statuses]);
/** The statuses of a run that has ended. */
export const TERMINAL_RUN = new Set(meta.terminal_run_statuses);
/** A plan step's statuses. */
export const STEP_STATUSES = Object.freeze([...meta.step_statuses]);
/** The states of a task that has ended (the kernel's names). */
export const TERMINAL_TASK = new Set(meta.terminal_task_states);
/** A task state (or a cancel's `cancelling`) in the run's words. */
export const STATUS_OF = Object.freeze({ ...meta.status_of });
/** What a running task waits on, said to a person (`blocked_sleep`: "sleeping"). */
export const STATE_LABELS = Object.freeze({ ...meta.state_labels });
