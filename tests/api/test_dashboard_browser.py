"""The dashboard in a real browser against the real service (no mocks).

Starts ``tiffany serve --port 0`` on a fresh data directory, drives Debian's
chromium through Playwright: a bad plan shows its field errors beside the
form; a good plan submitted through the form appears in the runs list, goes
live in the activity tail, shows its task tree and timeline while running,
succeeds, and replays identically. A screenshot of the finished run page is
saved under ``tmp_path`` and copied to ``$TIFFANY_ARTIFACTS_DIR`` (or the
suite's ``test-artifacts/``).

Skipped when chromium or Playwright is missing, unless
``TIFFANY_REQUIRE_SERVICES=1`` (then it fails).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: How long the service may take to write serve.json and answer /healthz.
SERVE_START_TIMEOUT_S = 30.0
#: Playwright's timeout for one expectation, in milliseconds.
EXPECT_TIMEOUT_MS = 15_000
#: Each step of the demo plan sleeps this long: the run stays live ~2 s.
STEP_SLEEP_S = 1.0
#: How long the page is kept offline mid-run (step a ends meanwhile).
OFFLINE_MS = 1200

GOOD_PLAN = {
    "name": "ui-demo",
    "steps": [
        {"id": "a", "tool": "sleep", "args": {"seconds": STEP_SLEEP_S}},
        {"id": "b", "tool": "sleep", "args": {"seconds": STEP_SLEEP_S}, "after": ["a"]},
    ],
}
#: YAML on purpose (the form takes JSON or YAML): step c waits on a step that does not exist.
BAD_PLAN_YAML = """\
name: ui-broken
steps:
  - id: a
    tool: sleep
    args: {seconds: 0.1}
  - id: c
    tool: sleep
    args: {seconds: 0.1}
    after: [b]
"""

#: A draft, a human's approval (signal ``approve``), then publishing what it says.
APPROVAL_PLAN = {
    "name": "approval",
    "steps": [
        {"id": "draft", "tool": "file.write", "args": {"path": "d.txt", "content": "v1"}},
        {
            "id": "approve",
            "tool": "signal.wait",
            "args": {"name": "approve"},
            "after": ["draft"],
        },
        {
            "id": "publish",
            "tool": "file.write",
            "args": {"path": "p.txt", "content": "${steps.approve.output.by}"},
            "after": ["approve"],
        },
    ],
}
#: Only the wait: answered with the run page's quick "Approve" button.
QUICK_APPROVAL_PLAN = {
    "name": "quick-approval",
    "steps": [{"id": "approve", "tool": "signal.wait", "args": {"name": "approve"}}],
}

#: Fails at b (its input names a file nobody wrote); a re-run can reuse a.
FIX_ME_PLAN = {
    "name": "fix-me",
    "inputs": {"path": "missing.txt"},
    "steps": [
        {"id": "a", "tool": "file.write", "args": {"path": "a.txt", "content": "A"}},
        {"id": "b", "tool": "file.read", "args": {"path": "${inputs.path}"}, "after": ["a"]},
        {
            "id": "c",
            "tool": "file.write",
            "args": {"path": "c.txt", "content": "C"},
            "after": ["b"],
        },
    ],
}

SEQS_JS = "rows => rows.map(r => r.dataset.seq)"
RUNS_JS = "rows => rows.map(r => r.dataset.runId)"


@pytest.fixture(scope="module")
def chromium_path(unavailable: Callable[[str], None]) -> str:
    """The system chromium and Playwright (skip, or fail when services are required)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[dev]')")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        unavailable("chromium is not installed (apt-get install chromium)")
    return str(path)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A running ``tiffany serve`` on a fresh data dir; yields {"url", "data_dir", "log"}."""
    with _serving(tmp_path) as served:
        yield served


@contextlib.contextmanager
def _serving(
    tmp_path: Path, *extra: str, env_extra: dict[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """``tiffany serve --port 0 EXTRA`` run in ``tmp_path`` (no TIFFANY_* but ``env_extra``)."""
    data_dir = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "serve", "--port", "0"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*cmd, *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        url = _wait_for_url(proc, data_dir / "serve.json", log_path)
        yield {"url": url, "data_dir": data_dir, "log": log_path}
    finally:
        _stop(proc)


def _wait_for_url(proc: subprocess.Popen[bytes], serve_json: Path, log_path: Path) -> str:
    deadline = time.monotonic() + SERVE_START_TIMEOUT_S
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"tiffany serve exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}"
            )
        if url is None and serve_json.exists():
            try:
                url = json.loads(serve_json.read_text())["url"]
            except (ValueError, KeyError):
                url = None
        if url is None:
            m = re.search(rb"http://127\.0\.0\.1:\d+/", log_path.read_bytes())
            url = m.group(0).decode() if m else None
        if url is not None:
            try:
                with urllib.request.urlopen(url + "healthz", timeout=1) as res:
                    if res.status == 200:
                        return url
            except OSError:
                pass
        time.sleep(0.1)
    pytest.fail(f"tiffany serve did not come up:\n{log_path.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _engine_feed(data_dir: Path, first: int, last: int) -> list[dict[str, Any]]:
    """The engine's events from seq ``first`` to ``last``, read from its feed socket.

    Plain blocking reads (Playwright's sync API holds this thread's event
    loop); the protocol is ``tiffany/feed/transport.py``'s.
    """
    from tiffany.feed.transport import FEED_SOCKET

    got: list[dict[str, Any]] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(data_dir / FEED_SOCKET))
        sock.sendall(json.dumps({"since": first - 1, "run_id": None}).encode() + b"\n")
        lines = sock.makefile("rb")
        while not got or got[-1]["seq"] < last:
            frame = json.loads(lines.readline())
            if frame.get("type") == "ping":
                continue
            assert frame.get("type") is None, frame  # no gone: the engine's ring holds them
            got.append(frame)
    return got


def _http_json(url: str, body: Any = None) -> Any:
    """GET ``url`` (or POST ``body`` as JSON to it) and decode the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _submit(url: str, plan: dict[str, Any]) -> str:
    """Submit ``plan`` over HTTP; return its run id once the store has the run.

    Read back with ``min_seq``: a run page opened on a run the store has not
    projected yet (and with no event of it seen) would say it does not exist.
    """
    created = _http_json(url + "api/runs", {"plan": plan})
    _http_json(f"{url}api/runs/{created['run_id']}?min_seq={created['seq']}")
    return str(created["run_id"])


def _step(detail: dict[str, Any], step_id: str) -> dict[str, Any]:
    return next(s for s in detail["steps"] if s["step_id"] == step_id)


def _console(msg: Any, errors: list[str]) -> None:
    # The browser logs every non-2xx fetch and failed connection: the 422 of
    # the bad plan and the failures while offline are expected.
    expected = ("status of 422", "ERR_INTERNET_DISCONNECTED", "WebSocket connection to")
    if msg.type == "error" and not any(e in msg.text for e in expected):
        errors.append(f"console: {msg.text}")


@contextlib.contextmanager
def _dashboard(chromium_path: str, **options: Any) -> Iterator[tuple[Any, list[str]]]:
    """A page in the system chromium, and the errors it logs (page errors, unexpected console).

    ``options``: the page's (``browser.new_page``); the viewport is 1600x1000
    unless given. The caller asserts the errors list empty at the end.
    """
    from playwright.sync_api import sync_playwright

    options.setdefault("viewport", {"width": 1600, "height": 1000})
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True)
        try:
            page = browser.new_page(**options)
            page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
            page.on("console", lambda msg: _console(msg, errors))
            yield page, errors
        finally:
            browser.close()


def _save_screenshot(png: Path, name: str, suite_artifacts: Path) -> None:
    target = Path(os.environ.get("TIFFANY_ARTIFACTS_DIR") or suite_artifacts)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, target / name)


