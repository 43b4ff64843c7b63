"""A stop, a fail-stop and a fence start nothing new (issue 38): effects counted.

A real ``tiffany engine`` runs one plan of ``STEPS`` independent python steps
(``stop_effects.stop_effect``: a line as it starts, a line as it ends), far
more than its thread pool runs at once, so hundreds wait in the pool's queue
with their STEP_START durable. Then the engine is stopped (SIGTERM) or
fenced (its stream's lease epoch bumped in the table, as a take-over does),
and restarted (or replaced by the stream's next owner) to finish the run.

What must hold: no effect starts after the engine's stop decision (the
``engine.stopping`` log line, the fence's ``pgwal.failed``/``lease_lost``
line: each is logged after the scheduler was stopped), and after the
restart every step ran, each once, except, after a fence, steps whose
first run was in flight at the stop (started before it, completion not
journaled): those run once more. A SIGTERM'd engine waits for those and
journals their ends first (``Scheduler.drain``): none runs twice (8, one
per pool thread, before it did). Before the fix the pool ran every queued job on its way out
(its stop markers queued behind them): hundreds of effects after the stop,
hundreds of steps twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from engine_process import EngineProc
from process_support import wait_for

from tiffany.durable import scan
from tiffany.wire.control import ControlError, ControlUnavailable, call

HERE = Path(__file__).resolve().parent
#: Steps in the plan: hundreds queued behind the pool's workers.
STEPS = 300
#: The engine's thread pool (``Scheduler(max_threads=8)``): jobs in flight at once.
POOL = 8
#: Each effect's duration, in seconds: 300 of them take ~2 s on 8 workers.
EFFECT_S = 0.05
#: Effects started before the stop: the rest wait in the queue.
BEFORE_STOP = 40


def _plan(effects: Path) -> dict[str, Any]:
    return {
        "name": "stops",
        "steps": [
            {
                "id": f"s{i}",
                "tool": "python",
                "args": {
                    "function": "stop_effect",
                    "kwargs": {"dir": str(effects), "step": i, "seconds": EFFECT_S},
                },
            }
            for i in range(STEPS)
        ],
    }


def _effects(effects: Path) -> list[tuple[str, int, float]]:
    path = effects / "effects.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        kind, step, at = line.split()
        out.append((kind, int(step), float(at)))
    return out


def _starts(effects: Path) -> list[tuple[int, float]]:
    return [(step, at) for kind, step, at in _effects(effects) if kind == "start"]


def _logged_at(eng: EngineProc, *events: str) -> float | None:
    """The wall-clock time of the first of ``events`` in the engine's log, if any."""
    times = [
        datetime.fromisoformat(rec["timestamp"]).timestamp()
        for event in events
        for rec in eng.logged(event)
    ]
    return min(times) if times else None


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "TIFFANY_LOG_FORMAT": "json",
            "TIFFANY_LOG_LEVEL": "info",
            "TIFFANY_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
            **extra,
        }
    )
    return env


def _wait_finished(eng: EngineProc) -> None:
    def done() -> bool:
        with contextlib.suppress(ControlError, ControlUnavailable):
            status = eng.call("status")
            return bool(status["ready"]) and status["runs_active"] == 0
        return False

    wait_for(done, 180, "the recovered run to finish", interval=0.2)


def _check(
    effects: Path,
    stop_at: float,
    run_status: str,
    fenced_from: float | None = None,
    *,
    drained: bool = False,
) -> None:
    """Nothing started after ``stop_at``; every step ran, twice only if in flight then.

    ``drained``: the engine waited for its workers' steps and journaled their
    ends (a SIGTERM: ``Scheduler.drain``): no step runs twice.

    ``fenced_from``: when the stream was taken over, before the engine learnt it
    at ``stop_at`` (its next commit): a queued job a worker took in between is
    in flight for the journal too (its result can no longer be journaled). That
    window is as long as the machine is slow to reach the commit, so those are
    counted apart from the bound on what was in flight at the take-over.
    """
    starts = _starts(effects)
    first: dict[int, float] = {}
    for step, at in starts:
        first.setdefault(step, at)
    counts = Counter(step for step, _ in starts)
    twice = sorted(step for step, n in counts.items() if n > 1)
    print(
        f"\n{len(starts)} effects for {STEPS} steps; {len(twice)} ran twice "
        f"(in flight at the stop): {twice}"
    )
    assert run_status == "succeeded"
    assert sorted(counts) == list(range(STEPS)), "a step never ran"
    assert max(counts.values()) <= 2, counts.most_common(3)
    if drained:
        assert twice == [], f"{len(twice)} steps in flight at the stop ran again: {twice}"
    # Each step that ran twice had started before the stop: it was in
    # flight (a worker ran it), not a queued job the stop let through.
    late = [step for step in twice if first[step] > stop_at]
    assert late == [], f"{len(late)} steps first started after the stop ran again: {late[:10]}"
    # In flight at the stop: the pool's workers' jobs, and the completions
    # the loop had not journaled yet (at most one batch of workers more).
    since = stop_at if fenced_from is None else fenced_from
    before = [step for step in twice if first[step] <= since]
    if fenced_from is not None:
        window = len(twice) - len(before)
        print(f"{window} started between the take-over and the engine learning it")
    assert len(before) <= 2 * POOL, before


