"""examples/code-agent: the agent loop against its mock model, approved, then replayed without it.

The mock model (``examples/code-agent/mock_model.py``) is a real HTTP server
in a subprocess; ``tiffany run`` reaches it through ``TIFFANY_LLM_BASE_URL``
as it would a real endpoint. The replays run after it is stopped, with no
model configured at all: they pass only because the replies are journaled.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from process_support import terminate, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk"))
from sdk_support import serve, short_dir

from tiffany.sdk import Client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "code-agent"
TASK = "task=write add() in calc.py and check it"
APPROVE = 'approve={"approved": true, "by": "ann"}'


class MockModel:
    """The example's mock model, serving on a free port until stopped."""

    def __init__(self, log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(EXAMPLE / "mock_model.py"), "--port", "0"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        line = wait_for(self._listening, 60, "the mock model's 'listening on' line")
        self.port = int(line.split()[-1])

    def _listening(self) -> str | None:
        assert self.proc.poll() is None, self.log.read_text()
        lines = self.log.read_text().splitlines()
        return next((s for s in lines if s.startswith("listening")), None)

    @property
    def calls(self) -> int:
        return sum(1 for s in self.log.read_text().splitlines() if s.startswith("call "))

    def stop(self) -> None:
        terminate(self.proc)


@pytest.fixture
def model(tmp_path: Path) -> Iterator[MockModel]:
    mock = MockModel(tmp_path / "mock-model.log")
    try:
        yield mock
    finally:
        mock.stop()


def _tiffany(
    *args: str, data_dir: Path, cwd: Path = EXAMPLE, llm_port: int | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.pop("PYTHONPATH", None)
    if llm_port is not None:
        env["TIFFANY_LLM_BASE_URL"] = f"http://127.0.0.1:{llm_port}"
        env["TIFFANY_LLM_MODEL"] = "mock"
    return subprocess.run(
        [sys.executable, "-m", "tiffany", *args, "--data-dir", str(data_dir)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_code_agent_runs_against_the_model_and_replays_without_it(
    tmp_path: Path, model: MockModel
) -> None:
    data_dir = tmp_path / "data"
    ran = _tiffany(
        "run", "agent:code_agent", "--input", TASK, "--signal", APPROVE, "--json",
        data_dir=data_dir, llm_port=model.port,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded", result
    outputs = result["outputs"]
    assert outputs["answer"] == "calc.py defines add(a, b), written and read back."
    assert outputs["approved_by"] == "ann"
    assert [c["tool"] for c in outputs["calls"]] == ["file.write", "file.read"]
    calc = data_dir / "workspaces" / result["run_id"] / "calc.py"
    assert calc.read_text() == "def add(a, b):\n    return a + b\n"
    assert model.calls == 3  # one model call a turn: write, read, answer

    model.stop()
    assert _refused(model.port)  # no model from here on, and none configured
    run_id = result["run_id"]
    verified = _tiffany("replay", run_id, "--verify", "--import", "agent", "--json",
                        data_dir=data_dir)  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] is True
    assert report["divergence"] is None
    assert report["status"] == "succeeded"

    # The run as a CI fixture: exported to one file, replayed by the CLI and by the pytest helper.
    fixture = tmp_path / "code-agent.tfx"
    exported = _tiffany("export", run_id, "-o", str(fixture), data_dir=data_dir)
    assert exported.returncode == 0, exported.stderr
    from_file = _tiffany("replay", str(fixture), "--verify", "--import", "agent", "--json",
                         data_dir=tmp_path / "elsewhere")  # fmt: skip
    assert from_file.returncode == 0, from_file.stdout + from_file.stderr
    assert json.loads(from_file.stdout)["ok"] is True
    helper = subprocess.run(
        [sys.executable, "-c",
         "import sys; from tiffany.testing import replay_file; "
         "r = replay_file(sys.argv[1], imports=['agent']); print(r.ok, r.status, r.dispatches)",
         str(fixture)],
        cwd=EXAMPLE, capture_output=True, text=True, timeout=180,
        env={k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")},
    )  # fmt: skip
    assert helper.returncode == 0, helper.stdout + helper.stderr
    last = helper.stdout.splitlines()[-1].split()
    assert last == ["True", "succeeded", str(report["dispatches"])]


def test_a_changed_agent_fails_the_replay_of_the_recorded_run_naming_its_line(
    tmp_path: Path, model: MockModel
) -> None:
    data_dir = tmp_path / "data"
    ran = _tiffany(
        "run", "agent:code_agent", "--input", TASK, "--signal", APPROVE, "--json",
        data_dir=data_dir, llm_port=model.port,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = json.loads(ran.stdout.strip().splitlines()[-1])["run_id"]
    model.stop()
    changed = tmp_path / "changed"
    changed.mkdir()
    source = (EXAMPLE / "agent.py").read_text()
    assert "timeout_s=86_400" in source
    (changed / "agent.py").write_text(source.replace("timeout_s=86_400", "timeout_s=3_600"))
    fixture = tmp_path / "code-agent.tfx"
    assert _tiffany("export", run_id, "-o", str(fixture), data_dir=data_dir).returncode == 0
    replayed = _tiffany("replay", str(fixture), "--verify", "--import", "agent", "--json",
                        data_dir=tmp_path / "elsewhere", cwd=changed)  # fmt: skip
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    divergence = json.loads(replayed.stdout)["divergence"]
    assert "signal:approve" in json.dumps(divergence)
    assert f"{changed / 'agent.py'}:" in json.dumps(divergence)


def test_a_refused_approval_ends_the_run_before_any_change(
    tmp_path: Path, model: MockModel
) -> None:
    data_dir = tmp_path / "data"
    ran = _tiffany(
        "run", "agent:code_agent", "--input", TASK,
        "--signal", 'approve={"approved": false, "by": "bob"}', "--json",
        data_dir=data_dir, llm_port=model.port,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded", result
    assert result["outputs"] == {"answer": None, "calls": [], "refused_by": "bob"}
    assert not (data_dir / "workspaces" / result["run_id"] / "calc.py").exists()
    assert model.calls == 1  # the model proposed the write; nothing after the refusal


def test_on_a_server_the_run_waits_for_the_human_and_the_form_refuses_a_bad_answer(
    tmp_path: Path, model: MockModel
) -> None:
    cwd = short_dir("tfca-")
    shutil.copy(EXAMPLE / "agent.py", cwd / "agent.py")
    llm = {"TIFFANY_LLM_BASE_URL": f"http://127.0.0.1:{model.port}", "TIFFANY_LLM_MODEL": "mock"}
    served = serve(cwd, "--import", "agent", env_extra=llm)
    try:
        with Client(served.url) as client:
            handle = client.submit(workflow="code-agent", inputs={"task": TASK.split("=", 1)[1]})
            run_id = handle.run_id
            wait_for(lambda: client.get(run_id).status == "waiting", 90, "the approval wait")
            assert model.calls == 1  # the model proposed the write; it waits for the human
            url = f"{served.url}/api/runs/{run_id}/signals/approve"
            bad = httpx.post(url, json={"approved": "yes", "by": "ann"})
            assert bad.status_code == 422, bad.text
            assert "approved" in bad.text
            handle.signal("approve", {"approved": True, "by": "ann"})
            done = handle.wait(timeout=90)
            assert done.status == "succeeded", done
            assert done.outputs["approved_by"] == "ann"
            assert [c["tool"] for c in done.outputs["calls"]] == ["file.write", "file.read"]
            exported = client.export(run_id)
    finally:
        served.stop()
    assert model.calls == 3
    model.stop()
    fixture = tmp_path / "served-run.tfx"
    fixture.write_bytes(exported)
    replayed = _tiffany("replay", str(fixture), "--verify", "--import", "agent", "--json",
                        data_dir=tmp_path / "elsewhere")  # fmt: skip
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert json.loads(replayed.stdout)["ok"] is True