def test_dashboard_submits_a_plan_and_follows_it_live(
    chromium_path: str, service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    with _dashboard(chromium_path, color_scheme="dark") as (page, errors):
        reads: list[str] = []
        page.on("request", lambda req: reads.append(req.url))
        page.goto(url)

        # The page is up and the live feed connected; the tail shows every
        # kernel event (the check for gaps below compares it with the engine's).
        page.get_by_test_id("tail-kernel").check()
        expect(page.get_by_test_id("submit-form")).to_be_visible()
        expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "live")
        expect(page.get_by_test_id("status-chip-all")).to_be_visible()

        # -- 422: a bad plan (YAML) shows the field at fault beside the form -------
        page.get_by_test_id("plan-input").fill(BAD_PLAN_YAML)
        page.get_by_test_id("submit-button").click()
        err = page.get_by_test_id("field-error")
        expect(err.first).to_be_visible()
        expect(err.filter(has_text="unknown step")).to_have_count(1)
        expect(err.filter(has_text="unknown step").locator("code")).to_have_text(
            "steps[1].after[0]"
        )
        assert "#/run/" not in page.url
        expect(page.get_by_test_id("run-row")).to_have_count(0)

        # -- a good plan: submitted, listed, live -----------------------------------
        page.get_by_test_id("plan-input").fill(json.dumps(GOOD_PLAN, indent=2))
        page.get_by_test_id("inputs-input").fill("{}")
        page.get_by_test_id("submit-button").click()
        page.wait_for_url(re.compile(r".*#/run/[^?]+"))
        run_id = page.url.split("#/run/", 1)[1].split("?", 1)[0]
        assert run_id
        expect(page.get_by_test_id("submit-errors")).to_have_count(0)

        row = page.locator(f'[data-testid=run-row][data-run-id="{run_id}"]')
        expect(row).to_have_count(1)
        expect(row).to_contain_text("ui-demo")
        run_page = page.get_by_test_id("run-page")
        expect(run_page).to_have_attribute("data-run-id", run_id)

        # Live: the tail shows this run's events, the run shows as running and
        # a worker is seen sleeping (blocked) before the run ends.
        tail_rows = page.locator(f'[data-testid=tail-row][data-run-id="{run_id}"]')
        expect(tail_rows.first).to_be_visible()

        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "running")
        sleeping = page.locator(
            '[data-testid=task-node][data-kind=worker][data-state="blocked_sleep"]'
        )
        expect(sleeping.first).to_be_visible()
        expect(sleeping.first.get_by_test_id("task-blocked-on")).to_contain_text("sleep")
        expect(tail_rows.filter(has_text="blocked").first).to_be_visible()

        # Go offline mid-run (while step a ends and b starts), then back:
        # the page reconnects with since= and misses nothing (checked
        # below: the tail's seqs have no gap).
        page.context.set_offline(True)
        page.evaluate("window.__tiffany.feed.ws.close()")
        expect(page.get_by_test_id("conn-status")).not_to_have_attribute("data-state", "live")
        page.wait_for_timeout(OFFLINE_MS)
        page.context.set_offline(False)
        expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "live")

        # The task tree: the planner and one worker per step.
        tree = page.get_by_test_id("task-tree")
        expect(tree.locator("[data-testid=task-node][data-kind=planner]")).to_have_count(1)
        expect(tree.locator('[data-testid=task-node][data-name="worker:a"]')).to_have_count(1)
        expect(tree.locator('[data-testid=task-node][data-name="worker:b"]')).to_have_count(1)

        # The timeline draws a bar per task, labelled from the task's fields
        # (a worker by its step), never parsed from its name.
        bars = page.get_by_test_id("timeline").get_by_test_id("gantt-bar")
        expect(bars).to_have_count(3)
        names = page.get_by_test_id("timeline").locator(".gantt-name")
        expect(names).to_contain_text(["a", "b"])

        # -- it succeeds ---------------------------------------------------------
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        expect(row).to_have_attribute("data-status", "succeeded")
        expect(
            page.get_by_test_id("status-chip-succeeded").get_by_test_id("chip-count")
        ).to_have_text("1")
        for step in ("a", "b"):
            step_row = page.locator(f'[data-testid=step-row][data-step-id="{step}"]')
            expect(step_row).to_have_attribute("data-status", "succeeded")
            expect(step_row.get_by_test_id("step-output")).to_contain_text("slept")
        expect(tree.locator("[data-testid=task-node][data-state=done]")).to_have_count(3)
        expect(page.locator("[data-testid=gantt-row][data-state=done]")).to_have_count(3)
        expect(page.locator('[data-testid=tail-row][data-kind="run.finished"]')).to_have_count(1)

        seqs = [int(x) for x in page.get_by_test_id("tail-row").evaluate_all(SEQS_JS)]
        assert seqs == sorted(seqs, reverse=True), "the tail shows the newest event first"
        # No gap (seqs are not consecutive): the tail holds exactly what the
        # engine's own feed holds from the run's first event to its last.
        engine = _engine_feed(service["data_dir"], seqs[-1], seqs[0])
        assert engine[0]["kind"] == "run.started"
        assert seqs[::-1] == [e["seq"] for e in engine], "a gap in the feed"

        # The run's reads asked the store for the WAL seq of the events that
        # prompted them: the last one for at least the run's end.
        end_wal_seq = next(e["wal_seq"] for e in engine if e["kind"] == "run.finished")
        pattern = re.compile(rf"/api/runs/{run_id}\?min_seq=(\d+)$")
        asked = [int(m.group(1)) for u in reads if (m := pattern.search(u))]
        assert asked, "the run page never asked for a WAL seq"
        assert max(asked) >= end_wal_seq

        # The journal: records listed, a payload opens on click.
        journal_rows = page.get_by_test_id("journal-row")
        expect(journal_rows.first).to_be_visible()
        expect(page.locator('[data-testid=journal-row][data-type="RUN_START"]')).to_have_count(1)
        page.locator('[data-testid=journal-row][data-type="RUN_START"]').click()
        expect(page.get_by_test_id("journal-payload").first).to_be_visible()
        expect(page.get_by_test_id("journal-payload").first).to_contain_text(run_id)

        # Replay verification: identical.
        page.get_by_test_id("verify-button").click()
        expect(page.get_by_test_id("verify-result")).to_have_attribute(
            "data-status", "identical", timeout=30_000
        )
        expect(page.get_by_test_id("cancel-button")).to_be_disabled()
        page.wait_for_timeout(300)  # let the last frame settle
        png = tmp_path / "dashboard-run.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-run.png", artifacts_dir)

        # The status chips filter the runs list; the filter lives in the URL.
        page.get_by_test_id("status-chip-failed").click()
        expect(page).to_have_url(re.compile(r"status=failed"))
        expect(page.get_by_test_id("run-row")).to_have_count(0)
        expect(page.get_by_test_id("runs-empty")).to_be_visible()
        page.get_by_test_id("status-chip-succeeded").click()
        expect(page).to_have_url(re.compile(r"status=succeeded"))
        expect(row).to_have_count(1)

        # The tail: filtered to this run (URL too), then paused.
        page.get_by_test_id("tail-run-filter").select_option(run_id)
        expect(page).to_have_url(re.compile(f"tail={run_id}"))
        shown = page.get_by_test_id("tail-row").evaluate_all(RUNS_JS)
        assert shown, "the run's events stay in the filtered tail"
        assert set(shown) == {run_id}
        page.get_by_test_id("tail-pause").click()
        expect(page.get_by_test_id("tail-note")).to_contain_text("paused")
        expect(page.get_by_test_id("tail-pause")).to_have_attribute("aria-pressed", "true")
        page.get_by_test_id("tail-pause").click()
        expect(page.get_by_test_id("tail-pause")).to_have_attribute("aria-pressed", "false")

        # The view lives in the URL: a reload comes back to the same run,
        # with the same filters.
        page.reload()
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", run_id)
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "succeeded")
        expect(page.get_by_test_id("task-node")).to_have_count(3)
        expect(page.locator("[data-testid=run-row].selected")).to_have_attribute(
            "data-run-id", run_id
        )
        expect(page.locator("[data-testid=status-chip-succeeded].active")).to_have_count(1)
        expect(page.get_by_test_id("tail-run-filter")).to_have_value(run_id)
    assert not errors, "\n".join(errors)