def test_sigterm_with_hundreds_of_queued_steps_starts_none_of_them(tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    effects.mkdir()
    data = tmp_path / "data"
    env = _env(tmp_path)
    eng = EngineProc(data, "--import", "stop_effects", env=env)
    try:
        eng.wait_ready()
        run_id = eng.call("submit", plan=_plan(effects))["run_id"]
        wait_for(lambda: len(_starts(effects)) >= BEFORE_STOP, 120, "the first effects")
        sent_at = time.time()  # noqa: TID251 - compared with the effects' wall-clock times
        eng.proc.send_signal(signal.SIGTERM)
        assert eng.proc.wait(60) == 0, eng.log()[-3000:]
    finally:
        eng.stop()
    stop_at = _logged_at(eng, "engine.stopping") or sent_at  # (an engine that says nothing)
    starts = _starts(effects)
    after_stop = [step for step, at in starts if at > stop_at]
    after_signal = [step for step, at in starts if at > sent_at]
    print(
        f"\nSIGTERM: {len(starts)} effects started before it stopped; "
        f"{len(after_signal)} after the signal was sent, {len(after_stop)} after the stop"
    )
    assert after_stop == [], f"{len(after_stop)} effects started after the stop: {after_stop[:10]}"
    # Between the signal and its handler a worker may take a job or two: never more
    # than the pool runs at once.
    assert len(after_signal) <= POOL, after_signal
    assert len(starts) < STEPS // 2  # the queued ones stayed unstarted
    # It waited for its workers' steps and journaled their ends.
    drained = [rec["steps_still_running"] for rec in eng.logged("engine.drained")]
    assert drained == [0], eng.log()[-3000:]

    again = EngineProc(data, "--import", "stop_effects", env=env)
    try:
        _wait_finished(again)
    finally:
        assert again.stop() == 0, again.log()[-3000:]
    info = scan(data / "wal").get(run_id)
    _check(effects, stop_at, info.status, drained=True)


def _pg_env(tmp_path: Path, url: str) -> tuple[Path, dict[str, str]]:
    """The effects' directory and an engine's environment on the PostgreSQL journal (lease 2 s)."""
    effects = tmp_path / "effects"
    effects.mkdir()
    env = _env(
        tmp_path, TIFFANY_JOURNAL="postgres", TIFFANY_DATABASE_URL=url, TIFFANY_JOURNAL_LEASE_S="2"
    )
    return effects, env


def _running(eng: EngineProc, effects: Path) -> str:
    """Submit the plan once ``eng`` is ready; its run id, once BEFORE_STOP effects started."""
    eng.wait_ready()
    run_id: str = eng.call("submit", plan=_plan(effects))["run_id"]
    wait_for(lambda: len(_starts(effects)) >= BEFORE_STOP, 120, "the first effects")
    return run_id


def _take_over(url: str) -> None:
    """Another engine takes the stream: its epoch moves on, as PgLog.open's take-over does."""
    from sqlalchemy import create_engine, text

    db = create_engine(url)
    try:
        with db.begin() as conn:
            conn.execute(text("UPDATE wal_streams SET epoch = epoch + 1"))
    finally:
        db.dispose()


def test_a_fenced_postgres_engine_starts_nothing_after_the_fence(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    from tiffany.wal.pg import PgStream

    effects, env = _pg_env(tmp_path, pg_migrated_url)
    eng = EngineProc(tmp_path / "a", "--import", "stop_effects", env=env)
    try:
        run_id = _running(eng, effects)
        # Another engine takes the stream over: the epoch moves on under the writer.
        taken_over_at = time.time()  # noqa: TID251 - compared with the effects' times
        _take_over(pg_migrated_url)
        assert eng.proc.wait(60) == 1, eng.log()[-3000:]  # fenced: stepped down
    finally:
        eng.stop()
    fenced_at = _logged_at(eng, "pgwal.failed", "pgwal.lease_lost")
    assert fenced_at is not None, eng.log()[-3000:]
    starts = _starts(effects)
    after = [step for step, at in starts if at > fenced_at]
    print(f"\nfence: {len(starts)} effects started before it stopped, {len(after)} after the fence")
    assert after == [], f"{len(after)} effects started after the fence: {after[:10]}"
    assert len(starts) < STEPS // 2  # the queued ones stayed unstarted

    # The stream's next owner (once the lease ran out) finishes the run.
    owner = EngineProc(tmp_path / "b", "--import", "stop_effects", env=env)
    try:
        _wait_finished(owner)
    finally:
        assert owner.stop() == 0, owner.log()[-3000:]
    info = scan(PgStream(pg_migrated_url, "main")).get(run_id)
    _check(effects, fenced_at, info.status, fenced_from=taken_over_at)


def test_an_engine_paused_past_its_lease_starts_nothing_when_it_wakes(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    """SIGSTOP past the lease, the stream taken over, SIGCONT: the sleeper starts nothing.

    When it wakes, its pool's workers and its heartbeat resume together: the
    heartbeat has not told it yet that the stream is another's, so before
    the lease gate a worker took the next queued job at once (a step the
    new owner runs too). Each job now asks whether the lease is surely
    still held (by a clock that counted through the pause) before it starts.
    """
    from tiffany.wal.pg import PgStream, streams

    effects, env = _pg_env(tmp_path, pg_migrated_url)
    eng = EngineProc(tmp_path / "a", "--import", "stop_effects", env=env)
    try:
        run_id = _running(eng, effects)
        os.kill(eng.proc.pid, signal.SIGSTOP)
        try:
            # Past the lease (the database's clock says so), another engine
            # takes the stream: the epoch moves on, as PgLog.open's take-over does.
            wait_for(
                lambda: streams(pg_migrated_url)[0]["lease_left_s"] == 0, 60, "the lease to end"
            )
            _take_over(pg_migrated_url)
            taken_at = time.time()  # noqa: TID251 - compared with the effects' times
        finally:
            os.kill(eng.proc.pid, signal.SIGCONT)
        assert eng.proc.wait(60) == 1, eng.log()[-3000:]  # fenced: stepped down
    finally:
        eng.stop()
    starts = _starts(effects)
    after = [step for step, at in starts if at > taken_at]
    print(f"\npaused: {len(starts)} effects started before it stopped, {len(after)} after it woke")
    assert after == [], f"{len(after)} effects started by the engine that woke: {after[:10]}"

    owner = EngineProc(tmp_path / "b", "--import", "stop_effects", env=env)
    try:
        _wait_finished(owner)
    finally:
        assert owner.stop() == 0, owner.log()[-3000:]
    info = scan(PgStream(pg_migrated_url, "main")).get(run_id)
    _check(effects, taken_at, info.status)


def test_a_wal_that_fails_with_enospc_starts_nothing_after_its_failure(
    tmp_path: Path, settings: Any
) -> None:
    """Fail-stop on the file WAL (an injected ENOSPC at the sync): no effect after it."""
    import errno
    import threading

    import stop_effects  # noqa: F401 - registers the python tool in this process

    from tiffany.engine.service import EngineService

    effects = tmp_path / "effects"
    effects.mkdir()
    service = EngineService(settings)
    wal = service.runtime.wal
    real_sync = wal._fdatasync  # type: ignore[attr-defined]
    failing = threading.Event()
    failed_at: list[float] = []

    def injected(fd: int) -> None:
        if failing.is_set():
            failed_at.append(time.time())  # noqa: TID251 - compared with the effects' times
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_sync(fd)

    stopped_at: list[float] = []
    on_failed = getattr(wal, "on_failed", None)

    def stopped() -> None:  # the scheduler is stopped in there: nothing starts after
        if on_failed is not None:
            on_failed()
        stopped_at.append(time.time())  # noqa: TID251

    wal._fdatasync = injected  # type: ignore[attr-defined]
    wal.on_failed = stopped
    ready = threading.Event()
    result: dict[str, int] = {}
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "code", service.serve(install_signals=False, ready=ready.set)
        ),
        daemon=True,
    )
    thread.start()
    assert ready.wait(60)
    call(settings.data_dir, "submit", plan=_plan(effects))
    wait_for(lambda: len(_starts(effects)) >= BEFORE_STOP, 120, "the first effects")
    failing.set()
    thread.join(60)
    assert not thread.is_alive(), "the engine did not fail-stop"
    assert result["code"] == 1
    stop_at = (stopped_at or failed_at)[0]
    starts = _starts(effects)
    after = [step for step, at in starts if at > stop_at]
    print(f"\nENOSPC: {len(starts)} effects started before it stopped, {len(after)} after")
    assert after == [], f"{len(after)} effects started after the WAL failed: {after[:10]}"
    assert len(starts) < STEPS // 2  # the queued ones stayed unstarted
