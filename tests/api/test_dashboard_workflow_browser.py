"""A workflow run's page in a real browser against ``tiffany serve --import MOD``.

A ``@workflow`` generator function (written to the test's directory and
imported by the server) starts a child task, waits for it, then waits for
signal ``approve`` with a schema. Its page shows that it is a workflow (its
name, its inputs as the call's arguments), no plan graph and no steps, the
task tree (the function, and its child named by its function), the root
task's current call and the signal it waits for, with the form that sends
it, drawn from the wait's schema (which the page asks the engine for:
``GET /api/runs/{id}/waits``): a field per property, the required one
refused in the page when empty, a value the schema refuses beyond what the
form checks refused beside its field (the engine's 422 names it); a good
one ends the run, its outputs shown. Each call and step the workflow makes
while the page listens is listed with the line of the code that made it
(the feed's ``step`` event carries it), and every one of them once "Verify
replay" ran (the replay's report lists them against the code as it is now).
A screenshot of the page while it waits is saved in the suite's artifacts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import test_dashboard_browser as base
from test_dashboard_browser import _dashboard, _http_json, _save_screenshot, _serving

#: The system chromium and Playwright (the fixture of tests/api/test_dashboard_browser.py).
chromium_path = base.chromium_path

#: Playwright's timeout for one expectation, in milliseconds.
EXPECT_TIMEOUT_MS = 20_000

#: The schema of the workflow's wait for ``approve``.
APPROVAL: dict[str, Any] = {
    "type": "object",
    "required": ["by"],
    "properties": {"by": {"type": "string", "minLength": 2, "description": "who approves"}},
}

REVIEW_MODULE = """\
from tiffany import workflow
from tiffany.kernel import NewTask, Step, WaitTask
from tiffany.workflows import signal

APPROVAL = SCHEMA


def write(topic):
    return f"a draft on {topic}"


def draft(topic):
    text = yield Step(write, topic)
    return text


@workflow("review")
def review(topic: str):
    tid = yield NewTask(draft(topic))
    text = yield WaitTask(tid)
    ok = yield signal("approve", schema=APPROVAL)
    yield Step(write, "after the approval")
    return {"text": text, "by": ok["by"]}