def test_the_dashboard_shows_every_engines_activity(
    chromium_path: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """``serve --engines 2``: one page lists both engines' runs and tails both feeds."""
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    data_dir = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "serve"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--port", "0", "--engines", "2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        url = _wait_for_url(proc, data_dir / "serve.json", log_path)
        with _dashboard(chromium_path) as (page, errors):
            page.goto(url)
            expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "live")
            runs = []
            for i in range(4):  # round robin: two runs on each engine
                body = json.dumps({"plan": {**GOOD_PLAN, "name": f"two-engines-{i}"}})
                req = urllib.request.Request(
                    url + "api/runs",
                    data=body.encode(),
                    headers={"content-type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=30) as resp:
                    runs.append(json.loads(resp.read()))
            assert {r["seq"] >> 40 for r in runs} == {0, 1}
            for r in runs:  # listed, whichever engine runs it, named by engine and number
                row = page.locator(f'[data-testid=run-row][data-run-id="{r["run_id"]}"]')
                expect(row).to_have_count(1)
                if r["seq"] >> 40 == 1:
                    expect(row).to_contain_text("· e1")
            for engine in ("0", "1"):  # the tail follows both engines
                tail = page.locator(f"[data-testid=tail-row][data-engine='{engine}']")
                expect(tail.first).to_be_attached()
            png = tmp_path / "two-engines.png"
            page.screenshot(path=str(png), full_page=True)
            _save_screenshot(png, "two-engines.png", artifacts_dir)
    finally:
        _stop(proc)
    assert errors == []


def test_a_step_waiting_for_a_signal_is_answered_from_the_run_page(
    chromium_path: str, service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    """A ``signal.wait`` step shows what it waits for and a form that sends it.

    Invalid JSON is refused beside the form (nothing sent, the step still
    waits); a payload sent with "Send" is the step's output and the run goes
    on; "Approve" sends ``{"approved": true}``. After the 202 the page reads
    the run again as of the signal's seq.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    run_id = _submit(url, APPROVAL_PLAN)
    with _dashboard(chromium_path) as (page, errors):
        requests: list[Any] = []
        page.on("request", lambda req: requests.append(req))
        page.goto(f"{url}#/run/{run_id}")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", run_id)

        # -- the step waits: a badge says for what, a form sends it ----------------
        step = page.locator('[data-testid=step-row][data-step-id="approve"]')
        badge = step.get_by_test_id("step-waiting")
        expect(badge).to_have_text("waiting for approve")
        expect(badge).to_have_attribute("data-waiting", "approve")
        expect(step).to_have_attribute("data-status", "running")
        form = step.locator('form[data-signal="approve"]')
        expect(form).to_be_visible()
        expect(page.get_by_test_id("signal-form")).to_have_count(1)  # only the waiting step
        payload = form.get_by_label("Payload for approve")
        expect(payload).to_have_value("{}")
        send = form.get_by_role("button", name="Send", exact=True)
        expect(form.get_by_role("button", name="Approve", exact=True)).to_be_enabled()
        error = form.get_by_test_id("signal-error")
        expect(error).to_be_hidden()

        # -- a refresh that brings nothing new keeps the rows (a click in them lands)
        row = step.element_handle()
        with page.expect_response(
            lambda r: r.url.split("?")[0].endswith(f"/api/runs/{run_id}"), timeout=10_000
        ):
            pass  # the live page's poll (every 3 s)
        page.wait_for_timeout(1_100)  # its render (at most MAX_RENDER_GAP_MS, 1 s, later)
        assert row.evaluate("el => el.isConnected"), "the step rows were rebuilt"

        # -- invalid JSON: an error beside the form, nothing sent ------------------
        payload.fill('{"by": eve}')
        send.click()
        expect(error).to_be_visible()
        expect(error).to_contain_text("Invalid JSON")
        expect(payload).to_have_attribute("aria-invalid", "true")
        expect(badge).to_have_text("waiting for approve")
        assert _step(_http_json(f"{url}api/runs/{run_id}"), "approve")["waiting"] == (
            "signal approve"
        )

        # -- a good payload: sent, journaled (202), read back as of its seq -------
        payload.fill('{"by": "eve"}')
        with page.expect_response(lambda r: "/signals/" in r.url) as answered:
            send.click()
        answer = answered.value
        assert answer.status == 202
        sent = answer.json()
        assert sent["run_id"] == run_id
        assert sent["name"] == "approve"
        expect(step).to_have_attribute("data-status", "succeeded")
        expect(step.get_by_test_id("step-output")).to_contain_text('"by":"eve"')
        expect(badge).to_have_count(0)
        expect(form).to_have_count(0)
        publish = page.locator('[data-testid=step-row][data-step-id="publish"]')
        expect(publish).to_have_attribute("data-status", "succeeded")
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )

        # One signal request in all (the invalid JSON sent none), and the run
        # was read again with min_seq at least the signal's seq after it.
        posts = [r for r in requests if "/signals/" in r.url]
        assert [(r.method, json.loads(r.post_data)) for r in posts] == [("POST", {"by": "eve"})]
        after = requests[requests.index(posts[0]) + 1 :]
        pattern = re.compile(rf"/api/runs/{run_id}\?min_seq=(\d+)$")
        asked = [int(m.group(1)) for r in after if (m := pattern.search(r.url))]
        assert any(seq >= sent["seq"] for seq in asked), asked

        # Over HTTP, as of the newest event the page saw of the run (its end).
        seen = page.evaluate("id => window.__tiffany.live.runs.get(id).walSeq", run_id)
        detail = _http_json(f"{url}api/runs/{run_id}?min_seq={seen}")
        assert detail["status"] == "succeeded", detail
        assert _step(detail, "approve")["output"] == {"by": "eve"}
        assert _step(detail, "approve")["waiting"] is None
        assert _step(detail, "publish")["status"] == "succeeded"
        png = tmp_path / "dashboard-signal.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-signal.png", artifacts_dir)

        # -- "Approve" sends {"approved": true} -------------------------------------
        quick_id = _submit(url, QUICK_APPROVAL_PLAN)
        page.goto(f"{url}#/run/{quick_id}")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", quick_id)
        quick = page.locator('[data-testid=step-row][data-step-id="approve"]')
        expect(quick.get_by_test_id("step-waiting")).to_have_text("waiting for approve")
        quick.get_by_role("button", name="Approve", exact=True).click()
        expect(quick).to_have_attribute("data-status", "succeeded")
        expect(quick.get_by_test_id("step-output")).to_contain_text('"approved":true')
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        seen = page.evaluate("id => window.__tiffany.live.runs.get(id).walSeq", quick_id)
        detail = _http_json(f"{url}api/runs/{quick_id}?min_seq={seen}")
        assert _step(detail, "approve")["output"] == {"approved": True}
    assert not errors, "\n".join(errors)


def test_a_failed_run_is_re_run_from_the_run_page(
    chromium_path: str, service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    """ "Re-run from failure" starts a new run that reuses what succeeded.

    The run fails at b (its file is missing). With the file written into the
    failed run's workspace (a re-run copies it), the button posts the re-run
    with an empty body, the page opens the new run as of the 201's seq, and
    the new run succeeds: a is reused from the earlier run (its row says so,
    with a link there), b and c ran again. A refused re-run shows the
    server's message beside the step's "Re-run from here".
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    old_id = _submit(url, FIX_ME_PLAN)
    with _dashboard(chromium_path) as (page, errors):
        requests: list[Any] = []
        page.on("request", lambda req: requests.append(req))
        page.goto(f"{url}#/run/{old_id}")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", old_id)

        # -- the run failed at b: the re-run controls show ----------------------
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "failed", timeout=30_000
        )
        old_b = page.locator('[data-testid=step-row][data-step-id="b"]')
        expect(old_b).to_have_attribute("data-status", "failed")
        # b's worker returned the failure to the planner (its task is done),
        # yet it shows failed, in the tree and on the timeline: its step failed.
        tree = page.get_by_test_id("task-tree")
        worker_b = tree.locator('[data-testid=task-node][data-name="worker:b"]')
        expect(worker_b).to_have_attribute("data-state", "step_failed")
        expect(worker_b.get_by_test_id("task-state")).to_have_text("step failed")
        expect(worker_b.get_by_test_id("task-state")).to_have_class(re.compile(r"\btone-bad\b"))
        worker_a = tree.locator('[data-testid=task-node][data-name="worker:a"]')
        expect(worker_a).to_have_attribute("data-state", "done")
        bar_b = page.locator("[data-testid=gantt-row][data-state=step_failed]").get_by_test_id(
            "gantt-bar"
        )
        expect(bar_b).to_have_count(1)
        expect(bar_b).to_have_class(re.compile(r"\btone-bad\b"))
        rerun = page.get_by_test_id("rerun-failed")
        expect(rerun).to_be_enabled()
        expect(rerun).to_have_text("Re-run from failure")
        expect(page.get_by_test_id("rerun-from")).to_have_count(3)  # one a step
        expect(old_b.get_by_test_id("rerun-from")).to_have_text("Re-run from here")
        expect(page.get_by_test_id("step-reused")).to_have_count(0)

        # The fix: the file b reads, in the failed run's workspace.
        workspace = service["data_dir"] / "workspaces" / old_id
        assert workspace.is_dir(), workspace
        (workspace / "missing.txt").write_text("found\n")

        # -- "Re-run from failure": 201, then the new run's page -----------------
        with page.expect_response(lambda r: r.url.endswith("/rerun")) as answered:
            rerun.click()
        answer = answered.value
        assert answer.status == 201, answer.text()
        made = answer.json()
        new_id, seq = made["run_id"], made["seq"]
        assert new_id != old_id
        assert made["created"] is True
        post = answer.request
        assert post.method == "POST"
        assert not post.post_data, "the default re-run sends an empty body"

        expect(page).to_have_url(re.compile(rf"#/run/{re.escape(new_id)}(\?|$)"))
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", new_id)
        expect(page.get_by_test_id("run-missing")).to_have_count(0)
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        expect(page.get_by_test_id("run-rerun-of")).to_contain_text(old_id)
        # Listed like any run, and followed to its end.
        new_row = page.locator(f'[data-testid=run-row][data-run-id="{new_id}"]')
        expect(new_row).to_have_attribute("data-status", "succeeded")
        expect(new_row).to_contain_text("fix-me")
        # The new page read the run as of the re-run's record (no 404 race).
        pattern = re.compile(rf"/api/runs/{new_id}\?min_seq=(\d+)$")
        asked = [int(m.group(1)) for r in requests if (m := pattern.search(r.url))]
        assert asked, "the new run's page never asked for a WAL seq"
        assert asked[0] >= seq, (asked, seq)

        # -- a is reused (a note links to the earlier run); b and c ran -----------
        seen = page.evaluate("id => window.__tiffany.live.runs.get(id).walSeq", new_id)
        detail = _http_json(f"{url}api/runs/{new_id}?min_seq={max(seen, seq)}")
        assert detail["status"] == "succeeded", detail
        a = _step(detail, "a")
        assert a["status"] == "succeeded"
        assert a["attempts"][0]["reused"]["run_id"] == old_id
        reused_seq = a["attempts"][0]["reused"]["seq"]
        for sid in ("b", "c"):
            step = _step(detail, sid)
            assert step["status"] == "succeeded", step
            assert all("reused" not in att for att in step["attempts"]), step
        assert _step(detail, "b")["output"]["content"] == "found\n"

        new_a = page.locator('[data-testid=step-row][data-step-id="a"]')
        note = new_a.get_by_test_id("step-reused")
        expect(note).to_be_visible()
        expect(note).to_contain_text(f"reused from {old_id} · seq {reused_seq}")
        expect(note.get_by_role("link", name=old_id)).to_have_attribute("href", f"#/run/{old_id}")
        expect(page.get_by_test_id("step-reused")).to_have_count(1)  # only a
        for sid in ("a", "b", "c"):
            expect(page.locator(f'[data-testid=step-row][data-step-id="{sid}"]')).to_have_attribute(
                "data-status", "succeeded"
            )
        # Nothing failed: no "Re-run from failure", but each step can restart.
        expect(page.get_by_test_id("rerun-failed")).to_have_count(0)
        expect(page.get_by_test_id("rerun-from")).to_have_count(3)
        png = tmp_path / "dashboard-rerun.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-rerun.png", artifacts_dir)

        # -- a refusal shows the server's message beside the control ---------------
        # The request still goes to the server, asking for a step the run lacks.
        page.route(
            "**/rerun",
            lambda route: route.continue_(post_data=json.dumps({"from_step": "nope"})),
        )
        new_b = page.locator('[data-testid=step-row][data-step-id="b"]')
        with page.expect_response(lambda r: r.url.endswith("/rerun")) as refused:
            new_b.get_by_test_id("rerun-from").click()
        assert refused.value.status == 422
        message = refused.value.json()["message"]
        error = new_b.get_by_test_id("rerun-error")
        expect(error).to_be_visible()
        expect(error).to_contain_text(message)
        expect(page.get_by_test_id("rerun-error")).to_have_count(1)  # b's only
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", new_id)
        page.unroute("**/rerun")

        # The note's link opens the earlier run.
        note.get_by_role("link", name=old_id).click()
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", old_id)
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "failed")
    assert not errors, "\n".join(errors)


