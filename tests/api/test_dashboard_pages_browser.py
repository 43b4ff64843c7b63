"""The dashboard's pages in a real browser against ``tiffany serve`` (no mocks).

One ``tiffany serve`` for the module, its ``llm`` and ``agent`` steps run by
a scripted model (``TIFFANY_LLM_SCRIPT``: :data:`api_support.AGENT_SCRIPT`),
driven through Debian's chromium by Playwright:

* the plan's graph: every step, one not started (grey, dashed), a dynamic
  step's children marked with the step that added them;
* an agent run's conversation: each turn's text, tokens, tool calls with
  their arguments and results (a refused call too); the timeline names them;
* the schedules page: next ticks, pause, resume, delete (after a
  confirmation naming it);
* the tools page, from ``/api/tools``;
* the activity pane follows the run page open, tells steps (a signal
  received too), and shows every run's on demand;
* bulk actions on the runs a filter selects, after a confirmation naming
  how many.

Each page is screenshotted in the light and the dark theme under the suite's
``test-artifacts/`` (``dashboard-<page>-<theme>.png``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_dashboard_browser as base
from api_support import AGENT_PLAN, AGENT_SCRIPT, GRAPH_PLAN
from test_dashboard_browser import (
    _dashboard,
    _http_json,
    _save_screenshot,
    _stop,
    _submit,
    _wait_for_url,
)

#: The system chromium and Playwright (the fixture of tests/api/test_dashboard_browser.py).
chromium_path = base.chromium_path

#: Playwright's timeout for one expectation, in milliseconds.
EXPECT_TIMEOUT_MS = 20_000
#: A run that stays running until it is cancelled.
NAP = {"tool": "sleep", "args": {"seconds": 300}}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tiffany serve`` with the scripted model; yields its URL."""
    tmp = tmp_path_factory.mktemp("pages")
    data_dir, log_path, script = tmp / "data", tmp / "serve.log", tmp / "script.yaml"
    script.write_text(AGENT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env |= {"PYTHONUNBUFFERED": "1", "TIFFANY_LLM_SCRIPT": str(script)}
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "serve", "--port", "0"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        yield _wait_for_url(proc, data_dir / "serve.json", log_path)
    finally:
        _stop(proc)


def _both_themes(page: Any, name: str, tmp_path: Path, artifacts_dir: Path) -> None:
    """Screenshots of the page as it is, light then dark (the theme toggle's attribute)."""
    for theme in ("light", "dark"):
        page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
        page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        png = tmp_path / f"dashboard-{name}-{theme}.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, png.name, artifacts_dir)
    page.evaluate("delete document.documentElement.dataset.theme")


def _post(url: str, method: str = "POST") -> int:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_plan_graph_shows_steps_not_started_and_who_added_the_dynamic_ones(
    chromium_path: str, scripted: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = scripted
    run_id = _submit(url, GRAPH_PLAN)
    with _dashboard(chromium_path) as (page, errors):
        page.goto(f"{url}#/run/{run_id}")
        graph = page.get_by_test_id("graph")

        def node(step: str) -> Any:
            return graph.locator(f'[data-testid=graph-node][data-step-id="{step}"]')

        # The dynamic step's children appear once it has run; publish waits
        # for gate (a signal): drawn, not started.
        expect(graph.get_by_test_id("graph-node")).to_have_count(5)
        expect(node("review")).to_have_attribute("data-status", "succeeded")
        expect(node("think")).to_have_attribute("data-dynamic", "true")
        expect(node("think").get_by_test_id("graph-dynamic")).to_have_text("adds steps")
        for child in ("draft", "review"):
            expect(node(child)).to_have_attribute("data-added-by", "think")
            expect(node(child).get_by_test_id("graph-added-by")).to_have_text("added by think")
        expect(node("publish")).to_have_attribute("data-started", "false")
        expect(node("publish")).to_have_class(re.compile(r"\bnot-started\b"))
        expect(node("publish")).to_contain_text("not started")
        expect(node("gate")).to_have_attribute("data-status", "running")
        expect(node("gate")).to_contain_text("signal go")

        # Edges: the dynamic step to its first child in the accent ("added"),
        # review after draft only (think also leads there through draft).
        def edge(a: str, b: str) -> Any:
            return graph.locator(f'[data-testid=graph-edge][data-from="{a}"][data-to="{b}"]')

        expect(edge("think", "draft")).to_have_attribute("data-added", "true")
        expect(edge("draft", "review")).to_have_attribute("data-added", "false")
        expect(edge("think", "review")).to_have_count(0)
        expect(edge("gate", "publish")).to_have_count(1)
        expect(edge("think", "publish")).to_have_count(1)
        # The steps card says it too; a click on a box goes to its step.
        review = page.locator('[data-testid=step-row][data-step-id="review"]')
        expect(review.get_by_test_id("step-added-by")).to_have_text("added by think")
        node("review").click()
        expect(review).to_have_class(re.compile(r"\bflash\b"))
        page.get_by_test_id("graph-card").scroll_into_view_if_needed()
        _both_themes(page, "graph", tmp_path, artifacts_dir)

        # The signal: publish runs, its box turns succeeded, and nothing is dashed.
        _http_json(f"{url}api/runs/{run_id}/signals/go", {})
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        expect(node("publish")).to_have_attribute("data-status", "succeeded")
        expect(graph.locator(".not-started")).to_have_count(0)
    assert not errors, "\n".join(errors)


def test_an_agent_run_page_shows_its_conversation(
    chromium_path: str, scripted: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = scripted
    run_id = _submit(url, AGENT_PLAN)
    with _dashboard(chromium_path) as (page, errors):
        page.goto(f"{url}#/run/{run_id}")
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        talk = page.get_by_test_id("conversation")
        expect(talk).to_have_attribute("data-status", "succeeded")
        expect(talk.get_by_test_id("conversation-goal")).to_have_text(
            "Write a note about durable agent loops to notes.md, read it back, answer."
        )
        turns = talk.get_by_test_id("agent-turn")
        expect(turns).to_have_count(3)
        expect(turns.get_by_test_id("turn-text")).to_have_text(
            [
                "I will write the note first.",
                "Now I check what I wrote.",
                "The note is written and reads back as intended.",
            ]
        )
        detail = _http_json(f"{url}api/runs/{run_id}/steps/work/conversation")
        for i, turn in enumerate(detail["turns"]):
            tokens = turn["usage"]["total_tokens"]
            expect(turns.nth(i).get_by_test_id("turn-usage")).to_have_text(
                f"{tokens:,} tokens · $0.0000"
            )
        calls = talk.get_by_test_id("tool-call")
        expect(calls).to_have_count(3)
        assert calls.evaluate_all("cs => cs.map(c => [c.dataset.tool, c.dataset.status])") == [
            ["file.write", "succeeded"],
            ["file.read", "succeeded"],
            ["shell", "refused"],
        ]
        expect(calls.nth(0).get_by_test_id("tool-call-args")).to_contain_text('"path":"notes.md"')
        expect(calls.nth(1).get_by_test_id("tool-call-result")).to_contain_text(
            "Tiffany journals every model and tool call."
        )
        expect(calls.nth(2).get_by_test_id("tool-call-result")).to_have_count(0)
        total = detail["usage"]["total_tokens"]
        expect(talk.get_by_test_id("conversation-answer")).to_have_text(
            "The note is written and reads back as intended."
        )
        expect(talk.get_by_test_id("conversation-usage")).to_have_text(
            f"3 turns · {total:,} tokens · $0.0000"
        )
        # The timeline names each call, not five rows of "agent".
        names = page.get_by_test_id("timeline").locator(".gantt-name")
        expect(names).to_have_text(
            [
                *("agent-notes", "work", "model · turn 1", "file.write"),
                *("model · turn 2", "file.read", "model · turn 3"),
            ]
        )
        page.get_by_test_id("conversation-card").scroll_into_view_if_needed()
        _both_themes(page, "conversation", tmp_path, artifacts_dir)
    assert not errors, "\n".join(errors)


def test_the_schedules_page_pauses_resumes_and_deletes(
    chromium_path: str, scripted: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = scripted
    plan = {"name": "nightly", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}
    body = {"plan": plan, "cron": "0 9 * * 1-5", "timezone": "Europe/Paris"}
    sid = _http_json(url + "api/schedules", body)["schedule_id"]
    with _dashboard(chromium_path) as (page, errors):
        page.goto(url)
        page.get_by_test_id("nav-schedules").click()
        expect(page).to_have_url(re.compile(r"#/schedules$"))
        expect(page.get_by_test_id("nav-schedules")).to_have_attribute("aria-current", "page")
        row = page.locator(f'[data-testid=schedule-row][data-schedule-id="{sid}"]')
        expect(row).to_have_attribute("data-paused", "false")
        expect(row.get_by_test_id("schedule-cron")).to_have_text("0 9 * * 1-5")
        ticks = _http_json(f"{url}api/schedules/{sid}")["next_ticks"]
        shown = row.get_by_test_id("schedule-tick").locator("time")
        expect(shown).to_have_count(len(ticks))
        iso = shown.evaluate_all("ts => ts.map(t => Date.parse(t.getAttribute('datetime')) / 1000)")
        assert iso == ticks
        _both_themes(page, "schedules", tmp_path, artifacts_dir)

        row.get_by_test_id("schedule-pause").click()
        expect(row).to_have_attribute("data-paused", "true")
        expect(row.get_by_test_id("schedule-state")).to_have_text("paused")
        expect(row.get_by_test_id("schedule-next-ticks")).to_have_text("none while paused")
        assert _http_json(f"{url}api/schedules/{sid}")["paused"] is True
        row.get_by_test_id("schedule-resume").click()
        expect(row).to_have_attribute("data-paused", "false")
        assert _http_json(f"{url}api/schedules/{sid}")["paused"] is False

        # Delete asks first, naming the schedule; "Keep" keeps it.
        row.get_by_test_id("schedule-delete").click()
        dialog = page.get_by_test_id("confirm-dialog")
        expect(dialog.get_by_test_id("confirm-message")).to_contain_text("nightly")
        expect(dialog.get_by_test_id("confirm-message")).to_contain_text(sid)
        dialog.get_by_test_id("confirm-cancel").click()
        expect(dialog).to_have_count(0)
        expect(row).to_have_count(1)
        row.get_by_test_id("schedule-delete").click()
        page.get_by_test_id("confirm-ok").click()
        expect(row).to_have_count(0)
        assert _post(f"{url}api/schedules/{sid}/pause") == 404
    assert not errors, "\n".join(errors)


def test_the_tools_page_lists_the_engines_tools(
    chromium_path: str, scripted: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = scripted
    tools = _http_json(url + "api/tools")
    with _dashboard(chromium_path) as (page, errors):
        page.goto(f"{url}#/tools")
        cards = page.get_by_test_id("tool-card")
        expect(cards).to_have_count(len(tools["tools"]))
        assert cards.evaluate_all("cs => cs.map(c => c.dataset.tool)") == [
            t["name"] for t in tools["tools"]
        ]
        http = page.locator('[data-testid=tool-card][data-tool="http"]')
        url_field = http.locator('[data-testid=tool-args] [data-field="url"]')
        expect(url_field).to_have_attribute("data-required", "true")
        expect(url_field).to_contain_text("string")
        expect(http.locator('[data-testid=tool-args] [data-field="method"]')).to_contain_text(
            '"GET"'
        )
        for name in tools["disabled"]:
            disabled = page.locator(f'[data-testid=tool-disabled][data-tool="{name}"]')
            expect(disabled).to_contain_text(f"--enable-tool {name}")
        _both_themes(page, "tools", tmp_path, artifacts_dir)
        page.get_by_test_id("tool-filter").fill("file.")
        expect(cards).to_have_count(2)
        assert cards.evaluate_all("cs => cs.map(c => c.dataset.tool)") == [
            "file.read",
            "file.write",
        ]
    assert not errors, "\n".join(errors)


def test_the_activity_pane_follows_the_open_run_and_tells_its_steps(
    chromium_path: str, scripted: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = scripted
    wait = {
        "name": "follow",
        "steps": [{"id": "ok", "tool": "signal.wait", "args": {"name": "go"}}],
    }
    with _dashboard(chromium_path) as (page, errors):
        page.goto(url)
        expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "live")
        empty = page.get_by_test_id("tail-empty")
        expect(empty).to_have_text("Waiting for activity…")
        first = _submit(url, wait)
        other = _submit(url, AGENT_PLAN)
        rows = page.get_by_test_id("tail-row")
        expect(rows.and_(page.locator(f'[data-run-id="{other}"]')).first).to_be_attached()

        page.goto(f"{url}#/run/{first}")
        tail_pane = page.get_by_test_id("tail-pane")
        expect(tail_pane).to_have_attribute("data-following", "true")
        expect(page.get_by_test_id("tail-run-filter")).to_have_value(first)
        # Shown while nothing of it came since the page opened (a finished run's page).
        expect(empty).to_have_text(re.compile(r"^Nothing from this run since the page opened"))
        mine = rows.and_(page.locator(f'[data-run-id="{first}"]')).get_by_test_id("tail-what")
        expect(mine.filter(has_text="step ok waiting for signal go")).to_have_count(1)
        assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.runId)")) == {first}
        _http_json(f"{url}api/runs/{first}/signals/go", {"by": "ada"})
        expect(mine.filter(has_text="step ok received signal go")).to_have_count(1)
        expect(mine.filter(has_text="run succeeded")).to_have_count(1)
        assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.level)")) == {"run"}
        _both_themes(page, "activity-follows", tmp_path, artifacts_dir)

        # Another run's page: the pane follows it (its model calls told in tokens).
        page.locator(f'[data-testid=run-row][data-run-id="{other}"] a').click()
        expect(page.get_by_test_id("tail-run-filter")).to_have_value(other)
        theirs = rows.and_(page.locator(f'[data-run-id="{other}"]')).get_by_test_id("tail-what")
        expect(
            theirs.filter(has_text=re.compile(r"step work: model call, \d+ tokens"))
        ).to_have_count(3)
        assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.runId)")) == {other}
        # Every run's, on demand (kept in the URL); back to following.
        page.get_by_test_id("tail-run-filter").select_option("")
        expect(page).to_have_url(re.compile(r"tail=all"))
        expect(tail_pane).to_have_attribute("data-following", "false")
        expect(rows.and_(page.locator(f'[data-run-id="{first}"]')).first).to_be_attached()
        assert {first, other} <= set(rows.evaluate_all("rs => rs.map(r => r.dataset.runId)"))
        # A run picked pins the pane to it, on other pages too.
        page.get_by_test_id("tail-run-filter").select_option(other)
        expect(page).to_have_url(re.compile(f"tail={other}"))
        expect(tail_pane).to_have_attribute("data-following", "false")
        page.get_by_test_id("nav-tools").click()
        expect(page.get_by_test_id("tail-run-filter")).to_have_value(other)
        # The kernel's detail behind its toggle, still this run's only.
        page.get_by_test_id("tail-kernel").check()
        kernel = rows.and_(page.locator("[data-level=kernel]"))
        expect(kernel.first).to_be_attached()
        assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.runId)")) == {other}
    assert not errors, "\n".join(errors)


def test_bulk_actions_name_their_count_and_act_on_what_the_filter_selects(
    chromium_path: str, scripted: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = scripted
    naps = [
        _submit(url, {"name": f"bulk-nap-{i}", "steps": [{"id": "n", **NAP}]}) for i in range(3)
    ]
    keep = _submit(url, {"name": "keep-napping", "steps": [{"id": "n", **NAP}]})
    broken = {"id": "r", "tool": "file.read", "args": {"path": "missing.txt"}}
    failed = [_submit(url, {"name": f"bulk-fail-{i}", "steps": [broken]}) for i in range(2)]
    try:
        with _dashboard(chromium_path) as (page, errors):
            page.goto(url)
            expect(page.get_by_test_id("bulk-bar")).to_be_hidden()
            page.get_by_test_id("filter-name").fill("bulk-")
            for run_id in naps + failed:
                row = page.locator(f'[data-testid=run-row][data-run-id="{run_id}"]')
                expect(row).to_have_count(1)
            for run_id in failed:
                row = page.locator(f'[data-testid=run-row][data-run-id="{run_id}"]')
                expect(row).to_have_attribute("data-status", "failed", timeout=30_000)
            cancel = page.get_by_test_id("bulk-cancel")
            expect(cancel).to_have_text("Cancel 3 runs")
            expect(page.get_by_test_id("bulk-rerun")).to_have_text("Re-run 2 failed runs")

            # Asked first, naming the count; "Keep" does nothing.
            cancel.click()
            dialog = page.get_by_test_id("confirm-dialog")
            expect(dialog.get_by_test_id("bulk-confirm-count")).to_have_attribute("data-count", "3")
            expect(dialog.get_by_test_id("bulk-confirm-count")).to_contain_text(
                "Cancel 3 runs selected by the filter (name “bulk-”)"
            )
            _both_themes(page, "bulk-confirm", tmp_path, artifacts_dir)
            dialog.get_by_test_id("confirm-cancel").click()
            expect(dialog).to_have_count(0)
            assert all(_http_json(f"{url}api/runs/{r}")["status"] == "running" for r in naps)

            cancel.click()
            page.get_by_test_id("confirm-ok").click()
            report = page.get_by_test_id("bulk-report")
            expect(report).to_have_attribute("data-busy", "false")
            expect(report).to_have_text("3 of 3 cancelled")
            for run_id in naps:
                row = page.locator(f'[data-testid=run-row][data-run-id="{run_id}"]')
                expect(row).to_have_attribute("data-status", "cancelled")
            assert _http_json(f"{url}api/runs/{keep}")["status"] == "running"

            page.get_by_test_id("bulk-rerun").click()
            expect(page.get_by_test_id("bulk-confirm-count")).to_have_attribute("data-count", "2")
            page.get_by_test_id("confirm-ok").click()
            expect(report).to_have_text("2 of 2 re-run")
            # Each failed run and its re-run (listed once the feed has told of it).
            reruns = page.get_by_test_id("run-row").filter(has_text="bulk-fail")
            expect(reruns).to_have_count(4)
            _both_themes(page, "bulk-done", tmp_path, artifacts_dir)
        assert not errors, "\n".join(errors)
    finally:
        _post(f"{url}api/runs/{keep}/cancel")


def test_the_new_pages_keep_their_place_on_reload(chromium_path: str, scripted: str) -> None:
    """``#/schedules`` and ``#/tools`` are routes: a reload comes back to them."""
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with _dashboard(chromium_path) as (page, errors):
        for route, testid in (("schedules", "schedules-page"), ("tools", "tools-page")):
            page.goto(f"{scripted}#/{route}")
            page.reload()
            expect(page.get_by_test_id(testid)).to_be_visible()
            expect(page.get_by_test_id(f"nav-{route}")).to_have_attribute("aria-current", "page")
        page.get_by_test_id("nav-runs").click()
        expect(page.get_by_test_id("submit-form")).to_be_visible()
    assert not errors, "\n".join(errors)
