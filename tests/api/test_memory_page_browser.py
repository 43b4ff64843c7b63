"""The dashboard's memory page in a real browser against ``tiffany serve`` (no mocks).

``tiffany serve`` on a fresh data dir; the memory is seeded as runs write
it, through a :class:`~tiffany.memory.MemoryStore` on the store's database
file; Debian's chromium, driven by Playwright, is used as a person would:

* the namespaces with their counts, a namespace's items;
* a search: its hits best first with their scores, and how it searched;
* an item: its value, its versions, its neighbours drawn as a graph (the
  items that link to it on the left, those it links to on the right, each
  edge named by its relation); a click on a neighbour opens it;
* deleting an item, after a confirmation naming it;
* a key and a value that hold markup and a ``/`` are shown as text;
* a run's page: the Memory card lists what its ``memory.*`` steps read and
  wrote, each item linked to its page (drawn from a run's detail: see the
  test's docstring).

Screenshots of each page, light and dark, go to the suite's
``test-artifacts/`` (``dashboard-memory-<page>-<theme>.png``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_dashboard_browser as base
from test_dashboard_browser import _dashboard, _save_screenshot, _stop, _wait_for_url

from tiffany.memory import MemoryStore

chromium_path = base.chromium_path

EXPECT_TIMEOUT_MS = 20_000
#: The memory examples (an agent that remembers, its scripted model).
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "memory"
#: A value and a key a page must show as text, never as markup.
HOSTILE_KEY = 'x/<img src=x onerror="window.__pwned=1">'
HOSTILE_VALUE = '<script>window.__pwned=1</script><b onmouseover="window.__pwned=1">bold?</b>'
#: A workflow that uses the memory (``--import memory_page_flows``): its calls are steps too.
WORKFLOW = """\
from tiffany.workflows import memory, workflow


@workflow("memory-page.notes")
def notes():
    ns = "wf.notes"
    yield memory.put(ns, "city", {"city": "Lyon"}, text="lives in Lyon, France")
    yield memory.put(ns, "food", "likes buckwheat crepes")
    item = yield memory.get(ns, "city")
    found = yield memory.search(ns, "where does the user live", k=2)
    yield memory.link((ns, "city"), "near", (ns, "food"))
    gone = yield memory.delete(ns, "food")
    city = item["item"]["value"]["city"]
    return {"city": city, "hits": len(found["items"]), "gone": gone["deleted"]}