#: A parent whose one step runs a child plan (a sub-plan): its run is ``<parent>.sub.1``.
PARENT_PLAN = {
    "name": "parent",
    "steps": [
        {
            "id": "sub",
            "tool": "plan.run",
            "args": {
                "plan": {
                    "name": "kid",
                    "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.05}}],
                }
            },
        }
    ],
}
#: One run at a time on key ``k``: each waits for its signal ``go``, the next queues.
QUEUED_PLAN = {
    "name": "q",
    "concurrency": {"key": "k", "limit": 1},
    "steps": [{"id": "w", "tool": "signal.wait", "args": {"name": "go"}}],
}


def test_run_pages_link_sub_plans_and_show_a_queued_run(
    chromium_path: str, service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    """A ``plan.run`` step links to its child run, whose page links back; a queued run says so.

    The parent's step row links to ``<parent>.sub.1``; the child's header says
    whose child it is, with a link back. Of two runs on a concurrency key with
    limit 1, the second is pending with a "queued" badge until the first ends
    (its signal sent over HTTP): its page, following the live feed, then shows
    it started (waiting for its own signal) and drops the badge.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    parent_id = _submit(url, PARENT_PLAN)
    child_id = f"{parent_id}.sub.1"
    with _dashboard(chromium_path) as (page, errors):
        # -- the parent: its plan.run step links to the child run ----------------
        page.goto(f"{url}#/run/{parent_id}")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", parent_id)
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        expect(page.get_by_test_id("run-parent")).to_have_count(0)
        expect(page.get_by_test_id("run-queued")).to_have_count(0)
        sub = page.locator('[data-testid=step-row][data-step-id="sub"]')
        expect(sub).to_have_attribute("data-status", "succeeded")
        link = sub.get_by_test_id("step-child")
        expect(link).to_have_count(1)  # one attempt
        expect(link).to_have_text(child_id)
        expect(link).to_have_attribute("href", f"#/run/{child_id}")
        expect(link).to_have_attribute("data-attempt", "1")

        # -- the child: "child of <parent> · step sub", linking back -------------
        link.click()
        expect(page).to_have_url(re.compile(rf"#/run/{re.escape(child_id)}(\?|$)"))
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", child_id)
        expect(page.get_by_test_id("run-missing")).to_have_count(0)
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "succeeded")
        origin = page.get_by_test_id("run-parent")
        expect(origin).to_have_text(f"child of {parent_id} · step sub")
        back = origin.get_by_role("link", name=parent_id)
        expect(back).to_have_attribute("href", f"#/run/{parent_id}")
        expect(page.locator('[data-testid=step-row][data-step-id="nap"]')).to_have_attribute(
            "data-status", "succeeded"
        )
        expect(page.get_by_test_id("step-child")).to_have_count(0)
        back.click()
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", parent_id)
        expect(sub.get_by_test_id("step-child")).to_have_text(child_id)

        # -- a queued run: pending with a badge, then running once it has a slot --
        first = _submit(url, QUEUED_PLAN)
        second = _submit(url, QUEUED_PLAN)
        assert _http_json(f"{url}api/runs/{second}")["status"] == "pending"
        page.goto(f"{url}#/run/{second}")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", second)
        expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "live")
        badge = page.get_by_test_id("run-queued")
        expect(badge).to_have_text("queued: concurrency key k (limit 1)")
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "pending")
        # The list's row too (the feed's run.started is no start for a queued run).
        expect(page.locator(f'[data-testid=run-row][data-run-id="{second}"]')).to_have_attribute(
            "data-status", "pending"
        )
        # The first waits for its signal, and nothing else: it needs someone.
        expect(page.locator(f'[data-testid=run-row][data-run-id="{first}"]')).to_have_attribute(
            "data-status", "waiting"
        )
        png = tmp_path / "dashboard-queued.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-queued.png", artifacts_dir)

        # The first ends: the second gets its slot and its page follows live.
        _http_json(f"{url}api/runs/{first}/signals/go", {})
        # It runs, and soon waits for its own signal (its one step does).
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "waiting")
        expect(badge).to_have_count(0)
        w = page.locator('[data-testid=step-row][data-step-id="w"]')
        expect(w.get_by_test_id("step-waiting")).to_have_text("waiting for go")
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", second)

        # Nothing left running: the second gets its signal too.
        _http_json(f"{url}api/runs/{second}/signals/go", {})
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        expect(page.locator(f'[data-testid=run-row][data-run-id="{first}"]')).to_have_attribute(
            "data-status", "succeeded"
        )
    assert not errors, "\n".join(errors)


def _plan(name: str, seconds: float = 0.01, **inputs: str) -> dict[str, Any]:
    """A one-step plan named ``name`` declaring ``inputs`` (their defaults)."""
    return {
        "name": name,
        "inputs": inputs,
        "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": seconds}}],
    }


def _submit_with(url: str, plan: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """Submit ``plan`` with ``inputs``; return the submission's answer once the store has it."""
    created = _http_json(url + "api/runs", {"plan": plan, "inputs": inputs})
    _http_json(f"{url}api/runs/{created['run_id']}?min_seq={created['seq']}")
    return dict(created)


def test_the_runs_list_is_searched_by_name_inputs_and_date_and_keeps_it_on_reload(
    chromium_path: str, service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    """The search bar narrows the list through ``GET /api/runs?name=&q=&since=&until=``.

    Typing a name or a text of the inputs shows only the runs that match, the
    status chips count them, the filters are in the URL hash (a reload keeps
    them, inputs filled), a created-at range in the future shows nothing and
    says so, and "Clear" brings every run back.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    report = _submit_with(url, _plan("nightly-report", ticket=""), {"ticket": "TCK-42"})
    backup = _submit_with(url, _plan("nightly-backup", ticket=""), {"ticket": "TCK-7"})
    adhoc = _submit_with(url, _plan("adhoc", who=""), {"who": "Ada"})
    with _dashboard(chromium_path) as (page, errors):
        asked: list[str] = []
        page.on("request", lambda req: asked.append(req.url))
        page.goto(url)
        rows = page.get_by_test_id("run-row")
        expect(rows).to_have_count(3)

        # -- by name: a substring, any case --------------------------------------
        page.get_by_test_id("filter-name").fill("NIGHTLY")
        expect(rows).to_have_count(2)
        expect(rows).to_contain_text(["nightly-backup", "nightly-report"])
        expect(page.get_by_test_id("status-chip-all").get_by_test_id("chip-count")).to_have_text(
            "2"
        )
        assert "name=NIGHTLY" in page.url
        assert any("api/runs?" in u and "name=NIGHTLY" in u for u in asked)

        # -- and text in the inputs ------------------------------------------------
        page.get_by_test_id("filter-q").fill("tck-42")
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-run-id", report["run_id"])

        # -- a reload keeps the filters (the hash), inputs filled ------------------
        page.reload()
        expect(page.get_by_test_id("filter-name")).to_have_value("NIGHTLY")
        expect(page.get_by_test_id("filter-q")).to_have_value("tck-42")
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-run-id", report["run_id"])

        # Opening a run keeps them too.
        rows.first.locator("a").click()
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", report["run_id"])
        assert "q=tck-42" in page.url
        expect(rows).to_have_count(1)

        # -- a date range: created from a future day shows nothing, and says so -----
        page.get_by_test_id("filter-q").fill("")
        expect(rows).to_have_count(2)
        page.get_by_test_id("filter-since").fill("2999-01-01T00:00")
        expect(rows).to_have_count(0)
        expect(page.get_by_test_id("runs-empty")).to_have_text("No runs match these filters.")
        assert any("since=2999-01-01T" in u or "since=2998-12-31T" in u for u in asked)
        page.get_by_test_id("filter-since").fill("2000-01-01T00:00")
        page.get_by_test_id("filter-until").fill("2999-01-01T00:00")
        expect(rows).to_have_count(2)
        png = tmp_path / "dashboard-runs-filters.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-runs-filters.png", artifacts_dir)

        # -- Clear: every run again ---------------------------------------------------
        page.get_by_test_id("filter-clear").click()
        expect(rows).to_have_count(3)
        expect(page.get_by_test_id("filter-name")).to_have_value("")
        ids = rows.evaluate_all(RUNS_JS)
        assert ids == [adhoc["run_id"], backup["run_id"], report["run_id"]]
        assert "name=" not in page.url
    assert not errors, errors


def _slow_click(page: Any, locator: Any, held_ms: int) -> None:
    """Press the mouse on ``locator``'s middle, hold it ``held_ms``, release (a human's click)."""
    box = None
    for _ in range(20):  # None while the element is being redrawn (detached): measure again
        box = locator.bounding_box()
        if box is not None:
            break
        page.wait_for_timeout(50)
    assert box is not None, "not on the page"
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.wait_for_timeout(held_ms)
    page.mouse.up()


def test_a_click_held_across_the_live_pages_redraws_lands(
    chromium_path: str, service: dict[str, Any]
) -> None:
    """A click lands however long the button is held while the page redraws.

    A live run redraws the runs list (its elapsed time, every second) and
    its page's header (every 250 ms). An element rebuilt between a click's
    mousedown and mouseup swallows the click: the browser sends it to
    neither. Here each click is held past a redraw: opening the run from the
    list, then arming and confirming its cancel.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    run_id = _submit(url, QUICK_APPROVAL_PLAN)  # waits for its signal: live
    with _dashboard(chromium_path) as (page, errors):
        page.goto(url)
        row = page.locator(f'[data-testid=run-row][data-run-id="{run_id}"]')
        expect(row).to_have_attribute("data-status", "waiting")
        _slow_click(page, row.locator("a"), held_ms=1_300)
        expect(page.get_by_test_id("run-page")).to_have_attribute("data-run-id", run_id)

        cancel = page.get_by_test_id("cancel-button")
        expect(cancel).to_have_text("Cancel")
        _slow_click(page, cancel, held_ms=600)
        expect(cancel).to_have_text("Really cancel?")
        _slow_click(page, cancel, held_ms=600)
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "cancelled")
    assert not errors, errors