""".replace("SCHEMA", repr(APPROVAL))


def _submit_workflow(url: str, name: str, inputs: dict[str, Any]) -> str:
    """Submit workflow ``name``; return its run id once the store has the run."""
    created = _http_json(url + "api/runs", {"workflow": name, "inputs": inputs})
    _http_json(f"{url}api/runs/{created['run_id']}?min_seq={created['seq']}")
    return str(created["run_id"])


def test_a_workflow_runs_page_shows_its_tree_its_wait_and_sends_the_signal(
    chromium_path: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    (tmp_path / "reviewflow.py").write_text(REVIEW_MODULE)
    with (
        _serving(
            tmp_path, "--import", "reviewflow", env_extra={"PYTHONPATH": str(tmp_path)}
        ) as service,
        _dashboard(chromium_path) as (page, errors),
    ):
        url = service["url"]
        run_id = _submit_workflow(url, "review", {"topic": "tides"})
        page.goto(f"{url}#/run/{run_id}")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", run_id)
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "waiting")

        # -- a workflow: its name and inputs; no plan, no steps ----------------------
        expect(page.get_by_test_id("run-kind")).to_contain_text("workflow")
        expect(page.get_by_test_id("run-workflow")).to_contain_text("review")
        wf = page.get_by_test_id("workflow-card")
        expect(wf).to_be_visible()
        expect(wf.get_by_test_id("workflow-name")).to_have_text("review")
        expect(wf.get_by_test_id("workflow-inputs")).to_have_text('(topic="tides")')
        expect(page.get_by_test_id("graph-card")).to_be_hidden()
        expect(page.get_by_test_id("steps-card")).to_be_hidden()

        # -- the tree: the function, its child named by its function ------------------
        nodes = page.get_by_test_id("task-node")
        expect(nodes).to_have_count(2)
        root = page.locator('[data-testid=task-node][data-ltid="1"]')
        child = page.locator('[data-testid=task-node][data-ltid="2"]')
        expect(root).to_have_attribute("data-name", "review")
        expect(child).to_have_attribute("data-name", "draft")
        expect(child).to_have_attribute("data-state", "done")
        indent = [n.evaluate("el => parseFloat(el.style.paddingLeft)") for n in (root, child)]
        assert indent[1] > indent[0], indent  # the child under its parent
        # The root's current call, and the signal it waits for.
        expect(root.get_by_test_id("task-blocked-on")).to_contain_text("receive approve")
        expect(root.get_by_test_id("task-waiting")).to_have_attribute("data-waiting", "approve")
        expect(child.get_by_test_id("task-waiting")).to_have_count(0)

        # -- the wait and its form ------------------------------------------------
        wait = wf.locator('[data-testid=workflow-wait][data-signal="approve"]')
        expect(wait).to_have_attribute("data-ltid", "1")
        expect(wait.get_by_test_id("step-waiting")).to_have_text("waiting for approve")
        # The engine's answer for the wait: its schema, which the form is drawn from.
        told = _http_json(f"{url}api/runs/{run_id}/waits")
        assert told["signals"] == [{"name": "approve", "schema": APPROVAL}], told
        form = wait.locator('form[data-signal="approve"][data-schema="fields"]')
        expect(form).to_be_visible()
        by = form.locator('[data-testid=signal-input][data-field="by"]')
        expect(by).to_have_attribute("aria-required", "true")
        expect(by).to_have_attribute("placeholder", "who approves")
        expect(form.get_by_test_id("signal-payload")).to_have_count(0)  # no JSON box
        png = tmp_path / "dashboard-workflow.png"
        page.screenshot(path=str(png), full_page=True)
        _save_screenshot(png, png.name, artifacts_dir)

        # The required field left empty: refused here, nothing sent.
        send = form.get_by_role("button", name="Send", exact=True)
        send.click()
        field_error = form.locator('[data-testid=signal-field-error][data-field="by"]')
        expect(field_error).to_have_text("by is required")
        # A value the schema refuses beyond what the form checks: the engine's 422, beside it.
        by.fill("e")
        with page.expect_response(lambda r: "/signals/" in r.url) as refused:
            send.click()
        assert refused.value.status == 422
        expect(field_error).to_be_visible()
        expect(field_error).to_contain_text("short")
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "waiting")
        png = tmp_path / "dashboard-workflow-refused.png"
        page.screenshot(path=str(png), full_page=True)
        _save_screenshot(png, png.name, artifacts_dir)

        # A good one: journaled (202), the run ends with it.
        by.fill("eve")
        with page.expect_response(lambda r: "/signals/" in r.url) as answered:
            send.click()
        assert answered.value.status == 202
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        expect(wf.get_by_test_id("workflow-wait")).to_have_count(0)
        expect(form).to_have_count(0)
        expect(root.get_by_test_id("task-waiting")).to_have_count(0)
        expect(wf.get_by_test_id("workflow-outputs")).to_contain_text('"by":"eve"')
        outputs = json.loads(page.get_by_test_id("run-outputs").locator("pre").inner_text())
        assert outputs == {"text": "a draft on tides", "by": "eve"}

        # -- each call with its source line ------------------------------------------
        lines = REVIEW_MODULE.splitlines()

        def line_of(text: str) -> int:
            return next(i for i, x in enumerate(lines, 1) if text in x)

        calls = wf.get_by_test_id("workflow-call")
        expect(wf.get_by_test_id("workflow-calls-from")).to_have_attribute("data-from", "live")
        # The feed's events since the page subscribed (and those the feed still held then).
        last = calls.last.get_by_test_id("workflow-call-source")
        expect(last).to_have_text(f"reviewflow.py:{line_of('after the approval')} (review)")
        expect(last).to_have_attribute(
            "title", f"{tmp_path / 'reviewflow.py'}:{line_of('after the approval')} (review)"
        )
        page.get_by_test_id("verify-button").click()
        expect(page.get_by_test_id("verify-status")).to_have_text("identical")
        expect(wf.get_by_test_id("workflow-calls-from")).to_have_attribute("data-from", "replay")
        expect(calls).to_have_count(3)  # every call and step, from the replay
        sources = calls.get_by_test_id("workflow-call-source").all_inner_texts()
        at = [int(x.rsplit(":", 1)[1].split()[0]) for x in sources]
        assert at == [
            line_of("yield Step(write, topic)"),
            line_of("yield signal("),
            line_of("after the approval"),
        ], sources
        labels = calls.get_by_test_id("workflow-call-label").all_inner_texts()
        assert labels[0] == "step reviewflow:write", labels
        assert labels[1].startswith("call signal:approve#"), labels
        png = tmp_path / "dashboard-workflow-calls.png"
        page.screenshot(path=str(png), full_page=True)
        _save_screenshot(png, png.name, artifacts_dir)
        png = tmp_path / "dashboard-workflow-done.png"
        page.screenshot(path=str(png), full_page=True)
        _save_screenshot(png, png.name, artifacts_dir)
    assert not errors, "\n".join(errors)


GATED_MODULE = """\
from pathlib import Path

