"""kill -9 of the whole ``tiffany serve`` group at seeded points, with ~20 mixed runs in flight.

One data dir lives through ``TIFFANY_FAULT_SEEDS`` (default 12) crashes: each
serve lifetime tops the in-flight runs up to :data:`IN_FLIGHT` with new mixed
plans (fan-out, chain, retry with a flaky step, sleeps) submitted concurrently
over HTTP, then the whole process group (serve, engine, projector, API) gets
SIGKILL at a seeded point: either a delay after the submissions start, or
the moment the k-th new step effect lands (mid-run, often mid-step). After
each crash the WAL is read cold: every acknowledged (201) run is in it, and
the steps whose results it holds are noted. After the last restart every
acknowledged run must finish, and:

- a retry of a submission the crash cut off, with the same
  ``Idempotency-Key``, gets the run if it was durable (200) or a new one
  (201), and a repeat of an acknowledged one gets its run (200): the WAL
  holds exactly one run per submission;
- its outputs equal those of an uncrashed twin (same plan and inputs, under
  another tag so its effects are counted apart) run on the same server;
- no step whose result was durable at a crash ran again after it (effects
  are counted in ``effects.log``); a step in flight at a crash may run once
  more per crash;
- ``tiffany wal verify`` passes, every run replays identically
  (``replay --verify``: a few through the CLI, all through its function in
  one child process), and the store equals a ``tiffany db rebuild`` of the
  WAL into a second database (status, outputs, step statuses of every run),
  as the API also answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import random  # noqa: TID251 - the harness picks plans and kill points, not task code
import time
from typing import Any

import httpx
import pytest
from fault_support import (
    PLAN_KINDS,
    TERMINAL,
    Served,
    ServeFactory,
    check_effects,
    cli,
    durable_steps,
    effect_steps,
    mixed_plan,
    read_effects,
    rerun_count,
    store_rows,
    verify_all,
    wal_runs,
)

#: Crash points (``TIFFANY_FAULT_SEEDS`` runs more).
CRASHES = int(os.environ.get("TIFFANY_FAULT_SEEDS", "12"))
#: Runs kept in flight at each crash.
IN_FLIGHT = 20
SEED = 9
#: Distinct plans (the twins run once per plan); runs draw from them.
PLANS = 12
#: Runs replay-verified in CI (all of them under ``TIFFANY_FAULT_SEEDS``).
VERIFIED = 40 if "TIFFANY_FAULT_SEEDS" not in os.environ else 10**9


async def _submit(client: httpx.AsyncClient, url: str, plan: dict[str, Any], tag: str) -> Any:
    """POST one run; its id on 201, None when the crash cut it off (not acknowledged)."""
    try:
        r = await client.post(
            url + "/api/runs",
            json={"plan": plan, "inputs": {"tag": tag}},
            headers={"Idempotency-Key": tag},
        )
    except httpx.HTTPError:
        return None
    if r.status_code == 201:
        return r.json()["run_id"]
    assert r.status_code in (429, 503), (r.status_code, r.text)
    return None


async def _submit_then_crash(
    served: Served, batch: list[tuple[str, dict[str, Any]]], point: tuple[str, float], eff: Any
) -> dict[str, str]:
    """Submit ``batch`` concurrently and kill -9 the group at ``point``; return tag -> run id."""
    acked: dict[str, str] = {}
    start_effects = len(read_effects(eff))

    async def one(tag: str, plan: dict[str, Any]) -> None:
        run_id = await _submit(client, served.url, plan, tag)
        if run_id is not None:
            acked[tag] = run_id

    async with httpx.AsyncClient(timeout=30) as client:
        tasks = [asyncio.create_task(one(tag, plan)) for tag, plan in batch]
        kind, amount = point
        if kind == "delay":
            await asyncio.sleep(amount)
        else:  # the amount-th effect after the submissions began, or 3 s
            deadline = time.monotonic() + 3
            while len(read_effects(eff)) < start_effects + amount:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.005)
        served.kill9()
        await asyncio.gather(*tasks)
    return acked


def _wait_finished(served: Served, run_ids: list[str], timeout: float) -> dict[str, Any]:
    details: dict[str, Any] = {}
    pending = set(run_ids)
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=30) as client:
        while pending:
            for run_id in sorted(pending):
                r = client.get(served.url + f"/api/runs/{run_id}")
                if r.status_code == 200 and r.json()["status"] in TERMINAL:
                    details[run_id] = r.json()
                    pending.discard(run_id)
            if pending:
                assert time.monotonic() < deadline, f"unfinished: {sorted(pending)[:10]}"
                time.sleep(0.3)
    return details


@pytest.mark.timeout(300 + 10 * CRASHES)
def test_kill9_of_the_serve_group_loses_nothing_and_reruns_no_finished_step(
    serve_factory: ServeFactory,
) -> None:
    rng = random.Random(SEED)
    eff = serve_factory.effects_dir
    data = serve_factory.data_dir
    env = serve_factory.env
    pool = [mixed_plan(PLAN_KINDS[i % len(PLAN_KINDS)], rng, eff) for i in range(PLANS)]
    plans: dict[str, int] = {}  # tag -> its plan's index in the pool
    tag_run: dict[str, str] = {}  # acknowledged: tag -> run id
    crashes: list[tuple[int, dict[str, set[str]]]] = []
    statuses: dict[str, str] = {}
    crossed: set[str] = set()  # runs unfinished at some crash
    started = time.monotonic()

    served = serve_factory.start()
    timings: dict[str, float] = {"start": 0.0, "crash": 0.0, "scan": 0.0}
    for point_no in range(CRASHES):
        unfinished = sum(1 for rid in tag_run.values() if statuses.get(rid) == "running")
        batch = []
        for _ in range(max(3, IN_FLIGHT - unfinished)):
            tag = f"t{len(plans)}"
            plans[tag] = rng.randrange(PLANS)
            batch.append((tag, pool[plans[tag]]))
        if rng.random() < 0.5:
            point = ("delay", round(rng.uniform(0.0, 1.5), 3))
        else:
            point = ("effect", rng.randint(1, 40))
        t0 = time.monotonic()
        acked = asyncio.run(_submit_then_crash(served, batch, point, eff))
        tag_run.update(acked)
        t1 = time.monotonic()
        crashes.append((len(read_effects(eff)), durable_steps(data / "wal")))
        statuses = wal_runs(data / "wal")
        crossed.update(rid for rid, status in statuses.items() if status == "running")
        lost = [rid for rid in acked.values() if rid not in statuses]
        assert not lost, f"crash {point_no} at {point}: acknowledged runs not in the WAL: {lost}"
        t2 = time.monotonic()
        served = serve_factory.start()
        timings["crash"] += t1 - t0
        timings["scan"] += t2 - t1
        timings["start"] += time.monotonic() - t2

    # The last lifetime. A client retries what the crashes cut off, with the same
    # Idempotency-Key: the run if it was durable (200), else a new one (201); and
    # a repeat of an acknowledged submission names its run again.
    served.wait_ready()
    in_wal = wal_runs(data / "wal")
    with httpx.Client(timeout=30) as client:
        retried = [t for t in plans if t not in tag_run]
        repeats = random.Random(SEED).sample(sorted(tag_run), min(20, len(tag_run)))
        for tag in retried + repeats:
            r = client.post(
                served.url + "/api/runs",
                json={"plan": pool[plans[tag]], "inputs": {"tag": tag}},
                headers={"Idempotency-Key": tag},
            )
            assert r.status_code in (200, 201), r.text
            run_id = r.json()["run_id"]
            if tag in tag_run:
                assert (r.status_code, run_id) == (200, tag_run[tag]), (tag, r.text)
                continue
            assert (r.status_code == 200) == (run_id in in_wal), (tag, r.text)
            assert run_id not in tag_run.values(), (tag, r.text)
            tag_run[tag] = run_id
    assert len(set(tag_run.values())) == len(tag_run) == len(plans)
    details = _wait_finished(served, list(tag_run.values()), timeout=120)
    twins: dict[int, str] = {}
    with httpx.Client(timeout=30) as client:
        for i, plan in enumerate(pool):
            r = client.post(
                served.url + "/api/runs", json={"plan": plan, "inputs": {"tag": f"twin{i}"}}
            )
            assert r.status_code == 201, r.text
            twins[i] = r.json()["run_id"]
    twin_details = _wait_finished(served, list(twins.values()), timeout=120)
    for tag, run_id in tag_run.items():
        got, want = details[run_id], twin_details[twins[plans[tag]]]
        assert got["status"] == "succeeded", (run_id, got["status"], got.get("error"))
        assert got["outputs"] == want["outputs"], (run_id, got["outputs"], want["outputs"])
        assert {s["step_id"]: s["status"] for s in got["steps"]} == {
            s["step_id"]: s["status"] for s in want["steps"]
        }
    assert served.stop() == 0, served.log()[-4000:]

    effects = read_effects(eff)
    expected = {tag: effect_steps(pool[plans[tag]]) for tag in tag_run}
    problems = check_effects(effects, crashes, tag_run, expected)
    assert not problems, problems[:20]

    # The WAL verifies, every run replays identically, the store equals a rebuild.
    assert json.loads(cli(data, env, "wal", "verify", "--json"))["ok"] is True
    all_runs = sorted(wal_runs(data / "wal"))
    for run_id in list(tag_run.values())[:3]:
        assert json.loads(cli(data, env, "replay", run_id, "--verify", "--json"))["ok"] is True
    sample = sorted(random.Random(SEED).sample(sorted(crossed), min(VERIFIED, len(crossed))))
    bad = verify_all(data, env, sample)
    assert not bad, bad
    rebuilt_url = f"sqlite:///{serve_factory.base / 'rebuilt.db'}"
    cli(data, {**env, "TIFFANY_DATABASE_URL": rebuilt_url}, "db", "rebuild")
    live = store_rows(f"sqlite:///{data / 'tiffany.db'}")
    rebuilt = store_rows(rebuilt_url)
    assert set(live) == set(rebuilt) == set(all_runs)
    assert len(all_runs) == len(plans) + len(pool), "a run in the WAL that no client asked for"
    for run_id in all_runs:
        assert live[run_id] == rebuilt[run_id], run_id
    for run_id, detail in details.items():
        assert rebuilt[run_id]["status"] == detail["status"]
        assert rebuilt[run_id]["outputs"] == detail["outputs"]
        assert rebuilt[run_id]["steps"] == {s["step_id"]: s["status"] for s in detail["steps"]}

    print(
        json.dumps(
            {
                "crashes": len(crashes),
                "submitted": len(plans),
                "acknowledged": len(tag_run),
                "runs_in_wal": len(all_runs),
                "replay_verified": len(sample) + 3,
                "effects": len(effects),
                "reruns_of_in_flight_steps": rerun_count([e for e in effects if e[0] in tag_run]),
                "seconds": round(time.monotonic() - started, 1),
                **{k: round(v, 1) for k, v in timings.items()},
            }
        )
    )
