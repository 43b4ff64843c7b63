"""The runs that need someone, in a real browser: the inbox, and approving from it.

Against ``tiffany serve`` (no mocks), in Debian's chromium through
Playwright, as ``test_dashboard_browser.py`` drives it (its fixtures and
helpers): the approval example (``examples/approval/plan.yaml``) waits for
its approval; the top bar counts it, the inbox lists it with what it waits
for, the runs list and the run's page say ``waiting``; the step's form is
made from the wait's schema: Approve with no name is refused beside the
field (nothing sent), with a name it finishes the run; the next approval is
one click (the name is kept). A payload the server refuses (422) shows
beside the field it names. Screenshots of the inbox and of the form are
saved (``artifacts_dir``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_dashboard_browser import (  # noqa: F401  (chromium_path, service: fixtures)
    EXPECT_TIMEOUT_MS,
    _dashboard,
    _http_json,
    _save_screenshot,
    _step,
    chromium_path,
    service,
)

from tiffany.agents import load_plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "approval" / "plan.yaml"
#: A wait whose schema the form can satisfy or not (the server tells which field).
CODED = {
    "name": "coded",
    "steps": [
        {
            "id": "enter",
            "tool": "signal.wait",
            "args": {
                "name": "code",
                "schema": {
                    "type": "object",
                    "required": ["code"],
                    "properties": {
                        "code": {
                            "type": "string",
                            "pattern": "^[A-Z]{3}$",
                            "description": "3 capitals",
                        },
                        "tries": {"type": "integer"},
                        "mode": {"enum": ["fast", "slow"]},
                    },
                },
            },
        }
    ],
}


def _created(url: str, plan: dict[str, Any]) -> str:
    created = _http_json(url + "api/runs", {"plan": plan})
    _http_json(f"{url}api/runs/{created['run_id']}?min_seq={created['seq']}")
    return str(created["run_id"])


def test_the_inbox_lists_a_waiting_approval_and_the_schemas_form_approves_it(
    chromium_path: str,  # noqa: F811
    service: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    artifacts_dir: Path,
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    doc = load_plan(EXAMPLE)
    run_id = _created(url, doc)
    with _dashboard(chromium_path) as (page, errors):
        posts: list[Any] = []
        page.on("request", lambda req: posts.append(req) if "/signals/" in req.url else None)
        page.goto(url)
        expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "live")

        # -- the top bar counts it; the list says waiting and for what --------------
        count = page.get_by_test_id("inbox-count")
        expect(count).to_have_text("1", timeout=30_000)
        row = page.locator(f'[data-testid=run-row][data-run-id="{run_id}"]')
        expect(row).to_have_attribute("data-status", "waiting")
        expect(row.get_by_test_id("run-row-waiting")).to_have_text(
            "waits for signal approve (step approve)"
        )
        expect(
            page.get_by_test_id("status-chip-waiting").get_by_test_id("chip-count")
        ).to_have_text("1")

        # -- the inbox: the run, what it waits for, a way to answer ----------------
        page.get_by_test_id("inbox-link").click()
        expect(page).to_have_url(f"{url}#/inbox")
        item = page.locator(f'[data-testid=inbox-item][data-run-id="{run_id}"]')
        expect(item).to_have_count(1)
        wait = item.get_by_test_id("inbox-wait")
        expect(wait).to_have_attribute("data-kind", "signal")
        expect(wait).to_have_attribute("data-name", "approve")
        expect(wait).to_contain_text("waits for signal approve in step approve")
        png = tmp_path / "dashboard-inbox.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-inbox.png", artifacts_dir)
        wait.get_by_test_id("inbox-answer").click()

        # -- the run's page: waiting, and the form the schema makes -----------------
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", run_id)
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "waiting")
        expect(page.get_by_test_id("run-waiting-for")).to_have_text(
            "Needs someone: waits for signal approve (step approve)"
        )
        step = page.locator('[data-testid=step-row][data-step-id="approve"]')
        expect(step.get_by_test_id("step-waiting")).to_have_text("waiting for approve")
        form = step.locator('form[data-signal="approve"]')
        expect(form).to_have_attribute("data-schema", "fields")
        fields = form.get_by_test_id("signal-field")
        expect(fields).to_have_count(3)
        assert fields.evaluate_all("els => els.map(e => e.dataset.field)") == [
            "approved",
            "by",
            "note",
        ]
        expect(form.get_by_label("approved")).to_be_checked()
        by = form.get_by_label("by")
        expect(by).to_have_value("")
        expect(by).to_have_attribute("aria-required", "true")
        approve = form.get_by_role("button", name="Approve", exact=True)

        # No name: refused beside the field, nothing sent, the run still waits.
        approve.click()
        by_error = form.locator('[data-testid=signal-field-error][data-field="by"]')
        expect(by_error).to_have_text("by is required")
        expect(by).to_have_attribute("aria-invalid", "true")
        assert posts == []
        for part, name in ((page.get_by_test_id("run-header"), "run"), (step, "form")):
            png = tmp_path / f"dashboard-approval-{name}.png"
            part.screenshot(path=str(png))
            _save_screenshot(png, png.name, artifacts_dir)

        # A name: one click, and the run publishes with it.
        by.fill("eve")
        with page.expect_response(lambda r: "/signals/approve" in r.url) as answered:
            approve.click()
        assert answered.value.status == 202, answered.value.text()
        assert [json.loads(r.post_data) for r in posts] == [{"approved": True, "by": "eve"}]
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        expect(page.get_by_test_id("run-waiting-for")).to_have_count(0)
        seen = page.evaluate("id => window.__tiffany.live.runs.get(id).walSeq", run_id)
        detail = _http_json(f"{url}api/runs/{run_id}?min_seq={seen}")
        assert _step(detail, "approve")["output"] == {"approved": True, "by": "eve"}
        assert detail["outputs"] == {"approved_by": "eve", "published": "published.md"}
        published = service["data_dir"] / "workspaces" / run_id / "published.md"
        assert published.read_text() == "Release 1.4.0, approved by eve."
        expect(count).to_have_text("0", timeout=30_000)

        # -- the next approval is one click: the name was kept ----------------------
        again = _created(url, doc)
        page.goto(f"{url}#/run/{again}")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", again)
        form = page.locator('[data-testid=step-row][data-step-id="approve"] form')
        expect(form.get_by_label("by")).to_have_value("eve")
        form.get_by_role("button", name="Approve", exact=True).click()
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )

        # -- a field the server refuses: its message beside the field ---------------
        coded = _created(url, CODED)
        page.goto(f"{url}#/run/{coded}")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", coded)
        form = page.locator('[data-testid=step-row][data-step-id="enter"] form')
        expect(form.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
        expect(form.get_by_label("mode")).to_be_visible()
        form.get_by_label("code").fill("abc")
        form.get_by_label("tries").fill("2")
        with page.expect_response(lambda r: "/signals/code" in r.url) as answered:
            form.get_by_role("button", name="Send", exact=True).click()
        assert answered.value.status == 422
        code_error = form.locator('[data-testid=signal-field-error][data-field="code"]')
        expect(code_error).to_have_text("'abc' does not match '^[A-Z]{3}$'")
        expect(form.get_by_test_id("signal-error")).to_have_text("Not sent: see the fields above.")
        form.get_by_label("code").fill("ABC")
        form.get_by_label("mode").select_option("slow")
        with page.expect_response(lambda r: "/signals/code" in r.url) as answered:
            form.get_by_role("button", name="Send", exact=True).click()
        assert answered.value.status == 202
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        seen = page.evaluate("id => window.__tiffany.live.runs.get(id).walSeq", coded)
        detail = _http_json(f"{url}api/runs/{coded}?min_seq={seen}")
        assert _step(detail, "enter")["output"] == {"code": "ABC", "tries": 2, "mode": "slow"}
    assert not errors, "\n".join(errors)