from tiffany import workflow
from tiffany.agents.tools.python import python_tool
from tiffany.workflows import tool


def _count(where, tag):
    with open(Path(where) / f"{tag}.count", "a") as f:
        f.write("1\\n")


@python_tool("gated.count")
def count(where: str, tag: str) -> str:
    _count(where, tag)
    return tag


@python_tool("gated.gate")
def gate(where: str) -> str:
    _count(where, "gate")
    if not (Path(where) / "open").exists():
        raise RuntimeError("the gate is shut")
    return "open"


@workflow("gated")
def gated(where: str):
    a = yield tool("python", function="gated.count", kwargs={"where": where, "tag": "a"})
    b = yield tool("python", function="gated.gate", kwargs={"where": where})
    return {"a": a, "b": b}
"""


def test_a_failed_workflow_run_is_re_run_from_its_page(
    chromium_path: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """ "Re-run from failure" forks the run before its failed call; after "Verify
    replay", each call offers "Re-run from tool_N"; the new run's page opens."""
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    (tmp_path / "gatedflow.py").write_text(GATED_MODULE)
    where = tmp_path / "effects"
    where.mkdir()

    def counts() -> dict[str, int]:
        return {p.stem: len(p.read_text().splitlines()) for p in sorted(where.glob("*.count"))}

    with (
        _serving(
            tmp_path, "--import", "gatedflow", env_extra={"PYTHONPATH": str(tmp_path)}
        ) as service,
        _dashboard(chromium_path) as (page, errors),
    ):
        url = service["url"]
        run_id = _submit_workflow(url, "gated", {"where": str(where)})
        page.goto(f"{url}#/run/{run_id}")
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "failed")
        assert counts() == {"a": 1, "gate": 1}
        (where / "open").write_text("")

        page.get_by_test_id("rerun-failed").click()
        expect(page.get_by_test_id("run-page")).not_to_have_attribute("data-run-id", run_id)
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "succeeded")
        expect(page.get_by_test_id("run-rerun-of")).to_contain_text(run_id)
        assert counts() == {"a": 1, "gate": 2}  # the first call was replayed, not made

        # Back on the failed run: after a verify, each call can be re-run from.
        page.goto(f"{url}#/run/{run_id}")
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "failed")
        page.get_by_test_id("verify-button").click()
        expect(page.get_by_test_id("verify-status")).to_have_text("identical")
        buttons = page.get_by_test_id("rerun-from-call")
        expect(buttons).to_have_count(2)
        assert [b.get_attribute("data-call") for b in buttons.all()] == ["tool_1", "tool_2"]
        png = tmp_path / "dashboard-workflow-rerun.png"
        page.screenshot(path=str(png), full_page=True)
        _save_screenshot(png, png.name, artifacts_dir)
        buttons.first.click()
        expect(page.get_by_test_id("run-page")).not_to_have_attribute("data-run-id", run_id)
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "succeeded")
        assert counts() == {"a": 2, "gate": 3}  # from tool_1: every call made again
    assert not errors, "\n".join(errors)