"""


@pytest.fixture(scope="module")
def memory_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``tiffany serve`` with its memory seeded; yields (its URL, the data dir)."""
    tmp = tmp_path_factory.mktemp("memory-page")
    data_dir, log_path = tmp / "data", tmp / "serve.log"
    (tmp / "memory_page_flows.py").write_text(WORKFLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), env.get("PYTHONPATH", "")])
    env["TIFFANY_LLM_SCRIPT"] = str(EXAMPLES / "script.yaml")  # the agent's scripted model
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "serve", "--port", "0"]
    cmd += ["--import", "memory_page_flows"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        url = _wait_for_url(proc, data_dir / "serve.json", log_path)
        _seed(f"sqlite:///{data_dir / 'tiffany.db'}")
        yield url, data_dir
    finally:
        _stop(proc)


def _seed(url: str) -> None:
    store = MemoryStore.open(url)
    try:
        facts = {
            "paris": "Paris is the capital of France and the Seine flows through it",
            "berlin": "Berlin is the capital of Germany, on the Spree",
            "seine": "The Seine is a river that flows through Paris to the Channel",
            "lyon": "Lyon stands where the Rhone meets the Saone",
            "tea": "Alice prefers green tea in the morning",
        }
        for key, text in facts.items():
            store.put("facts", key, {"text": text}, text, op=f"seed/{key}")
        store.put(
            "facts",
            "paris",
            {"text": facts["paris"], "population": 2_100_000},
            facts["paris"],
            op="seed/paris-2",
            run_id="run-seeded",
            step_id="learn",
        )
        store.put("places.countries", "france", {"name": "France"}, op="seed/france")
        store.put("facts", HOSTILE_KEY, HOSTILE_VALUE, op="seed/hostile")
        store.link(("facts", "paris"), "on_river", ("facts", "seine"), op="seed/l1")
        store.link(("facts", "paris"), "capital_of", ("places.countries", "france"), op="seed/l2")
        store.link(("facts", "berlin"), "compared_with", ("facts", "paris"), op="seed/l3")
        store.link(("facts", "lyon"), "near", ("facts", "paris"), op="seed/l4")
    finally:
        store.close()


def _shots(page: Any, name: str, tmp_path: Path, artifacts_dir: Path) -> None:
    for theme in ("light", "dark"):
        page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
        page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        png = tmp_path / f"dashboard-memory-{name}-{theme}.png"
        page.screenshot(path=str(png))
        _save_screenshot(png, png.name, artifacts_dir)
        shots = Path(os.environ.get("TIFFANY_MEMORY_SHOTS", "/tmp/memory-shots"))
        shots.mkdir(parents=True, exist_ok=True)
        (shots / png.name).write_bytes(png.read_bytes())
    page.evaluate("delete document.documentElement.dataset.theme")


def test_the_memory_page_lists_searches_and_draws_an_item_and_its_neighbours(
    chromium_path: str, memory_served: tuple[str, Path], tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url, _ = memory_served
    with _dashboard(chromium_path) as (page, errors):
        page.on("dialog", lambda d: errors.append(f"dialog: {d.message}"))
        page.goto(url)
        page.get_by_test_id("nav-memory").click()
        expect(page.get_by_test_id("nav-memory")).to_have_attribute("aria-current", "page")
        spaces = page.get_by_test_id("memory-namespace")
        expect(spaces).to_have_count(2)
        facts = page.locator('[data-testid=memory-namespace][data-namespace="facts"]')
        expect(facts).to_contain_text("6")
        expect(page.get_by_test_id("memory-home")).to_contain_text("7 items in 2 namespaces")

        # -- a namespace's items, by key ------------------------------------------------
        facts.click()
        expect(facts).to_have_attribute("aria-current", "page")
        rows = page.get_by_test_id("memory-item-row")
        expect(rows).to_have_count(6)
        keys = rows.evaluate_all("rs => rs.map(r => r.dataset.key)")
        assert keys == sorted(keys)
        paris_row = page.locator('[data-testid=memory-item-row][data-key="paris"]')
        expect(paris_row.get_by_test_id("memory-run-link")).to_have_text("run-seeded")
        _shots(page, "items", tmp_path, artifacts_dir)

        # -- a search ---------------------------------------------------------------------
        page.get_by_test_id("memory-search-input").fill("capital of France")
        page.get_by_test_id("memory-search-button").click()
        expect(page).to_have_url(f"{url}#/memory/facts?search=capital%20of%20France")
        hits = page.get_by_test_id("memory-hit")
        expect(hits.first).to_have_attribute("data-key", "paris")
        scores = hits.evaluate_all("hs => hs.map(h => Number(h.dataset.score))")
        assert scores == sorted(scores, reverse=True), scores
        assert len(scores) >= 2
        info = page.get_by_test_id("memory-search-info")
        expect(info).to_have_attribute("data-mode", "hybrid")
        expect(info).to_contain_text("vectors:")
        _shots(page, "search", tmp_path, artifacts_dir)

        # -- an item and its neighbours -------------------------------------------------------
        hits.first.get_by_test_id("memory-item-link").click()
        item = page.get_by_test_id("memory-item")
        expect(item).to_have_attribute("data-key", "paris")
        expect(item).to_have_attribute("data-version", "2")
        expect(page.get_by_test_id("memory-value")).to_contain_text("2100000")
        expect(page.get_by_test_id("memory-version")).to_have_count(2)
        expect(page.get_by_test_id("memory-link")).to_have_count(4)
        graph = page.get_by_test_id("memory-graph")
        expect(graph.get_by_test_id("memory-node-self")).to_have_attribute("data-key", "paris")
        nodes = graph.get_by_test_id("memory-node")
        expect(nodes).to_have_count(4)

        def node(key: str) -> Any:
            return graph.locator(f'[data-testid=memory-node][data-key="{key}"]')

        expect(node("seine")).to_have_attribute("data-direction", "out")
        expect(node("france")).to_have_attribute("data-namespace", "places.countries")
        expect(node("berlin")).to_have_attribute("data-direction", "in")
        expect(node("lyon")).to_have_attribute("data-direction", "in")
        on_river = graph.locator('[data-testid=memory-edge][data-relation="on_river"]')
        expect(on_river).to_have_attribute("data-to", "seine")
        expect(on_river).to_contain_text("on_river")
        # The left column (links to it) is left of the item, the right one right of it.
        box = {k: node(k).bounding_box() for k in ("seine", "berlin")}
        me = graph.get_by_test_id("memory-node-self").bounding_box()
        assert box["berlin"]["x"] < me["x"] < box["seine"]["x"]
        _shots(page, "item", tmp_path, artifacts_dir)

        # A click on a neighbour opens it; there the item it came from links in.
        node("seine").click()
        expect(item).to_have_attribute("data-key", "seine")
        expect(node("paris")).to_have_attribute("data-direction", "in")
        page.go_back()
        expect(item).to_have_attribute("data-key", "paris")

        # -- markup in a key and a value is text ------------------------------------------------
        page.locator("[data-testid=memory-crumb-namespace]").click()
        hostile = page.locator("[data-testid=memory-item-row]").filter(has_text="onerror")
        expect(hostile).to_have_count(1)
        hostile.get_by_test_id("memory-item-link").click()
        expect(item).to_have_attribute("data-key", HOSTILE_KEY)
        expect(page.get_by_test_id("memory-value")).to_have_text(HOSTILE_VALUE)
        expect(page.get_by_test_id("memory-item-key")).to_have_text(HOSTILE_KEY)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("main img, main script, main b").count() == 0

        # -- deleting an item, after a confirmation naming it --------------------------------------
        page.goto(f"{url}#/memory/facts/tea")
        expect(item).to_have_attribute("data-key", "tea")
        page.get_by_test_id("memory-delete").click()
        dialog = page.get_by_test_id("confirm-dialog")
        expect(dialog).to_contain_text("tea")
        page.get_by_test_id("confirm-ok").click()
        expect(page).to_have_url(f"{url}#/memory/facts")
        expect(page.get_by_test_id("memory-item-row")).to_have_count(5)
        expect(facts).to_contain_text("5")
        # Its page now says it is gone.
        page.goto(f"{url}#/memory/facts/tea")
        expect(page.get_by_test_id("memory-item-missing")).to_contain_text("no item 'tea'")
        bad = [e for e in errors if "status of 404" not in e]
        assert not bad, bad


#: A run that learns, links, recalls, searches and forgets: every memory
#: tool but neighbors, a read that finds nothing, a put without a key.
LEARN_PLAN: dict[str, Any] = {
    "name": "learn",
    "steps": [
        {
            "id": "remember",
            "tool": "memory.put",
            "args": {
                "namespace": "learned",
                "key": "paris",
                "value": {"text": "Paris is the capital of France"},
            },
        },
        {
            "id": "country",
            "tool": "memory.put",
            "args": {"namespace": "learned.places", "key": "france", "value": {"name": "France"}},
        },
        {
            "id": "note",
            "tool": "memory.put",
            "args": {"namespace": "learned", "value": "a note with no key given"},
        },
        {
            "id": "relate",
            "tool": "memory.link",
            "after": ["remember", "country"],
            "args": {
                "subject": {"namespace": "learned", "key": "paris"},
                "relation": "capital_of",
                "object": {"namespace": "learned.places", "key": "france"},
            },
        },
        {
            "id": "recall",
            "tool": "memory.get",
            "after": ["relate"],
            "args": {"namespace": "learned", "key": "${steps.remember.output.key}"},
        },
        {
            "id": "missing",
            "tool": "memory.get",
            "args": {"namespace": "learned", "key": "atlantis"},
        },
        {
            "id": "find",
            "tool": "memory.search",
            "after": ["relate", "note"],
            "args": {"namespace": "learned", "query": "capital of France", "k": 3},
        },
        {
            "id": "around",
            "tool": "memory.neighbors",
            "after": ["relate"],
            "args": {"namespace": "learned", "key": "paris"},
        },
        {
            "id": "forget",
            "tool": "memory.delete",
            "after": ["find"],
            "args": {"namespace": "learned", "key": "${steps.note.output.key}"},
        },
    ],
}


def test_a_runs_page_lists_what_its_memory_steps_read_and_wrote(
    chromium_path: str, memory_served: tuple[str, Path], tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect
    from process_support import wait_for
    from test_dashboard_browser import _http_json

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url, _ = memory_served
    created = _http_json(url + "api/runs", {"plan": LEARN_PLAN})
    run_id = str(created["run_id"])

    def finished() -> dict[str, Any] | None:
        run = _http_json(f"{url}api/runs/{run_id}?min_seq={created['seq']}")
        return run if run["status"] in ("succeeded", "failed", "cancelled") else None

    run = wait_for(finished, 60, "the learning run to finish")
    assert run["status"] == "succeeded", run
    with _dashboard(chromium_path) as (page, errors):
        page.goto(f"{url}#/run/{run_id}")
        card = page.get_by_test_id("memory-card")
        expect(card).to_be_visible()
        rows = card.get_by_test_id("run-memory-row")
        expect(rows).to_have_count(len(LEARN_PLAN["steps"]))

        def row(step: str) -> Any:
            return card.locator(f'[data-testid=run-memory-row][data-step-id="{step}"]')

        for step, op, write in [
            ("remember", "put", "true"),
            ("relate", "link", "true"),
            ("recall", "get", "false"),
            ("find", "search", "false"),
            ("around", "neighbors", "false"),
            ("forget", "delete", "true"),
        ]:
            expect(row(step)).to_have_attribute("data-op", op)
            expect(row(step)).to_have_attribute("data-write", write)
        # A put without a key shows the key the store made for it; the delete names it.
        made = row("note").get_by_test_id("run-memory-item")
        expect(made).to_have_count(1)
        made_key = made.get_attribute("data-key")
        assert made_key
        # What is gone (deleted, or never there) is named, not linked.
        gone = row("forget").get_by_test_id("run-memory-gone")
        expect(gone).to_have_attribute("data-key", made_key)
        expect(row("forget")).to_contain_text("deleted")
        expect(row("missing").get_by_test_id("run-memory-gone")).to_have_text("atlantis")
        expect(row("missing")).to_contain_text("not found")
        expect(row("recall")).to_contain_text("found v1")
        expect(row("relate").get_by_test_id("run-memory-item")).to_have_count(2)
        expect(row("find")).to_contain_text("capital of France")
        expect(row("find").get_by_test_id("run-memory-item").first).to_have_attribute(
            "data-key", "paris"
        )
        around = row("around").get_by_test_id("run-memory-item")
        expect(around).to_have_count(2)  # the item, and france along capital_of
        card.scroll_into_view_if_needed()
        _shots(page, "run", tmp_path, artifacts_dir)

        # An item it wrote opens on the memory page, naming the run and step that wrote it.
        row("remember").get_by_test_id("run-memory-item").click()
        item = page.get_by_test_id("memory-item")
        expect(item).to_have_attribute("data-key", "paris")
        writer = page.locator(".memory-meta").get_by_test_id("memory-run-link")
        expect(writer).to_have_attribute("data-run-id", run_id)
        expect(page.locator(".memory-meta")).to_contain_text("step remember")
        france = page.get_by_test_id("memory-graph").locator(
            '[data-testid=memory-node][data-key="france"]'
        )
        expect(france).to_have_attribute("data-direction", "out")
        bad = [e for e in errors if "status of 404" not in e]
        assert not bad, bad


def test_a_workflow_runs_page_lists_its_memory_calls(
    chromium_path: str, memory_served: tuple[str, Path], tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import expect
    from process_support import wait_for
    from test_dashboard_browser import _http_json

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url, _ = memory_served
    created = _http_json(url + "api/runs", {"workflow": "memory-page.notes", "inputs": {}})
    run_id = str(created["run_id"])

    def finished() -> dict[str, Any] | None:
        run = _http_json(f"{url}api/runs/{run_id}?min_seq={created['seq']}")
        return run if run["status"] in ("succeeded", "failed", "cancelled") else None

    run = wait_for(finished, 60, "the workflow run to finish")
    assert run["status"] == "succeeded", run
    with _dashboard(chromium_path) as (page, errors):
        page.goto(f"{url}#/run/{run_id}")
        card = page.get_by_test_id("memory-card")
        expect(card).to_be_visible()
        rows = card.get_by_test_id("run-memory-row")
        expect(rows).to_have_count(6)
        ops = rows.evaluate_all("rs => rs.map(r => r.dataset.op)")
        assert ops == ["put", "put", "get", "search", "link", "delete"]
        # A workflow's calls are tasks with no plan arguments: each one's result names
        # what it touched.
        for i in (0, 2):
            expect(rows.nth(i).get_by_test_id("run-memory-item")).to_have_attribute(
                "data-key", "city"
            )
            expect(rows.nth(i).get_by_test_id("run-memory-namespace")).to_have_text("wf.notes")
        expect(rows.nth(2)).to_contain_text("found v1")
        expect(rows.nth(3).get_by_test_id("run-memory-item").first).to_have_attribute(
            "data-key", "city"
        )
        expect(rows.nth(4).get_by_test_id("run-memory-item")).to_have_count(2)
        expect(rows.nth(5).get_by_test_id("run-memory-gone")).to_have_text("food")
        bad = [e for e in errors if "status of 404" not in e]
        assert not bad, bad


def test_an_agents_remember_and_recall_are_on_its_runs_memory_card(
    chromium_path: str, memory_served: tuple[str, Path]
) -> None:
    """examples/memory/agent.yaml with its scripted model: told, then asked, in two runs."""
    import yaml
    from playwright.sync_api import expect
    from process_support import wait_for
    from test_dashboard_browser import _http_json

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    url, _ = memory_served
    plan = yaml.safe_load((EXAMPLES / "agent.yaml").read_text())

    def run(message: str) -> str:
        created = _http_json(url + "api/runs", {"plan": plan, "inputs": {"message": message}})

        def finished() -> dict[str, Any] | None:
            got = _http_json(f"{url}api/runs/{created['run_id']}?min_seq={created['seq']}")
            return got if got["status"] in ("succeeded", "failed", "cancelled") else None

        done = wait_for(finished, 60, "the agent's run to finish")
        assert done["status"] == "succeeded", done
        return str(created["run_id"])

    told = run("I prefer the dark theme.")
    asked = run("Which theme do I like?")
    with _dashboard(chromium_path) as (page, errors):
        page.goto(f"{url}#/run/{told}")
        rows = page.get_by_test_id("memory-card").get_by_test_id("run-memory-row")
        expect(rows).to_have_count(1)
        expect(rows).to_have_attribute("data-step-id", "chat · remember")
        expect(rows).to_have_attribute("data-op", "put")
        expect(rows.get_by_test_id("run-memory-item")).to_have_attribute("data-key", "theme")
        expect(rows.get_by_test_id("run-memory-namespace")).to_have_text("users.alice")
        page.goto(f"{url}#/run/{asked}")
        rows = page.get_by_test_id("memory-card").get_by_test_id("run-memory-row")
        expect(rows).to_have_attribute("data-step-id", "chat · recall")
        expect(rows).to_have_attribute("data-op", "search")
        expect(rows.get_by_test_id("run-memory-item").first).to_have_attribute("data-key", "theme")
        bad = [e for e in errors if "status of 404" not in e]
        assert not bad, bad
