"""``GET /metrics`` of a real ``tiffany serve``: one valid exposition from two registries."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from process_support import wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_serve import _get, _serve, _stop

PLAN = {
    "name": "metered",
    "steps": [
        {"id": "a", "tool": "sleep", "args": {"seconds": 0.01}},
        {"id": "b", "tool": "sleep", "after": ["a"], "args": {"seconds": 0.01}},
    ],
}


def _scrape(
    url: str,
) -> tuple[dict[str, str], dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """Parse ``/metrics`` with prometheus_client's parser: (family -> type, sample -> value)."""
    with urllib.request.urlopen(url + "metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = resp.read().decode()
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a family appears twice (the registries overlap)"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples
    }
    return {f.name: f.type for f in families}, samples


def _submit(url: str) -> str:
    req = urllib.request.Request(
        url + "api/runs",
        data=json.dumps({"plan": PLAN}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 201
        run_id: str = json.loads(resp.read())["run_id"]
    return run_id


def test_metrics_of_both_processes_parse_and_move_after_a_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, url = _serve(data)
    try:
        wait_for(lambda: _get(url + "readyz")["ready"], 60, "readyz")
        types, before = _scrape(url)
        assert before[("tiffany_engine_up", ())] == 1
        assert types["tiffany_wal_fsync_seconds"] == "histogram"
        assert types["tiffany_loop_slow_dispatch_seconds"] == "histogram"
        assert types["tiffany_dispatches"] == "counter"
        assert types["tiffany_loop_steps_handed_over"] == "counter"
        # Each process's own CPU and memory, under a prefix of its own.
        assert before[("tiffany_engine_process_resident_memory_bytes", ())] > 0
        assert before[("tiffany_api_process_resident_memory_bytes", ())] > 0

        run_id = _submit(url)
        wait_for(lambda: _get(url + f"api/runs/{run_id}")["status"] == "succeeded", 60, "the run")
        _, after = _scrape(url)
    finally:
        code, out = _stop(proc)
    assert code == 0, out

    def grew(name: str, labels: tuple[tuple[str, str], ...] = ()) -> bool:
        return after[(name, labels)] > before.get((name, labels), 0.0)

    assert grew("tiffany_dispatches_total")
    assert grew("tiffany_wal_commits_total")
    assert grew("tiffany_wal_records_total")
    assert grew("tiffany_wal_fsync_seconds_count")
    assert grew("tiffany_wal_fsync_seconds_bucket", (("le", "+Inf"),))
    assert grew("tiffany_feed_published_total")
    assert grew("tiffany_projector_last_seq")
    assert after[("tiffany_runs", (("status", "succeeded"),))] == 1
    assert after[("tiffany_runs_active", ())] == 0
    assert grew("tiffany_api_feed_events_total")
