"""The soak's workload: what each run is, what it must do, and the mock model agents call.

Eight kinds of run, drawn uniformly by a seeded ``random.Random``:

* the fault suite's four mixed plans (``fault_support.mixed_plan``: fan-out,
  chain, retry with a flaky step, sleeps);
* ``wide``: 8 to 12 effects at once that hold a thread 0.3-1 s each, then
  one more: the engine's thread pool (8 threads) has jobs queued most of the
  time, so a stop finds some queued (a stopping engine must not start them);
  the harness submits a wider one (``burst``, 32 effects of 1 s) right
  before each SIGTERM and SIGSTOP, and stops the engine once it runs;
* ``signal``: an effect, two ``signal.wait`` steps on the same name ``go``,
  an effect. The harness sends two signals with Idempotency-Keys, the first
  right after the 201 (before the wait: it is kept), the same first one a
  second time (one journal record: the second wait must get the second
  payload), the second one later. Outputs: ``{"a": first, "b": second}``;
* ``subplan``: a ``plan.run`` step with an inline child plan (a chain of
  effects, tagged ``<tag>c``), then an effect. Outputs: the child's. For
  some of them the harness also sends a forged ``child:<child run id>``
  signal, an internal name, which must be refused (never journaled);
* ``agent``: an ``agent`` step whose model (:class:`MockModel`) calls the
  ``python`` tool twice (``fault.effect`` steps ``ag1``, ``ag2``), then
  answers ``done <tag>``; then an effect.

Each comes as a :class:`Work`: the plan, the effect steps each tag must
show, the outputs the run must end with (None: not checked), the signals to
send. Schedules (:data:`SCHEDULES`) tick every one to five seconds, each
with another catch-up policy.
"""

from __future__ import annotations

import http.server
import json
import random  # noqa: TID251 - the harness picks plans, not task code
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fault_support import PLAN_KINDS, effect_args, effect_steps, mixed_plan

KINDS = (*PLAN_KINDS, "wide", "signal", "subplan", "agent")
#: The run the harness submits right before a SIGTERM or a SIGSTOP: :data:`BURST_WIDTH`
#: effects that hold a thread :data:`BURST_JOB_S` each, so the engine's 8 pool threads
#: have jobs queued for 3 s (serve stops its API first: most often in under a second).
BURST = "burst"
BURST_WIDTH = 32
BURST_JOB_S = 1.0

#: ``(cron, catchup)`` of the soak's schedules: every 1, 3 and 5 seconds.
SCHEDULES = (("* * * * * *", "all"), ("* * * * * */3", "skip"), ("* * * * * */5", "one"))
#: The plan every tick runs.
TICK_PLAN: dict[str, Any] = {
    "name": "soak-tick",
    "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.1}}],
}


@dataclass
class Work:
    """One run the harness submits, and what it must do.

    Attributes:
        tag: Its ``tag`` input (unique).
        kind: One of :data:`KINDS`.
        plan: The plan.
        effects: ``tag -> effect steps`` it must run (a child run has a tag of its own).
        outputs: The outputs it must end with (None: any).
        signals: ``(idempotency key, payload)`` to send as ``go``, in order.
        child_step: The ``plan.run`` step (its child's id is ``<run>.<step>.1``).
        forge: Send a forged ``child:`` signal to it.
    """

    tag: str
    kind: str
    plan: dict[str, Any]
    effects: dict[str, set[str]]
    outputs: Any = None
    signals: list[tuple[str, Any]] = field(default_factory=list)
    child_step: str | None = None
    forge: bool = False


def _chain(eff: Path, rng: random.Random, n: int) -> tuple[list[dict[str, Any]], int]:
    """``n`` effects in a chain (``c0``...); the last one's value (each doubles plus one)."""
    steps: list[dict[str, Any]] = []
    value = 1
    for i in range(n):
        arg: Any = 1 if i == 0 else f"${{steps.c{i - 1}.output.value}}"
        step: dict[str, Any] = {
            "id": f"c{i}",
            "tool": "python",
            "args": effect_args(eff, f"c{i}", arg, round(rng.uniform(0.1, 0.4), 3)),
        }
        if i:
            step["after"] = [f"c{i - 1}"]
        steps.append(step)
        value = value * 2 + 1
    return steps, value