#: The words the dashboard shows for a state, and nothing else (kernel words are mapped).
VOCABULARY = {"pending", "running", "succeeded", "failed", "cancelled", "skipped"}


def test_times_are_local_with_the_zone_elapsed_ticks_and_a_cancel_is_neutral(
    chromium_path: str, service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    """Times show as local date-times with the zone; a run's elapsed time ticks; a cancel is grey.

    In a New York browser the run page's start time reads like
    "Jan 5, 2026, 10:00:00 AM EST", the list row shows the run's age with the
    full time in its tooltip, and the row's elapsed time moves while the run
    sleeps. Cancelled from its page, the run is grey (not the red of a
    failure), says who cancelled it ("cancelled over HTTP", journaled with
    the cancel), not the kernel's "task N", and its tasks speak the same
    words as runs and steps.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    run_id = _submit(url, _plan("long-nap", seconds=60))
    zone = re.compile(r"\b\d{4}\b.*\d{1,2}:\d{2}:\d{2}.*\bE[SD]T$")
    with _dashboard(chromium_path, timezone_id="America/New_York", locale="en-US") as (
        page,
        errors,
    ):
        page.goto(f"{url}#/run/{run_id}")
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "running")

        # -- local date, time and zone -------------------------------------------
        started = page.get_by_test_id("run-started").locator("time")
        expect(started).to_have_text(zone)
        iso = started.get_attribute("datetime")
        assert iso is not None
        assert iso.endswith("Z")
        row = page.locator(f'[data-testid=run-row][data-run-id="{run_id}"]')
        age = row.get_by_test_id("run-row-age")
        expect(age).to_have_text(re.compile(r"just now|\d+ s ago"))
        expect(age).to_have_attribute("title", zone)

        # -- the elapsed time ticks while the run runs --------------------------------
        elapsed = row.get_by_test_id("run-row-elapsed")
        expect(elapsed).not_to_have_text("")
        first = elapsed.inner_text()
        expect(elapsed).not_to_have_text(first, timeout=5_000)
        duration = page.get_by_test_id("run-duration")
        shown = duration.inner_text()
        expect(duration).not_to_have_text(shown, timeout=5_000)

        # -- cancel: grey, with who asked -------------------------------------------
        page.get_by_test_id("cancel-button").click()
        page.get_by_test_id("cancel-button").click()  # armed, then confirmed
        status = page.get_by_test_id("run-status")
        expect(status).to_have_attribute("data-status", "cancelled", timeout=30_000)
        expect(status).to_have_text("cancelled")
        expect(status).to_have_class(re.compile(r"\btone-idle\b"))
        expect(row).to_have_attribute("data-status", "cancelled")
        expect(row.get_by_test_id("run-row-status")).to_have_class(re.compile(r"\btone-idle\b"))
        card = page.get_by_test_id("run-error")
        expect(card).to_have_attribute("data-status", "cancelled")
        expect(card.locator("h3")).to_have_text("Run cancelled")
        reason = page.get_by_test_id("run-cancel-reason")
        expect(reason).to_contain_text("Cancelled: cancelled over HTTP")
        expect(reason).not_to_contain_text("task ")
        colour = card.evaluate("el => getComputedStyle(el).borderLeftColor")
        bad = page.evaluate(
            "() => { const s = document.createElement('span'); s.className = 'tone-bad';"
            " s.style.color = 'var(--tone)'; document.body.append(s);"
            " const c = getComputedStyle(s).color; s.remove(); return c; }"
        )
        assert colour != bad, (colour, bad)
        expect(page.get_by_test_id("run-ended").locator("time")).to_have_text(zone)

        # -- one vocabulary: tasks say succeeded / failed / cancelled, never done ---
        pills = page.get_by_test_id("task-tree").get_by_test_id("task-state")
        expect(pills.first).to_be_visible()
        words = set(pills.all_inner_texts())
        assert words <= VOCABULARY, words
        assert "cancelled" in words, words
        steps = set(page.get_by_test_id("step-status").all_inner_texts())
        assert steps <= VOCABULARY, steps
        detail = _http_json(f"{url}api/runs/{run_id}")
        assert {t["status"] for t in detail["tasks"]} <= VOCABULARY, detail["tasks"]
        png = tmp_path / "dashboard-run-cancelled.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-run-cancelled.png", artifacts_dir)
    assert not errors, errors


@pytest.fixture
def shell_service(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``tiffany serve`` as :func:`service`, with ``shell`` enabled (unsandboxed, on purpose)."""
    data_dir = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.update(
        PYTHONUNBUFFERED="1",
        TIFFANY_ENABLED_TOOLS="shell,sleep,file.read,file.write",
        TIFFANY_SHELL_SANDBOX="none",
    )
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "serve", "--port", "0"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        url = _wait_for_url(proc, data_dir / "serve.json", log_path)
        yield {"url": url, "data_dir": data_dir, "log": log_path}
    finally:
        _stop(proc)


#: Fails twice (counting its tries in a file), then succeeds; prints to both streams.
FLAKY_SH = (
    'n=$(cat tries 2>/dev/null || echo 0); n=$((n+1)); echo "$n" > tries; '
    'echo "try $n"; echo "boom $n" >&2; [ "$n" -ge 3 ]'
)


def _gated(gate: Path) -> str:
    """Shell that waits until the test creates ``gate`` (at most 120 s): a step held running.

    A fixed ``sleep`` raced the browser on a loaded machine (the step could end
    before the page first showed it running); the test opens the gate once it has
    seen what it looks for.
    """
    return f"i=0; while [ ! -e '{gate}' ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done"


def _logs_plan(gate: Path) -> dict[str, Any]:
    """LOGS_PLAN with ``slow`` held running until ``gate`` exists."""
    plan = json.loads(json.dumps(LOGS_PLAN))
    plan["steps"][2]["args"]["argv"] = ["sh", "-c", f"echo start; {_gated(gate)}; echo end"]
    return plan


LOGS_PLAN = {
    "name": "logs",
    "inputs": {"who": "nobody"},
    "steps": [
        {
            "id": "greet",
            "tool": "shell",
            "args": {
                "argv": ["sh", "-c", "echo hello ${inputs.who}; echo line2; echo careful >&2"]
            },
        },
        {
            "id": "flaky",
            "tool": "shell",
            "args": {"argv": ["sh", "-c", FLAKY_SH]},
            "retries": 2,
            "backoff": 0,
        },
        {
            "id": "slow",
            "tool": "shell",
            "args": {"argv": ["sh", "-c", "echo start; sleep 3; echo end"]},
            "after": ["flaky"],
        },
        {
            "id": "use",
            "tool": "shell",
            "args": {"argv": ["printf", "%s", "${steps.greet.output.stdout}"]},
            "after": ["greet", "slow"],
        },
    ],
}

#: Cases both resolvers (tiffany/agents/refs.py and static/refs.js) answer the same way.
REF_CASES: list[Any] = [
    "${inputs.who}",
    " ${inputs.n} ",
    "n=${inputs.n}; f=${inputs.f}; b=${inputs.b}; z=${inputs.z}",
    "${inputs.items}",
    "all: ${inputs.items} and ${inputs.obj}",
    "${steps.s.output.rows[1].name}",
    "${ steps.s.output.rows[0] }",
    "${steps.s.output.text[2]}",
    {"a": ["${inputs.who}", {"b": "x ${steps.s.output.rows} y"}], "n": 3, "t": True},
    "${inputs.missing}",
    "${steps.nope.output}",
    "${steps.s.output.rows[9]}",
    "${steps.s.rows}",
    "${other.x}",
    "plain $ {not} ${",
]
REF_INPUTS = {
    "who": "Zoë",
    "n": 7,
    "f": 2.5,
    "b": False,
    "z": None,
    "items": [1, "two", None],
    "obj": {"k": "ü", "e": 1e21},
}
REF_OUTPUTS = {"s": {"rows": [{"name": "r0"}, {"name": "r1"}], "text": "abcdef"}}


def _text(locator: Any) -> str:
    """The exact text of an element (line breaks kept, nothing normalized)."""
    return str(locator.evaluate("el => el.textContent"))


def _python_resolve(value: Any) -> dict[str, Any]:
    from tiffany.agents.refs import RefError, resolve

    try:
        return {"ok": resolve(value, REF_INPUTS, REF_OUTPUTS)}
    except RefError:
        return {"error": True}


def test_step_args_resolved_every_attempt_with_its_logs_and_live_output(
    chromium_path: str, shell_service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    """The run page shows args as the worker resolved them, and each attempt with its logs.

    ``greet``'s argv shows ``hello world`` (from ``${inputs.who}``), its
    template behind a toggle; ``use``'s shows greet's recorded stdout. The
    flaky step's three attempts are all listed, the first two failed with
    their error and their stdout and stderr as text (lines, not JSON
    strings); while ``slow`` runs, its live output (the feed's
    ``tool.output`` events) is tailed under its running attempt. The page's
    resolver answers as the worker's does on a table of cases.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = shell_service["url"]
    gate = tmp_path / "slow.go"
    run_id = _submit_with(url, _logs_plan(gate), {"who": "world"})["run_id"]
    with _dashboard(chromium_path, viewport={"width": 1600, "height": 1400}) as (page, errors):
        page.goto(f"{url}#/run/{run_id}")
        step = lambda sid: page.locator(f'[data-testid=step-row][data-step-id="{sid}"]')  # noqa: E731

        # -- while slow runs: its attempt tails the live output -------------------
        slow = step("slow")
        expect(slow).to_have_attribute("data-status", "running", timeout=30_000)
        live_log = slow.get_by_test_id("step-live-log")
        expect(live_log).to_contain_text("started pid")
        expect(slow.locator('[data-testid=attempt][data-status="running"]')).to_have_count(1)
        png = tmp_path / "dashboard-log-live.png"
        page.screenshot(path=str(png))  # the steps re-render live: the whole page
        _save_screenshot(png, "dashboard-log-live.png", artifacts_dir)
        gate.touch()  # slow ends

        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )

        # -- resolved args, the template behind the toggle ------------------------------
        greet = step("greet")
        args = greet.get_by_test_id("step-args")
        expect(args).to_have_attribute("data-view", "resolved")
        expect(args.get_by_test_id("step-args-value")).to_contain_text("echo hello world;")
        expect(args.get_by_test_id("step-args-value")).not_to_contain_text("${")
        args.get_by_test_id("args-toggle").click()
        expect(args).to_have_attribute("data-view", "template")
        expect(args.get_by_test_id("step-args-value")).to_contain_text("${inputs.who}")
        args.get_by_test_id("args-toggle").click()
        expect(args).to_have_attribute("data-view", "resolved")
        use = step("use").get_by_test_id("step-args-value")
        expect(use).to_contain_text("hello world\\nline2\\n")
        # A step without references shows its args as they are, no toggle.
        expect(step("slow").get_by_test_id("args-toggle")).to_have_count(0)

        # -- greet's log: text with line breaks, stdout and stderr apart -------------------
        expect(greet.get_by_test_id("log-stdout")).to_be_visible()
        assert _text(greet.get_by_test_id("log-stdout")) == "hello world\nline2\n"
        assert _text(greet.get_by_test_id("log-stderr")) == "careful\n"

        # -- every attempt of the flaky step, errors and logs included -----------------
        flaky = step("flaky")
        attempts = flaky.get_by_test_id("attempt")
        expect(attempts).to_have_count(3)
        expect(flaky.get_by_test_id("attempt-status")).to_have_text(
            ["failed", "failed", "succeeded"]
        )
        first = attempts.nth(0)
        expect(first.get_by_test_id("attempt-error")).to_contain_text("sh exited with status 1")
        expect(first.get_by_test_id("log-stdout")).to_be_visible()
        assert _text(first.get_by_test_id("log-stdout")) == "try 1\n"
        assert _text(first.get_by_test_id("log-stderr")) == "boom 1\n"
        assert _text(attempts.nth(1).get_by_test_id("log-stdout")) == "try 2\n"
        assert _text(attempts.nth(2).get_by_test_id("log-stdout")) == "try 3\n"
        expect(attempts.nth(0).locator("time")).to_have_attribute("datetime", re.compile("Z$"))
        png = tmp_path / "dashboard-logs.png"
        flaky.scroll_into_view_if_needed()
        page.screenshot(path=str(png), full_page=True)
        _save_screenshot(png, "dashboard-logs.png", artifacts_dir)

        # -- the page's resolver answers as the worker's ---------------------------------------
        got = page.evaluate(
            """async ([cases, inputs, outputs]) => {
                const { resolve, RefError } = await import("./static/refs.js");
                return cases.map((c) => {
                    try { return { ok: resolve(c, inputs, outputs) }; }
                    catch (e) { if (e instanceof RefError) return { error: true }; throw e; }
                });
            }""",
            [REF_CASES, REF_INPUTS, REF_OUTPUTS],
        )
        want = [_python_resolve(c) for c in REF_CASES]
        assert got == want
    assert not errors, errors


#: a fails twice (a retry between), b waits for signal ``go``: the run ends failed.
ACTIVITY_PLAN = {
    "name": "activity",
    "steps": [
        {
            "id": "a",
            "tool": "file.read",
            "args": {"path": "missing.txt"},
            "retries": 1,
            "backoff": 0,
        },
        {"id": "b", "tool": "signal.wait", "args": {"name": "go"}},
    ],
}


def test_the_activity_pane_tells_run_events_and_the_run_page_says_when_it_catches_up(
    chromium_path: str, service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    """The activity pane shows run-level events as sentences; kernel detail is behind a toggle.

    A run whose step a fails and is retried while step b waits for a signal
    reads "run started", "step a started", "step a retried ...", "step b
    waiting for signal go", "run failed", with no dispatch, block or wake-up
    until "kernel detail" is ticked. While the store's answers are held back
    (the feed runs ahead of it), the run page says "catching up" instead of
    passing old rows off as current; once they arrive, the badge goes.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = service["url"]
    with _dashboard(chromium_path) as (page, errors):
        page.goto(url)
        expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "live")
        expect(page.get_by_test_id("tail-kernel")).not_to_be_checked()
        run_id = _submit(url, ACTIVITY_PLAN)
        page.goto(f"{url}#/run/{run_id}")
        b = page.locator('[data-testid=step-row][data-step-id="b"]')
        expect(b.get_by_test_id("step-waiting")).to_have_text("waiting for go")

        rows = page.locator(f'[data-testid=tail-row][data-run-id="{run_id}"]')
        what = rows.get_by_test_id("tail-what")
        expect(what.filter(has_text="run started")).to_have_count(1)
        expect(what.filter(has_text="step a started")).to_have_count(1)
        expect(what.filter(has_text="step a retried (attempt 1 failed")).to_have_count(1)
        expect(what.filter(has_text="step b waiting for signal go")).to_have_count(1)
        assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.level)")) == {"run"}

        # -- the store held back: the page says it is catching up ----------------
        held: list[Any] = []
        released: list[bool] = []

        def hold(route: Any) -> None:
            if released:
                route.continue_()
            else:
                held.append(route)

        pattern = re.compile(rf"/api/runs/{re.escape(run_id)}\?min_seq=\d+$")
        page.route(pattern, hold)
        _http_json(f"{url}api/runs/{run_id}/signals/go", {})
        expect(what.filter(has_text="run failed")).to_have_count(1, timeout=30_000)
        badge = page.get_by_test_id("store-catching-up")
        expect(badge).to_have_text("catching up")
        # The steps shown are the store's older state (b not yet settled), and it says so.
        expect(b).not_to_have_attribute("data-status", "succeeded")
        png = tmp_path / "dashboard-activity.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-activity.png", artifacts_dir)
        released.append(True)
        for route in held:
            route.continue_()
        expect(page.get_by_test_id("run-status")).to_have_attribute("data-status", "failed")
        expect(b).to_have_attribute("data-status", "succeeded")
        expect(badge).to_have_count(0)

        # -- kernel detail behind the toggle ---------------------------------------
        kernel = rows.and_(page.locator("[data-level=kernel]"))
        expect(kernel).to_have_count(0)
        page.get_by_test_id("tail-kernel").check()
        expect(kernel.first).to_be_visible()
        kinds = set(kernel.evaluate_all("rs => rs.map(r => r.dataset.kind)"))
        assert {"step", "blocked", "woke"} <= kinds, kinds
        page.get_by_test_id("tail-kernel").uncheck()
        expect(kernel).to_have_count(0)
    assert not errors, errors


