"""The engine's verifier: golden journals replayed in its process pool (real worker processes)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiffany.config import Settings
from tiffany.engine.verifier import Verifier
from tiffany.errors import EngineNotReady, Refusal, RunNotFound, VerifyTimedOut

TESTS = Path(__file__).resolve().parent.parent
GOLDEN = TESTS / "data" / "golden"
# The golden runs' code (durable_workloads) is imported by the worker: it
# inherits this sys.path (forkserver preparation data).
if str(TESTS / "durable") not in sys.path:
    sys.path.insert(0, str(TESTS / "durable"))


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    for name in ("fan_in", "nondeterministic"):
        shutil.copytree(GOLDEN / name, tmp_path / name)
    return tmp_path


@pytest.fixture
def verifier_for(golden: Path) -> Iterator[dict[str, Verifier]]:
    made: dict[str, Verifier] = {}
    for name in ("fan_in", "nondeterministic"):
        made[name] = Verifier(Settings(data_dir=golden / name))
    yield made
    for v in made.values():
        v.close()


def test_an_identical_replay_reports_ok_and_a_divergence_names_it(
    verifier_for: dict[str, Verifier],
) -> None:
    report = verifier_for["fan_in"].verify("golden-fan_in")
    assert report["ok"] is True
    assert report["status"] == "succeeded"
    assert report["dispatches"] > 0
    assert report["divergence"] is None

    bad = verifier_for["nondeterministic"].verify("golden-nondeterministic")
    assert bad["ok"] is False
    assert bad["divergence"]["run_id"] == "golden-nondeterministic"
    assert bad["divergence"]["expected"] != bad["divergence"]["actual"]


def test_an_unknown_run_is_404(verifier_for: dict[str, Verifier]) -> None:
    with pytest.raises(Refusal) as err:
        verifier_for["fan_in"].verify("run-nope")
    assert isinstance(err.value, RunNotFound)


def test_a_replay_past_the_timeout_is_504_and_the_next_verify_works(
    verifier_for: dict[str, Verifier],
) -> None:
    verifier = verifier_for["fan_in"]
    verifier.timeout_s = 0.001  # a worker cannot even start in a millisecond
    with pytest.raises(Refusal) as err:
        verifier.verify("golden-fan_in")
    assert isinstance(err.value, VerifyTimedOut)
    verifier.timeout_s = 120.0
    assert verifier.verify("golden-fan_in")["ok"] is True


def test_a_closed_verifier_refuses_with_503(verifier_for: dict[str, Verifier]) -> None:
    verifier = verifier_for["fan_in"]
    verifier.close()
    with pytest.raises(Refusal) as err:
        verifier.verify("golden-fan_in")
    assert isinstance(err.value, EngineNotReady)


def test_a_worker_keeps_no_secret_of_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from tiffany.engine import verifier

    monkeypatch.setenv("TIFFANY_LLM_API_KEY", "sk-engine-only")
    monkeypatch.setenv("TIFFANY_API_TOKEN", "api-only")
    monkeypatch.setenv("TIFFANY_DATA_DIR", "/kept")
    monkeypatch.setattr("tiffany.log.configure_logging", lambda settings: None)
    v = Verifier(Settings(api_token="t", llm_api_key="k"))  # type: ignore[arg-type]
    assert v.settings.api_token is None
    assert v.settings.llm_api_key is None
    verifier._init_worker(v.settings, os.getpid())  # what each worker process runs first
    assert "TIFFANY_LLM_API_KEY" not in os.environ
    assert "TIFFANY_API_TOKEN" not in os.environ
    assert os.environ["TIFFANY_DATA_DIR"] == "/kept"


_HOLDER = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {durable!r})
from tiffany.config import Settings
from tiffany.engine.verifier import Verifier

def children(pid):
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out

v = Verifier(Settings(data_dir={data!r}))
v.verify({run!r})
kids = children(os.getpid())
print(json.dumps(kids + [g for k in kids for g in children(k)]), flush=True)
time.sleep(600)
"""


def test_a_kill_9_of_the_engine_leaves_no_verify_process_behind(golden: Path) -> None:
    """The fork server and its worker exit with the engine, however it dies."""
    import json
    import os
    import signal
    import subprocess
    import time

    from tiffany.durable import scan

    data = golden / "fan_in"
    run = next(iter(scan(data / "wal").runs))
    code = _HOLDER.format(durable=str(TESTS / "durable"), data=str(data), run=run)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    pids = json.loads(line)
    assert len(pids) >= 2, line  # the fork server and a worker
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists()]
        time.sleep(0.05)
    assert alive == [], f"left behind: {alive}"