def make_work(kind: str, tag: str, rng: random.Random, eff: Path) -> Work:
    """A run of ``kind`` tagged ``tag`` (sleeps and widths drawn from ``rng``)."""
    if kind in PLAN_KINDS:
        plan = mixed_plan(kind, rng, eff)
        return Work(tag, kind, plan, {tag: effect_steps(plan)})
    if kind in ("wide", BURST):
        width = rng.randint(8, 12) if kind == "wide" else BURST_WIDTH
        steps: list[dict[str, Any]] = [
            {
                "id": f"w{i}",
                "tool": "python",
                "args": effect_args(
                    eff,
                    f"w{i}",
                    i,
                    round(rng.uniform(0.3, 1.0), 3) if kind == "wide" else BURST_JOB_S,
                ),
            }
            for i in range(width)
        ]
        after = [s["id"] for s in steps]
        steps.append(
            {"id": "join", "tool": "python", "args": effect_args(eff, "join"), "after": after}
        )
        plan = {"name": "soak-wide", "inputs": {"tag": ""}, "steps": steps}
        return Work(tag, kind, plan, {tag: {s["id"] for s in steps}})
    if kind == "signal":
        pre = effect_args(eff, "pre", 1, round(rng.uniform(0.2, 0.8), 3))
        plan = {
            "name": "soak-signal",
            "inputs": {"tag": ""},
            "steps": [
                {"id": "pre", "tool": "python", "args": pre},
                {"id": "w1", "tool": "signal.wait", "args": {"name": "go"}, "after": ["pre"]},
                {"id": "w2", "tool": "signal.wait", "args": {"name": "go"}, "after": ["w1"]},
                {"id": "post", "tool": "python", "args": effect_args(eff, "post"), "after": ["w2"]},
            ],
            "outputs": {"a": "${steps.w1.output}", "b": "${steps.w2.output}"},
        }
        first, second = {"tag": tag, "n": 1}, {"tag": tag, "n": 2}
        return Work(
            tag,
            kind,
            plan,
            {tag: {"pre", "post"}},
            outputs={"a": first, "b": second},
            signals=[(f"{tag}-1", first), (f"{tag}-2", second)],
        )
    if kind == "subplan":
        steps, end = _chain(eff, rng, rng.randint(2, 3))
        child = {
            "name": "soak-child",
            "inputs": {"tag": ""},
            "steps": steps,
            "outputs": {"end": f"${{steps.c{len(steps) - 1}.output.value}}"},
        }
        plan = {
            "name": "soak-subplan",
            "inputs": {"tag": ""},
            "steps": [
                {
                    "id": "sub",
                    "tool": "plan.run",
                    "args": {"plan": child, "inputs": {"tag": "${inputs.tag}c"}},
                },
                {
                    "id": "after",
                    "tool": "python",
                    "args": effect_args(eff, "after", "${steps.sub.output.end}"),
                    "after": ["sub"],
                },
            ],
            "outputs": {"child": "${steps.sub.output}"},
        }
        effects = {tag: {"after"}, f"{tag}c": {s["id"] for s in steps}}
        return Work(
            tag,
            kind,
            plan,
            effects,
            outputs={"child": {"end": end}},
            child_step="sub",
            forge=rng.random() < 0.5,
        )
    if kind == "agent":
        goal = {"goal": "soak tag=${inputs.tag}", "tools": ["python"], "max_turns": 4}
        plan = {
            "name": "soak-agent",
            "inputs": {"tag": ""},
            "steps": [
                {"id": "a", "tool": "agent", "args": goal},
                {
                    "id": "after",
                    "tool": "python",
                    "args": effect_args(eff, "after"),
                    "after": ["a"],
                },
            ],
            "outputs": {"answer": "${steps.a.output.answer}"},
        }
        return Work(
            tag, kind, plan, {tag: {"ag1", "ag2", "after"}}, outputs={"answer": f"done {tag}"}
        )
    raise ValueError(f"unknown kind {kind!r}")


class MockModel:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 (``/v1/chat/completions``).

    Reads the tag from the goal (``tag=<tag>``); while the conversation has
    fewer than two assistant messages it asks for one ``python`` call of
    ``fault.effect`` (step ``ag<turn>``, tagged, in ``eff``), then answers
    ``done <tag>``. The reply depends on the conversation only, so a replay
    or a resumed agent sees the same model.

    Args:
        eff: The effects directory the calls write to.
    """

    def __init__(self, eff: Path) -> None:
        self.calls = 0
        self.errors = 0
        lock = threading.Lock()
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length))
                    goal = next(m["content"] for m in body["messages"] if m["role"] == "user")
                    tag = goal.split("tag=", 1)[1].split()[0]
                    turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
                except (ValueError, KeyError, IndexError, StopIteration):
                    with lock:
                        model.errors += 1
                    self._reply(400, {"error": "not a soak conversation"})
                    return
                with lock:
                    model.calls += 1
                if turns < 2:
                    call = {
                        "function": "fault.effect",
                        "kwargs": {"dir": str(eff), "tag": tag, "step": f"ag{turns + 1}"},
                    }
                    message: dict[str, Any] = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call{turns + 1}",
                                "type": "function",
                                "function": {"name": "python", "arguments": json.dumps(call)},
                            }
                        ],
                    }
                else:
                    message = {"role": "assistant", "content": f"done {tag}"}
                usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
                self._reply(
                    200,
                    {
                        "model": "soak-mock",
                        "choices": [{"index": 0, "message": message}],
                        "usage": usage,
                    },
                )

            def _reply(self, status: int, doc: Any) -> None:
                out = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
