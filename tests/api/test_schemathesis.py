"""Schemathesis, every check, against a live server: what the schema says is what it does.

A real engine process and the API under uvicorn on 127.0.0.1 with a bearer
token; the ``schemathesis`` CLI runs as a user would run it, with every
check (``--checks all``: status codes, content types, response headers and
schemas, schema-valid data taken, schema-invalid data refused, unsupported
methods and their ``Allow``, auth ignored, resources after deletion...) and
every phase (examples, coverage, fuzzing, stateful). The refusals no schema
can state (a plan's unknown tool, a ``min_seq`` beyond the journal...) are
listed, with why, in ``schemathesis_hooks.py``; its settings are in
``schemathesis.toml``.

Deterministic: a fixed seed, no example database. Three runs, each well
under a minute on two loaded cores: the coverage phase (the bulk) of a
submission, that of every other operation, then the examples, fuzzing and
stateful phases of all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import clean_env, make_settings, serve_in_thread, short_dir, start_engine

from tiffany.wire import control

HERE = Path(__file__).resolve().parent
TOKEN = "schemathesis-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: The seed of every run (the same cases each time).
SEED = 1
#: Cases per operation in the fuzzing phase (coverage's are the schema's own).
MAX_EXAMPLES = 10
#: How long one CLI run may take at most, in seconds (it takes 10 to 45 on two loaded cores).
RUN_TIMEOUT_S = 240

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Any, str]]:
    data_dir = short_dir("tfst-")
    engine = start_engine(data_dir)
    live = serve_in_thread(make_settings(data_dir, api_token=TOKEN))
    try:
        yield engine, live.base
    finally:
        live.stop()
        engine.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def _schemathesis(
    base: str, phases: str, only: tuple[str, ...], workdir: Path
) -> subprocess.CompletedProcess[str]:
    """Run the CLI over the served schema (its crash store in ``workdir``, not the repo)."""
    env = clean_env() | {
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file", str(HERE / "schemathesis.toml"),
        "--no-color",
        "run", f"{base}/openapi.json",
        "--checks", "all",
        # Replaced by the hooks' positive_data_taken (the same, less the listed refusals).
        "--exclude-checks", "positive_data_acceptance",
        "--header", f"Authorization: Bearer {TOKEN}",
        "--phases", phases,
        *only,
        "--seed", str(SEED),
        "--max-examples", str(MAX_EXAMPLES),
        "--generation-database", "none",
        "--workers", "1",
        "--request-timeout", "30",
    ]  # fmt: skip
    return subprocess.run(
        argv,
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


SUBMIT = "submit_run_api_runs_post"
#: The runs: coverage in two (a submission's cases are half of them), then the rest.
RUNS = {
    "coverage-submit": ("coverage", ("--include-operation-id", SUBMIT)),
    "coverage-others": ("coverage", ("--exclude-operation-id", SUBMIT)),
    "examples-fuzzing-stateful": ("examples,fuzzing,stateful", ()),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_every_check_passes_against_a_live_server(
    served: tuple[Any, str], name: str, tmp_path: Path
) -> None:
    engine, base = served
    phases, only = RUNS[name]
    before = int(control.call(engine.data_dir, "status")["durable_seq"])
    run = _schemathesis(base, phases, only, tmp_path)
    assert run.returncode == 0, run.stdout[-20_000:] + run.stderr[-5_000:]
    summary = run.stdout[run.stdout.find("SUMMARY") :]
    schema = httpx.get(f"{base}/openapi.json", headers=AUTH, timeout=30).json()
    operations = sum(len(methods) for methods in schema["paths"].values())
    tested = {"coverage-submit": 1, "coverage-others": operations - 1}.get(name, operations)
    assert f"Tested: {tested}" in summary, summary  # every operation asked for, none skipped
    cases = re.search(r"(\d+) generated, (\d+) passed", summary)
    assert cases is not None, summary
    assert int(cases[1]) == int(cases[2]) > tested, summary
    if name == "coverage-submit":  # it reached the engine: schema-valid submissions were journaled
        assert int(control.call(engine.data_dir, "status")["durable_seq"]) > before


# -- what it found, pinned ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({"retries": True}, "retries"),
        ({"backoff": "1.5"}, "backoff"),
        ({"continue_on_error": 1}, "continue_on_error"),
        ({"dynamic": "true"}, "dynamic"),
    ],
)
def test_a_plan_field_of_another_json_type_is_refused(
    served: tuple[Any, str], step: dict[str, Any], field: str
) -> None:
    """The engine took them (pydantic's lax mode: ``true`` as 1, ``"1.5"`` as 1.5)
    though the schema says integer, number, boolean: negative_data_rejection found it."""
    engine, base = served
    plan = {
        "name": "typed",
        "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}, **step}],
    }
    before = int(control.call(engine.data_dir, "status")["durable_seq"])
    r = httpx.post(f"{base}/api/runs", json={"plan": plan}, headers=AUTH, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "plan.invalid"
    assert r.json()["detail"][0]["loc"] == ["steps", 0, field]
    assert int(control.call(engine.data_dir, "status")["durable_seq"]) == before
