"""A run holding a set replays in a process with another hash seed (``PYTHONHASHSEED``).

A python tool returns a set of strings. The worker's ``StepOutcome`` (a
dataclass) holds it, and its journaled form listed the set in the order of
the recording process's string hashes: ``replay --verify`` in another
process diverged at the worker's exit, and a ``serve`` restarted with the run
waiting on a later ``signal.wait`` step failed the run when it recovered
it. Here the run is recorded by one ``serve`` (seed 1), recovered by the
next (seed 2) and verified by the CLI (seeds 3 and 4): real processes, the
tool imported as a user's module.

A set of tuples as a plan's output (in the planner's result, a dict) was
sorted by the repr of its packed tuples, which names their addresses: no
replay, in any process, verified it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from process_support import serve_argv, terminate, wait_for

from tiffany.config import ENV_PREFIX

TOOLS = """\
from tiffany import python_tool


@python_tool("test.word_set")
def word_set() -> set[str]:
    return {f"w{i}" for i in range(20)}


@python_tool("test.pair_set")
def pair_set() -> set[tuple[str, int]]:
    return {(f"w{i}", i) for i in range(8)}
"""

PLAN = {
    "name": "word-set",
    "steps": [
        {"id": "words", "tool": "python", "args": {"function": "test.word_set"}},
        {
            "id": "go",
            "tool": "signal.wait",
            "args": {"name": "go", "timeout_s": 3600},
            "after": ["words"],
        },
    ],
    "outputs": {"words": "${steps.words.output}"},
}

WORDS = sorted(f"w{i}" for i in range(20))


def _env(cwd: Path, seed: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return env | {"PYTHONHASHSEED": str(seed), "PYTHONPATH": str(cwd), "TIFFANY_LOG_FORMAT": "json"}


def _cli(cwd: Path, data: Path, seed: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``tiffany --data-dir DATA ARGS`` in ``cwd`` under hash seed ``seed``."""
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data), *args],
        cwd=cwd,
        env=_env(cwd, seed),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _serve(cwd: Path, data: Path, seed: int) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        serve_argv(data, 0, "--import", "seedtools"),
        cwd=cwd,
        stdout=(cwd / f"serve-{seed}.log").open("ab"),
        stderr=subprocess.STDOUT,
        env=_env(cwd, seed),
    )
    ready = data / "serve.json"
    wait_for(lambda: ready.exists() or proc.poll() is not None, 90, "serve.json")
    assert proc.poll() is None, (cwd / f"serve-{seed}.log").read_text()[-3000:]
    url = str(json.loads(ready.read_text())["url"]).rstrip("/")
    wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, 60, "readyz")
    return proc, url


def _run(url: str, run_id: str, min_seq: int | None = None) -> dict[str, Any]:
    params = {} if min_seq is None else {"min_seq": min_seq}
    r = httpx.get(f"{url}/api/runs/{run_id}", params=params, timeout=30)
    r.raise_for_status()
    return dict(r.json())


def _step(run: dict[str, Any], step_id: str) -> dict[str, Any]:
    return next(s for s in run["steps"] if s["step_id"] == step_id)


@pytest.fixture
def cwd() -> Iterator[Path]:
    """A user's directory with a short path (the engine's Unix socket lives under it)."""
    path = Path(tempfile.mkdtemp(prefix="tfh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_run_holding_a_set_recovers_and_verifies_under_other_hash_seeds(cwd: Path) -> None:
    (cwd / "seedtools.py").write_text(TOOLS)
    data = cwd / "d"
    proc, url = _serve(cwd, data, seed=1)
    try:
        r = httpx.post(url + "/api/runs", json={"plan": PLAN}, timeout=30)
        assert r.status_code == 201, r.text
        run_id, seq = r.json()["run_id"], r.json()["seq"]
        waiting = wait_for(
            lambda: _step(_run(url, run_id, seq), "go")["waiting"], 60, "the go step to wait"
        )
        assert waiting == "signal go"
    finally:
        stopped = terminate(proc)
    assert stopped == 0  # the run is left in flight, waiting for its signal
    # Another serve, another seed: it recovers the run (replaying the words step) ...
    proc, url = _serve(cwd, data, seed=2)
    try:
        r = httpx.post(f"{url}/api/runs/{run_id}/signals/go", json={"by": "test"}, timeout=60)
        assert r.status_code == 202, (r.text, _run(url, run_id).get("error"))
        run = wait_for(
            lambda: (d := _run(url, run_id, r.json()["seq"]))["status"] != "running" and d,
            60,
            "the run to finish",
        )
    finally:
        terminate(proc)
    log = (cwd / "serve-2.log").read_text()
    assert run["status"] == "succeeded", (run.get("error"), log[-3000:])
    assert run["outputs"] == {"words": WORDS}
    assert _step(run, "go")["output"] == {"by": "test"}
    # ... and the whole run verifies in processes with other seeds still.
    for seed in (3, 4):
        verify = _cli(cwd, data, seed, "replay", run_id, "--verify", "--json")
        assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
        assert json.loads(verify.stdout)["ok"] is True


def test_a_plan_whose_output_is_a_set_of_pairs_verifies_in_any_process(tmp_path: Path) -> None:
    (tmp_path / "seedtools.py").write_text(TOOLS)
    plan = tmp_path / "pairs.json"
    step = {"id": "pairs", "tool": "python", "args": {"function": "test.pair_set"}}
    plan.write_text(
        json.dumps(
            {"name": "pairs", "steps": [step], "outputs": {"pairs": "${steps.pairs.output}"}}
        )
    )

    def cli(seed: int, *args: str) -> subprocess.CompletedProcess[str]:
        return _cli(tmp_path, tmp_path / "d", seed, *args)

    run = cli(1, "run", str(plan), "--json", "--import", "seedtools")
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["outputs"] == {"pairs": [[f"w{i}", i] for i in range(8)]}
    for seed in (1, 2):
        verify = cli(seed, "replay", out["run_id"], "--verify", "--json")
        assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
        assert json.loads(verify.stdout)["ok"] is True
