"""2,500 submissions over loopback, 10% reusing an Idempotency-Key: none lost, none duplicated.

A real served instance takes ``TIFFANY_FAULT_SUBMISSIONS`` (default 2,500)
``POST /api/runs`` from :data:`CONCURRENCY` concurrent clients. Every
submission carries an ``Idempotency-Key``; one in ten repeats the key (and
the body) of an earlier one, possibly still in flight. Each answer is 201
(a new run), 200 with the run id of the key's first submission, or 429/503
with ``Retry-After`` (shed: the client waits and sends it again); nothing
else. At the end every key maps to exactly one run id, exactly one
submission per key got 201, and the WAL (``tiffany runs``) and the API's run
list hold exactly those runs: none lost, none duplicated.
"""

from __future__ import annotations

import asyncio
import json
import os
import random  # noqa: TID251 - the harness picks plans and kill points, not task code
import time
from collections import Counter, defaultdict
from typing import Any

import httpx
import pytest
from fault_support import ServeFactory, cli

TOTAL = int(os.environ.get("TIFFANY_FAULT_SUBMISSIONS", "2500"))
CONCURRENCY = 64
REUSE = 0.10
PLAN = {"name": "tiny", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}


async def _load(url: str) -> tuple[dict[str, list[tuple[int, str]]], Counter[int], float]:
    rng = random.Random(10_000)
    keys: list[str] = []
    for i in range(TOTAL):
        if keys and rng.random() < REUSE:
            keys.append(rng.choice(keys[: max(1, i - 1)]))
        else:
            keys.append(f"key-{i}")
    answers: dict[str, list[tuple[int, str]]] = defaultdict(list)
    statuses: Counter[int] = Counter()
    queue: asyncio.Queue[str] = asyncio.Queue()
    for key in keys:
        queue.put_nowait(key)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            key = queue.get_nowait()
            body = {"plan": {**PLAN, "name": f"tiny-{key}"}, "inputs": {}}
            for _attempt in range(100):
                r = await client.post(
                    url + "/api/runs", json=body, headers={"Idempotency-Key": key}
                )
                statuses[r.status_code] += 1
                if r.status_code in (429, 503):
                    assert "retry-after" in r.headers, (r.status_code, r.headers)
                    await asyncio.sleep(min(float(r.headers["retry-after"]), 1.0))
                    continue
                assert r.status_code in (200, 201), (r.status_code, r.text)
                answer = r.json()
                assert answer["created"] == (r.status_code == 201)
                answers[key].append((r.status_code, answer["run_id"]))
                break
            else:
                raise AssertionError(f"{key}: shed 100 times")

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return answers, statuses, time.monotonic() - started


def _api_run_ids(client: httpx.Client, url: str) -> set[str]:
    ids: set[str] = set()
    before = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if before is not None:
            params["before"] = before
        page = client.get(url + "/api/runs", params=params).json()
        ids.update(r["run_id"] for r in page["runs"])
        before = page["next_before"]
        if before is None:
            return ids


@pytest.mark.timeout(900)
def test_thousands_of_submissions_none_lost_none_duplicated(
    serve_factory: ServeFactory,
) -> None:
    served = serve_factory.start()
    served.wait_ready()
    answers, statuses, seconds = asyncio.run(_load(served.url))

    assert sum(len(a) for a in answers.values()) == TOTAL
    accepted: dict[str, str] = {}
    for key, got in answers.items():
        run_ids = {run_id for _, run_id in got}
        assert len(run_ids) == 1, (key, got)
        assert [code for code, _ in got].count(201) == 1, (key, got)
        accepted[key] = run_ids.pop()
    assert len(set(accepted.values())) == len(accepted), "two keys share a run"

    # The API's list catches up with the WAL: exactly the accepted runs.
    want = set(accepted.values())
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=30) as client:
        while (listed := _api_run_ids(client, served.url)) != want:
            assert not listed - want, f"unexpected runs: {sorted(listed - want)[:5]}"
            assert time.monotonic() < deadline, f"{len(want - listed)} runs missing from the API"
            time.sleep(0.5)
    assert served.stop() == 0, served.log()[-4000:]

    wal = [
        json.loads(line) for line in cli(served.data_dir, served.env, "runs", "--json").splitlines()
    ]
    wal_ids = [r["run_id"] for r in wal]
    assert len(wal_ids) == len(set(wal_ids)) == len(accepted)
    assert set(wal_ids) == want
    names = Counter(r["name"] for r in wal)
    assert all(c == 1 for c in names.values()), names.most_common(3)
    print(
        json.dumps(
            {
                "submissions": TOTAL,
                "distinct_keys": len(accepted),
                "answers": dict(sorted(statuses.items())),
                "seconds": round(seconds, 1),
                "per_second": round(sum(statuses.values()) / seconds),
            }
        )
    )
