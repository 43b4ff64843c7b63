"""Per-tool rate limits: the GCRA schedule, the setting's errors, and a real run's effects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tiffany.agents.rate_limits import RateLimiter
from tiffany.config import parse_rate_limits


def test_a_burst_of_n_then_one_an_interval_in_the_order_asked() -> None:
    now = [100.0]
    limiter = RateLimiter({"llm": (2, 1.0)}, lambda name: name, lambda: now[0])
    call = SimpleNamespace(name="llm")
    assert [limiter.admit(call) for _ in range(5)] == [0.0, 0.0, 0.5, 1.0, 1.5]
    assert limiter.admit(SimpleNamespace(name="http")) == 0.0  # not limited
    now[0] = 110.0  # long after: the bucket is full again
    assert [limiter.admit(call) for _ in range(3)] == [0.0, 0.0, 0.5]
    assert limiter.delayed == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("llm=60", "is not TOOL=N/UNIT"),
        ("llm=60/day", "is not TOOL=N/UNIT"),
        ("llm=x/s", "is not a whole number"),
        ("llm=0/s", "above 0"),
    ],
)
def test_a_bad_setting_names_the_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rate_limits(text)
    assert parse_rate_limits(" llm=60/min, http=20/s ") == {"llm": (60, 60.0), "http": (20, 1.0)}


def test_a_limited_tool_s_effects_are_spaced_by_the_limit(tmp_path: Path) -> None:
    steps = [
        {"id": f"s{i}", "tool": "file.write", "args": {"path": f"f{i}", "content": "x"}}
        for i in range(6)
    ]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"name": "fan", "steps": steps}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env["TIFFANY_RATE_LIMITS"] = "file.write=2/s"
    data = tmp_path / "d"
    done = subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data), "run", "--json", str(plan)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = json.loads(done.stdout)["run_id"]
    written = sorted((data / "workspaces" / run_id / f"f{i}").stat().st_mtime for i in range(6))
    # Two at once, then one every half second: the sixth at least 2 s after the first.
    assert written[1] - written[0] < 0.4
    for i in range(2, 6):
        assert written[i] - written[0] >= (i - 1) * 0.5 - 0.05, written
