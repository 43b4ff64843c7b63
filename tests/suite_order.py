"""The order ``make test`` starts the suite's files in (see tests/conftest.py).

A module of its own: ``conftest`` names a dozen files here, so a test
cannot import it by name.
"""

from __future__ import annotations

#: Files that take minutes, slowest first: they start first. ``make test``
#: hands whole files to its workers (``--dist loadfile``) in collection order
#: (``--no-loadscope-reorder``: xdist would otherwise sort them by their
#: number of tests, which put these one- and two-test files last, and the
#: suite's last minutes on one worker). Longest first is the classic
#: makespan rule; the order is from a ``--durations`` run on a 2-core
#: machine, and a file missing here only starts later.
SLOW_FILES_FIRST: tuple[str, ...] = (
    "tests/fault/test_kill9.py",
    "tests/fault/test_submissions.py",
    "tests/serve/test_serve_engines.py",
    "tests/engine/test_service.py",
    "tests/api/test_schemathesis.py",
    "tests/fault/test_soak_short.py",
    "tests/test_cli_remote.py",
    "tests/sdk/test_sdk.py",
    "tests/durable/test_crash.py",
    "tests/api/test_postgres.py",
    "tests/durable/test_journal.py",
    "tests/serve/test_supervisor.py",
    "tests/serve/test_engine_slots.py",
    "tests/api/test_dashboard_browser.py",
    "tests/memory/test_memory_pgvector.py",
    "tests/serve/test_serve_pg_claims.py",
    "tests/fault/test_poison_outputs.py",
    "tests/serve/test_serve.py",
    "tests/memory/test_memory_vector_exact.py",
    "tests/engine/test_stop_effects.py",
)
