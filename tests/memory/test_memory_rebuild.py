"""``tiffany db rebuild`` restores memory from the journal.

Runs write memory (puts, an update, a link, a delete, an agent's
``remember``); the store's file is then deleted. ``tiffany db rebuild``
projects the runs again and re-applies, in journal order, every memory
write the journal holds: the items come back with their versions, ops,
runs and steps, the deleted one stays deleted, the link is there, and a
search by meaning finds them (the vectors came from the journal). A
second rebuild re-applies nothing (each op is in the store); a write the
HTTP API made (not journaled) survives a rebuild. On PostgreSQL, the lost
store is a fresh database the rebuild fills.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from memory_runs import ROOT, open_store, run_plan, tiffany

PLAN = {
    "name": "remember-things",
    "steps": [
        {
            "id": "a",
            "tool": "memory.put",
            "args": {"namespace": "kb", "key": "a", "value": "alpha one"},
        },
        {
            "id": "a2",
            "tool": "memory.put",
            "args": {"namespace": "kb", "key": "a", "value": "alpha two", "ttl_s": 3600},
            "after": ["a"],
        },
        {"id": "b", "tool": "memory.put", "args": {"namespace": "kb", "key": "b", "value": "beta"}},
        {
            "id": "c",
            "tool": "memory.put",
            "args": {"namespace": "kb", "value": {"note": "gamma ray"}},
        },
        {
            "id": "ab",
            "tool": "memory.link",
            "args": {
                "subject": {"namespace": "kb", "key": "a"},
                "relation": "next",
                "object": {"namespace": "kb", "key": "b"},
            },
            "after": ["a2", "b"],
        },
        {
            "id": "drop",
            "tool": "memory.delete",
            "args": {"namespace": "kb", "key": "b"},
            "after": ["ab"],
        },
        {
            "id": "chat",
            "tool": "agent",
            "args": {"goal": "I prefer the dark theme.", "memory": {"namespace": "users.alice"}},
        },
    ],
    "outputs": {"made": "${steps.c.output.key}"},
}


def _snapshot(data_dir: Path, keys: list[str], url: str | None) -> dict[str, Any]:
    store = open_store(data_dir, url)
    try:
        return {
            "items": {k: store.get("kb", k) for k in keys},
            "history": {k: store.history("kb", k) for k in keys},
            "links": store.links("kb", "a"),
            "theme": store.history("users.alice", "theme"),
            "found": [i["key"] for i in store.search("kb", "gamma ray", mode="vector")["items"]],
        }
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_rebuild_brings_memory_back_from_the_journal(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    script = str(ROOT / "examples" / "memory" / "script.yaml")
    url = request.getfixturevalue("pg_schema_url") if backend == "postgres" else None
    store_kw = {"database_url": url} if url else {}
    run_id, state = run_plan(tmp_path, PLAN, llm_script=Path(script), **store_kw)
    assert state.status == "succeeded", state.error
    keys = ["a", "b", state.result["outputs"]["made"]]
    before = _snapshot(tmp_path, keys, url)
    assert before["items"]["b"] is None  # deleted
    assert [h["version"] for h in before["history"]["a"]] == [1, 2]
    assert len(before["theme"]) == 1

    env: dict[str, str] = {}
    if backend == "postgres":  # the store is lost: the rebuild fills a fresh database
        url = request.getfixturevalue("pg_migrated_url")
        env = {"TIFFANY_DATABASE_URL": url}
        assert _snapshot(tmp_path, keys, url)["items"]["a"] is None
    else:
        for leftover in tmp_path.glob("tiffany.db*"):  # the store is lost
            leftover.unlink()
    done = tiffany(tmp_path, "db", "rebuild", "--json", **env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["runs"] == 1
    assert (report["memory_writes"], report["memory_restored"]) == (7, 7)
    assert report["memory_refused"] == []
    assert _snapshot(tmp_path, keys, url) == before

    store = open_store(tmp_path, url)
    try:  # a write of the HTTP API's (no journal) stays through a rebuild
        store.put("kb", "api", "written by a client", op="api:1")
    finally:
        store.close()
    again = tiffany(tmp_path, "db", "rebuild", "--json", **env)
    assert again.returncode == 0, again.stderr[-3000:]
    report = json.loads(again.stdout.strip().splitlines()[-1])
    assert (report["memory_writes"], report["memory_restored"]) == (7, 0)
    after = _snapshot(tmp_path, [*keys, "api"], url)
    assert after["items"]["api"]["value"] == "written by a client"
    assert {k: v for k, v in after["items"].items() if k != "api"} == before["items"]
    assert run_id in {h["run_id"] for h in after["history"]["a"]}
