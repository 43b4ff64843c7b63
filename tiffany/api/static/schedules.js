// The schedules page (#/schedules): every cron schedule (GET /api/schedules,
// a page at a time), its cron expression, time zone and catch-up policy,
// whether it is paused, its next ticks, its last tick, the run that tick
// started and, when the tick started none, why (`last_error`). Each can be
// paused, resumed or deleted (after a confirmation naming it); the list is
// read again after each change, and every SCHEDULES_POLL_MS (the ticks move).

import { api } from "./api.js";
import { ago, confirmDialog, fill, h, timeEl, toast } from "./dom.js";

const PAGE = 100;
const SCHEDULES_POLL_MS = 15000;

const TICK = new Intl.DateTimeFormat(undefined, { weekday: "short", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });

/** "in 3 min", "in 2 h", "in 4 days" (epoch seconds from now). */
export function untilText(ts, now = Date.now() / 1000) {
  const s = ts - now;
  if (s < 1) return "now";
  if (s < 60) return `in ${Math.floor(s)} s`;
  if (s < 3600) return `in ${Math.floor(s / 60)} min`;
  if (s < 86400 * 2) return `in ${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `in ${Math.floor(s / 86400)} days`;
}

export class SchedulesPage {
  constructor(root, { onError }) {
    this.root = root;
    this.onError = onError;
    this.rows = [];
    this.nextAfter = null;
    this.busy = new Set(); // schedule ids with an action under way
    this.build();
    this.refresh();
    this.timer = setInterval(() => this.refresh(), SCHEDULES_POLL_MS);
  }

  destroy() {
    clearInterval(this.timer);
    this.closed = true;
  }

  build() {
    this.list = h("div", { class: "schedule-list", testid: "schedule-list" });
    this.more = h("button", { class: "btn btn-ghost btn-sm", testid: "schedules-more", hidden: true, onclick: () => this.loadMore() }, "More schedules");
    this.count = h("span", { class: "muted small", testid: "schedules-count" });
    fill(
      this.root,
      h(
        "section",
        { class: "card", testid: "schedules-page" },
        h(
          "div",
          { class: "card-head" },
          h("h2", null, "Schedules"),
          this.count,
          h("div", { class: "spacer" }),
          h("span", { class: "muted small" }, "add one with ", h("code", null, "tiffany schedule add PLAN --cron …"), " or POST /api/schedules"),
        ),
        h("div", null, this.list, this.more),
      ),
    );
  }

  async refresh() {
    try {
      // The pages read so far, again (an action may have moved any of them).
      const rows = [];
      let after = null;
      do {
        const q = new URLSearchParams({ limit: String(PAGE) });
        if (after) q.set("after", after);
        const page = await api(`api/schedules?${q}`);
        rows.push(...page.schedules);
        after = page.next_after;
      } while (after && rows.length < Math.max(this.rows.length, PAGE));
      if (this.closed) return;
      this.rows = rows;
      this.nextAfter = after;
      this.render();
    } catch (err) {
      this.onError(err);
    }
  }

  async loadMore() {
    if (!this.nextAfter) return;
    try {
      const q = new URLSearchParams({ limit: String(PAGE), after: this.nextAfter });
      const page = await api(`api/schedules?${q}`);
      this.rows.push(...page.schedules);
      this.nextAfter = page.next_after;
      this.render();
    } catch (err) {
      this.onError(err);
    }
  }

  async act(row, what) {
    const id = row.schedule_id;
    if (what === "delete") {
      const sure = await confirmDialog({
        title: "Delete this schedule?",
        message: [h("p", null, "Schedule ", h("strong", null, row.name), " (", h("code", null, id), `, ${row.cron} ${row.timezone}) will start no more runs.`), h("p", { class: "muted small" }, "The runs it started stay.")],
        confirm: "Delete schedule",
      });
      if (!sure) return;
    }
    this.busy.add(id);
    this.render();
    try {
      const path = `api/schedules/${encodeURIComponent(id)}`;
      if (what === "delete") await api(path, { method: "DELETE" });
      else await api(`${path}/${what}`, { method: "POST" });
      toast(what === "delete" ? `Schedule ${row.name} deleted` : `Schedule ${row.name} ${what === "pause" ? "paused" : "resumed"}`, "ok");
    } catch (err) {
      toast(`Not done: ${err.message || err}`, "bad");
    } finally {
      this.busy.delete(id);
    }
    await this.refresh();
  }

  render() {
    const now = Date.now() / 1000;
    this.count.textContent = this.rows.length ? `${this.rows.length}${this.nextAfter ? "+" : ""}` : "";
    this.more.hidden = !this.nextAfter;
    if (!this.rows.length) {
      fill(this.list, h("div", { class: "empty", testid: "schedules-empty" }, "No schedules."));
      return;
    }
    fill(
      this.list,
      this.rows.map((r) => {
        const busy = this.busy.has(r.schedule_id);
        const ticks = r.next_ticks || (r.next_tick != null ? [r.next_tick] : []);
        return h(
          "article",
          {
            class: `schedule tone-border-${r.last_error ? "bad" : r.paused ? "idle" : "ok"}`,
            testid: "schedule-row",
            dataset: { scheduleId: r.schedule_id, paused: String(r.paused) },
          },
          h(
            "div",
            { class: "schedule-head" },
            h("strong", null, r.name),
            h("code", { class: "muted small" }, r.schedule_id),
            h("span", { class: `pill pill-sm tone-${r.paused ? "idle" : "ok"}`, testid: "schedule-state" }, r.paused ? "paused" : "active"),
            h("div", { class: "spacer" }),
            r.paused
              ? h("button", { class: "btn btn-sm btn-primary", testid: "schedule-resume", disabled: busy, onclick: () => this.act(r, "resume") }, "Resume")
              : h("button", { class: "btn btn-sm", testid: "schedule-pause", disabled: busy, onclick: () => this.act(r, "pause") }, "Pause"),
            h("button", { class: "btn btn-sm btn-danger", testid: "schedule-delete", disabled: busy, onclick: () => this.act(r, "delete") }, "Delete"),
          ),
          h(
            "dl",
            { class: "schedule-grid" },
            h("div", { class: "meta" }, h("dt", null, "when"), h("dd", null, h("code", { testid: "schedule-cron" }, r.cron), ` · ${r.timezone} · catch-up ${r.catchup}`)),
            h(
              "div",
              { class: "meta" },
              h("dt", null, "next ticks"),
              h(
                "dd",
                null,
                ticks.length
                  ? h(
                      "ol",
                      { class: "ticks", testid: "schedule-next-ticks" },
                      ticks.map((t, i) => h("li", { testid: "schedule-tick" }, timeEl(t, TICK.format(new Date(t * 1000))), i === 0 ? h("span", { class: "muted small" }, ` ${untilText(t, now)}`) : null)),
                    )
                  : h("span", { class: "muted", testid: "schedule-next-ticks" }, r.paused ? "none while paused" : "none"),
              ),
            ),
            h(
              "div",
              { class: "meta" },
              h("dt", null, "last tick"),
              h("dd", null, r.last_tick != null ? [timeEl(r.last_tick, TICK.format(new Date(r.last_tick * 1000))), h("span", { class: "muted small" }, ` ${ago(r.last_tick, now)}`)] : h("span", { class: "muted" }, "none yet")),
            ),
            h(
              "div",
              { class: "meta" },
              h("dt", null, "last run"),
              h("dd", null, r.last_run_id ? h("a", { class: "mono", href: `#/run/${encodeURIComponent(r.last_run_id)}`, testid: "schedule-last-run" }, r.last_run_id) : h("span", { class: "muted" }, "none yet")),
            ),
          ),
          r.last_error ? h("div", { class: "schedule-error error-text small", testid: "schedule-last-error", role: "alert" }, h("strong", null, "Last tick started no run: "), r.last_error) : null,
        );
      }),
    );
  }
}
