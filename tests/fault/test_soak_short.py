"""The soak, short: a minute of mixed load under faults, and every count that must be 0 is.

``bench/soak.py``'s harness (``soak_harness.py``) for :data:`LOAD_MINUTES`:
plans, signals (sent early, sent twice with one key), sub-plans (with
forged ``child:`` signals), schedules ticking every 1-5 s, agent steps
calling a mock model on 127.0.0.1; kill -9 of a random process of the serve
group every 6-18 s, a SIGTERM restart every 15 s, and on PostgreSQL (two
servers on one stream, a 3 s lease) one SIGSTOP of the driving engine until
the other takes the stream over. Then every acknowledged run must have finished and
succeeded with its outputs, every acknowledged signal been consumed once,
no tick run twice, no effect run beyond the re-runs of steps in flight at
a stop, and every finished run replay-verify. On failure the message is the
soak's table and the first problems of each kind.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from soak_harness import Soak, SoakConfig, nonzero, table
from soak_nodes import pg_schema

LOAD_MINUTES = 0.6
SHORT = SoakConfig(
    minutes=LOAD_MINUTES,
    in_flight=16,
    crash_every=12.0,
    sigterm_every=15.0,
    subscribers=3,
    sample_s=15.0,
    seed=7,
    finish_timeout_s=120.0,
    verify_workers=2,
)


def _check(summary: dict[str, object]) -> None:
    text = table(summary) + "\n" + json.dumps(summary["problems"], indent=1, default=str)[:8000]
    faults = summary["faults"]
    assert isinstance(faults, dict)
    assert summary["runs_acknowledged"], text
    assert summary["runs_verified"], text
    assert sum(v for k, v in faults.items() if k.startswith("kill -9")) >= 1, text
    assert faults.get("SIGTERM restarts", 0) >= 1, text
    assert not nonzero(summary), text


def test_a_short_soak_on_the_file_wal_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    _check(Soak(SHORT, tmp_path).run())


def test_a_short_soak_on_postgresql_with_a_sigstop_past_the_lease(
    tmp_path: Path, postgres_url: str
) -> None:
    config = replace(SHORT, journal="postgres", pg_url=postgres_url, sigstop_at=0.3, lease_s=3.0)
    with pg_schema(postgres_url) as url:
        summary = Soak(config, tmp_path, url).run()
    faults = summary["faults"]
    assert isinstance(faults, dict)
    assert faults.get("SIGSTOP taken over") == 1, table(summary)
    _check(summary)