def test_the_run_page_shows_the_runs_model_usage(
    chromium_path: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """Two scripted ``llm`` steps: the header's "model usage" is their tokens and cost, summed."""
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    # The offline scripted provider, asked for (without a model, an llm step fails).
    with _serving(tmp_path, env_extra={"TIFFANY_LLM_MODEL": "scripted"}) as service:
        _shows_the_runs_model_usage(chromium_path, service, tmp_path, artifacts_dir)


def _shows_the_runs_model_usage(
    chromium_path: str, service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    url = service["url"]
    llm = {"tool": "llm", "args": {"prompt": "one two three four five"}}
    run_id = _submit(
        url, {"name": "talk", "steps": [{"id": "a", **llm}, {"id": "b", **llm, "after": ["a"]}]}
    )
    with _dashboard(chromium_path) as (page, errors):
        page.goto(f"{url}#/run/{run_id}")
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        detail = _http_json(f"{url}api/runs/{run_id}")
        outputs = [s["output"] for s in detail["steps"]]
        tokens = sum(o["usage"]["total_tokens"] for o in outputs)
        usd = sum(o["cost_usd"] for o in outputs)
        assert detail["usage"] == {"tokens": tokens, "usd": pytest.approx(usd)}
        expect(page.get_by_test_id("run-usage").locator("dd")).to_have_text(
            f"{tokens:,} tokens · ${usd:.4f}"
        )
        png = tmp_path / "dashboard-usage.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-usage.png", artifacts_dir)
    assert not errors, "\n".join(errors)


#: Prints a line, then half a line, waits for its gate, and ends the line.
TALKER_SH = "echo first line; printf waiting; {gate}; echo ' done'"


def test_the_live_log_shows_a_shell_steps_first_line_while_it_runs(
    chromium_path: str, shell_service: dict[str, Any], tmp_path: Path, artifacts_dir: Path
) -> None:
    """The run page's live log tails the shell step's lines while the command still sleeps.

    ``first line`` shows under the running attempt, and so does ``waiting``
    (half a line, flushed when no newline came), long before the step ends;
    once it has, the attempt's log is the recorded stdout, the line whole.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url = shell_service["url"]
    gate = tmp_path / "talk.go"
    plan = {
        "name": "talker",
        "steps": [
            {
                "id": "talk",
                "tool": "shell",
                "args": {"argv": ["sh", "-c", TALKER_SH.format(gate=_gated(gate))]},
            }
        ],
    }
    run_id = _submit(url, plan)
    with _dashboard(chromium_path) as (page, errors):
        page.goto(f"{url}#/run/{run_id}")
        talk = page.locator('[data-testid=step-row][data-step-id="talk"]')
        live_log = talk.get_by_test_id("step-live-log")
        expect(live_log).to_contain_text("first line", timeout=30_000)
        expect(live_log).to_contain_text("waiting")
        # still running: the line came from the feed, not from the step's result
        expect(talk).to_have_attribute("data-status", "running")
        expect(talk.get_by_test_id("log-stdout")).to_have_count(0)
        detail = _http_json(f"{url}api/runs/{run_id}")
        assert detail["status"] == "running"
        png = tmp_path / "dashboard-live-shell.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-live-shell.png", artifacts_dir)
        gate.touch()  # the command ends its line

        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "succeeded", timeout=30_000
        )
        expect(talk.get_by_test_id("log-stdout")).to_be_visible()
        assert _text(talk.get_by_test_id("log-stdout")) == "first line\nwaiting done\n"
    assert not errors, "\n".join(errors)


def test_a_step_re_run_after_a_crash_is_marked_on_its_attempt(
    chromium_path: str, service: dict[str, Any]
) -> None:
    """The step card's attempts, as the run detail gives them after a crash (test_restarts.py).

    A finished attempt marked ``rerun_after_crash`` says so (and the list
    opens, though the step ran one attempt); one still running after the
    restart (the store's provisional record, without ``ok``) is the running
    attempt, marked, not a failed one.
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with _dashboard(chromium_path) as (page, errors):
        page.goto(service["url"])
        page.evaluate(
            """async () => {
              const { attemptsBlock } = await import("./static/steplog.js");
              const done = attemptsBlock(
                { attempts: [{ attempt: 1, ok: true, started_at: 1, ended_at: 2,
                               rerun_after_crash: true }], output: { n: 1 } },
                { running: false, liveLines: [] });
              const running = attemptsBlock(
                { attempts: [{ attempt: 2, rerun_after_crash: true, started_at: 3 }] },
                { running: true, liveLines: [] });
              const plain = attemptsBlock(
                { attempts: [{ attempt: 1, ok: true, started_at: 1, ended_at: 2 }], output: 1 },
                { running: false, liveLines: [] });
              for (const [id, el] of [["done", done], ["running", running]]) {
                const box = document.createElement("div");
                box.dataset.testid = `case-${id}`;
                box.append(el);
                document.body.append(box);
              }
              window.plainIsNull = plain === null;
            }"""
        )
        done = page.get_by_test_id("case-done")
        expect(done.get_by_test_id("attempt")).to_have_count(1)
        expect(done.get_by_test_id("attempt-status")).to_have_text("succeeded")
        expect(done.get_by_test_id("attempt-rerun")).to_have_text("re-run after a crash")
        expect(done.get_by_test_id("step-attempts")).to_have_attribute("open", "")
        running = page.get_by_test_id("case-running")
        expect(running.get_by_test_id("attempt")).to_have_count(1)
        expect(running.get_by_test_id("attempt")).to_have_attribute("data-status", "running")
        expect(running.get_by_test_id("attempt")).to_have_attribute("data-attempt", "2")
        expect(running.get_by_test_id("attempt-rerun")).to_be_visible()
        assert page.evaluate("window.plainIsNull")  # one clean attempt adds nothing, as before
    assert not errors, errors


#: A user's module for ``serve --import``: a function that fails two frames deep.
PARSE_TOOLS = """\
from tiffany import python_tool


def count(text):
    return int(text)


@python_tool("test.count")
def counted(text: str) -> int:
    return count(text)
"""


def test_a_failed_python_steps_card_shows_its_users_traceback(
    chromium_path: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """The step card showed the error's type and message; now the frames of the user's code.

    Each frame as ``file:line in function`` over its source line, most recent
    call last, in a collapsible block beside the error (which no longer
    repeats them).
    """
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    (tmp_path / "parsetools.py").write_text(PARSE_TOOLS)
    where = str(tmp_path / "parsetools.py")
    args = {"function": "test.count", "kwargs": {"text": "x"}}
    step = {"id": "c", "tool": "python", "args": args}
    with (
        _serving(tmp_path, "--import", "parsetools") as service,
        _dashboard(chromium_path) as (page, errors),
    ):
        url = service["url"]
        run_id = _submit(url, {"name": "counting", "steps": [step]})
        page.goto(f"{url}#/run/{run_id}")
        expect(page.get_by_test_id("run-status")).to_have_attribute(
            "data-status", "failed", timeout=30_000
        )
        card = page.locator('[data-testid=step-row][data-step-id="c"]')
        block = card.get_by_test_id("step-traceback")
        expect(block).to_be_visible()
        frames = block.get_by_test_id("traceback-frame")
        expect(frames).to_have_count(2)
        expect(frames.nth(0)).to_have_attribute("data-file", where)
        expect(frames.nth(0)).to_have_attribute("data-line", "10")
        expect(frames.nth(0)).to_contain_text(f"{where}:10 in counted")
        expect(frames.nth(0).get_by_test_id("traceback-code")).to_have_text("return count(text)")
        expect(frames.nth(1)).to_contain_text(f"{where}:5 in count")
        expect(frames.nth(1).get_by_test_id("traceback-code")).to_have_text("return int(text)")
        family = (
            frames.nth(1)
            .get_by_test_id("traceback-code")
            .evaluate("el => getComputedStyle(el).fontFamily")
        )
        assert "mono" in family.lower(), family
        error = card.get_by_test_id("step-error")
        expect(error).to_contain_text("invalid literal for int()")
        expect(error).not_to_contain_text("parsetools.py")  # the frames are shown once
        block.locator("summary").click()  # collapsible
        expect(frames.nth(0)).to_be_hidden()
        png = tmp_path / "dashboard-traceback.png"
        block.locator("summary").click()
        card.screenshot(path=str(png))
        _save_screenshot(png, "dashboard-traceback.png", artifacts_dir)
    assert not errors, "\n".join(errors)
