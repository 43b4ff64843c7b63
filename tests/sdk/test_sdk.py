"""The Python SDK against a real ``tiffany serve`` on loopback (no mocks).

The acceptance test goes from a fresh data dir to a plan calling the user's
own python function, served with ``--import``, submitted through
:class:`tiffany.Client` by a user's script run as its own process, waited
on, and its outputs read: in under 20 lines of user code. The others drive
every method of ``Client`` and ``AsyncClient`` against the shared server of
``conftest.py`` (its ``usertools`` module registers ``word_count`` and
``must_be_even``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from process_support import terminate, wait_for
from sdk_support import CuttingFront, Served, clean_env, free_port, serve, short_dir

from tiffany import AsyncClient, Client
from tiffany.sdk import (
    Conflict,
    ConnectionFailed,
    Event,
    InvalidRequest,
    NotFound,
    RunDetail,
    Unauthorized,
    WaitingFor,
    WaitTimeout,
    protocol,
)
from tiffany.sdk.aclient import _close_feed as _aclose_feed

#: The acceptance test's user code: a tool module and a script (nothing else).
USER_MODULE = """\
from tiffany import python_tool

@python_tool("word_count")
def word_count(text: str) -> dict:
    return {"words": len(text.split())}
"""
USER_SCRIPT = """\
from tiffany import Client

plan = {
    "name": "count",
    "inputs": {"text": "hello durable world"},
    "steps": [{"id": "count", "tool": "python",
               "args": {"function": "word_count", "kwargs": {"text": "${inputs.text}"}}}],
    "outputs": {"words": "${steps.count.output.words}"},
}
run = Client("http://127.0.0.1:8000").submit(plan)
print(run.wait(timeout=60).outputs)     # {'words': 3}
"""


def _code_lines(*sources: str) -> int:
    return sum(1 for src in sources for line in src.splitlines() if line.strip())


def _python(function: str, **kwargs: Any) -> dict[str, Any]:
    return {"tool": "python", "args": {"function": function, "kwargs": kwargs}}


def _plan(name: str, *steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "steps": list(steps), **extra}


COUNT = _plan(
    "count",
    {"id": "count", **_python("word_count", text="${inputs.text}")},
    inputs={"text": "one two three"},
    outputs={"words": "${steps.count.output.words}"},
)
NAP = _plan("nap", {"id": "nap", "tool": "sleep", "args": {"seconds": 60}})
APPROVE = _plan(
    "approve",
    {"id": "ok", "tool": "signal.wait", "args": {"name": "approve"}},
    outputs={"by": "${steps.ok.output.by}"},
)


def test_user_code_to_outputs_through_the_sdk_in_under_20_lines() -> None:
    assert _code_lines(USER_MODULE, USER_SCRIPT) < 20
    cwd = short_dir("tfu-")
    (cwd / "mytools.py").write_text(USER_MODULE)
    assert not (cwd / "d").exists()
    served = serve(cwd, "--import", "mytools")  # a fresh data dir: cwd/d
    # The script exactly as docs/sdk.md and the README show it, but for the port.
    script = USER_SCRIPT.replace("http://127.0.0.1:8000", served.url)
    (cwd / "client.py").write_text(script)
    try:
        done = subprocess.run(
            [sys.executable, "client.py"],
            cwd=cwd,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "{'words': 3}"
    finally:
        assert served.stop() == 0, served.log()


def test_wait_polls_without_outputs_and_reads_them_once_at_the_end(server: Served) -> None:
    """A large result crosses the network once, not at every poll of a waiting client."""
    reads: list[httpx.URL] = []

    def seen(response: httpx.Response) -> None:
        if response.request.url.path.startswith("/api/runs/run-"):
            reads.append(response.request.url)

    plan = _plan(
        "slow",
        {"id": "nap", "tool": "sleep", "args": {"seconds": 1.0}},
        outputs={"slept": "${steps.nap.output.slept}"},
    )
    with (
        httpx.Client(event_hooks={"response": [seen]}) as http,
        Client(server.url, http=http) as client,
    ):
        run = client.submit(plan)
        done = client.wait(run.run_id, timeout=60)
        assert done.outputs == {"slept": 1.0}
        lean = client.get(run.run_id, outputs=False)
    assert lean.outputs is None
    assert lean.outputs_size == len('{"slept":1.0}')
    assert lean.step("nap").output is None
    assert lean.step("nap").output_size is not None
    *polls, final, _lean = reads
    assert polls
    assert all(url.params.get("outputs") == "false" for url in polls), polls
    assert "outputs" not in final.params


def test_the_async_wait_polls_without_outputs_too(server: Served) -> None:
    reads: list[httpx.URL] = []

    async def seen(response: httpx.Response) -> None:
        if response.request.url.path.startswith("/api/runs/run-"):
            reads.append(response.request.url)

    plan = _plan("slow", {"id": "nap", "tool": "sleep", "args": {"seconds": 1.0}})

    async def main() -> None:
        async with (
            httpx.AsyncClient(event_hooks={"response": [seen]}) as http,
            AsyncClient(server.url, http=http) as client,
        ):
            run = await client.submit(plan)
            done = await client.wait(run.run_id, timeout=60)
            assert done.step("nap").output == {"slept": 1.0}

    asyncio.run(main())
    *polls, final = reads
    assert polls
    assert all(url.params.get("outputs") == "false" for url in polls), polls
    assert "outputs" not in final.params


def test_submit_then_get_reads_its_own_write_and_lists_it(server: Served) -> None:
    with Client(server.url) as client:
        run = client.submit(COUNT, inputs={"text": "a b c d"})
        assert run.run_id
        assert run.seq > 0
        assert run.created
        got = client.get(run.run_id)  # no 404: read as of the submission's seq
        assert got.run_id == run.run_id
        assert got.name == "count"
        assert got.inputs == {"text": "a b c d"}
        done = run.wait(timeout=60)
        assert done.status == "succeeded"
        assert done.outputs == {"words": 4}
        assert done.step("count").output == {"words": 4}
        listed = client.list(limit=5)
        assert listed.runs[0].run_id == run.run_id  # newest first
        assert run.run_id in {r.run_id for r in client.list(status="succeeded").runs}
        # A page iterates over its runs; the list's filters: name, inputs text.
        assert [r.run_id for r in listed] == [r.run_id for r in listed.runs]
        assert len(listed) == len(listed.runs)
        assert run.run_id in {r.run_id for r in client.list(name="COUN", q="a b c d")}
        assert run.run_id not in {r.run_id for r in client.list(q="no such text anywhere")}
        assert client.records(run.run_id).records[0].type == "RUN_START"
        with pytest.raises(NotFound) as missing:
            client.get("run-does-not-exist")
        assert missing.value.status == 404
        assert missing.value.code == "run.not_found"


def test_plan_as_yaml_text_and_as_a_path_with_an_idempotency_key(
    server: Served, tmp_path: Path
) -> None:
    text = (
        "name: count\ninputs: {text: x y}\nsteps:\n"
        "  - {id: count, tool: python, args: {function: word_count, "
        "kwargs: {text: '${inputs.text}'}}}\n"
        "outputs: {words: '${steps.count.output.words}'}\n"
    )
    path = tmp_path / "count.yaml"
    path.write_text(text)
    with Client(server.url) as client:
        assert client.submit(text).wait(timeout=60).outputs == {"words": 2}
        first = client.submit(path, idempotency_key="sdk-path-1")
        again = client.submit(str(path), idempotency_key="sdk-path-1")
        assert again.run_id == first.run_id
        assert not again.created
        assert client.wait(first.run_id, timeout=60).outputs == {"words": 2}
        # A path with a typo was sent as the plan's text, and refused by the
        # server as "the plan must be an object": it is named as a file here.
        for typo in (str(tmp_path / "cuont.yaml"), "cuont.yaml", str(tmp_path)):
            with pytest.raises(ValueError, match="no file") as missing:
                client.submit(typo)
            assert repr(typo) in str(missing.value)
        # A one-line plan is still a plan.
        one_line = json.dumps(_plan("nap", {"id": "n", "tool": "sleep", "args": {"seconds": 0}}))
        assert client.submit(one_line).wait(timeout=60).status == "succeeded"


def test_cancel_and_wait_timeout(server: Served) -> None:
    with Client(server.url) as client:
        run = client.submit(NAP)
        with pytest.raises(WaitTimeout) as timed_out:
            run.wait(timeout=0.5)
        assert isinstance(timed_out.value.run, RunDetail)
        assert timed_out.value.run.status in ("pending", "running")
        assert client.cancel(run.run_id).status == "cancelling"
        assert run.wait(timeout=60).status == "cancelled"
        with pytest.raises(Conflict) as finished:
            client.cancel(run.run_id)
        assert finished.value.status == 409


def test_signal_reaches_a_waiting_step(server: Served) -> None:
    with Client(server.url) as client:
        run = client.submit(APPROVE)
        sent = client.signal(run.run_id, "approve", {"by": "ada"}, signal_id="sig-1")
        assert sent.name == "approve"
        assert sent.signal_id == "sig-1"
        assert sent.seq > run.seq
        done = run.wait(timeout=60)
        assert done.status == "succeeded"
        assert done.outputs == {"by": "ada"}
        with pytest.raises(Conflict):
            client.signal(run.run_id, "approve", {"by": "late"})


def test_a_run_waiting_for_a_signal_is_listed_as_waiting_with_what_for(server: Served) -> None:
    with Client(server.url) as client:
        run = client.submit(APPROVE)
        waiting = wait_for(
            lambda: (r := client.get(run.run_id, min_seq=run.seq)).status == "waiting" and r,
            60,
            "the run to wait",
        )
        (entry,) = waiting.waiting_for
        assert isinstance(entry, WaitingFor)
        assert (entry.kind, entry.name, entry.step) == ("signal", "approve", "ok")
        assert not waiting.finished
        page = client.list(status="waiting")
        assert page.counts["waiting"] >= 1
        assert all(r.status == "waiting" for r in page)
        (listed,) = [r for r in page if r.run_id == run.run_id]
        assert listed.waiting_for == [entry]
        client.signal(run.run_id, "approve", {"by": "ada"})
        done = run.wait(timeout=60)
        assert (done.status, done.waiting_for) == ("succeeded", [])
        assert run.run_id not in {r.run_id for r in client.list(status="waiting")}


def test_a_signal_name_or_run_id_is_one_path_segment_whatever_it_holds(server: Served) -> None:
    # "../cancel" once cancelled the run, "approve?x" was sent as "approve"
    # and "run/../../x" read another path: names went into the URL unescaped.
    with Client(server.url) as client:
        run = client.submit(APPROVE)
        for name in ("../cancel", "approve?x=1", "approve#x", "..", "a/b"):
            with pytest.raises(InvalidRequest) as bad:
                client.signal(run.run_id, name, {"by": "mallory"})
            assert bad.value.field == "path.name", name
        for run_id in (f"{run.run_id}/cancel", f"{run.run_id}?min_seq=1", ".."):
            with pytest.raises(NotFound):
                client.cancel(run_id)
        assert not client.get(run.run_id).finished  # not cancelled: it waits for approve
        client.signal(run.run_id, "approve", {"by": "ada"})
        assert run.wait(timeout=60).outputs == {"by": "ada"}


async def _async_signal_names(url: str) -> None:
    async with AsyncClient(url) as client:
        run = await client.submit(NAP)
        with pytest.raises(InvalidRequest):
            await client.signal(run.run_id, "../cancel")
        assert (await client.get(run.run_id)).status == "running"
        await client.cancel(run.run_id)


def test_async_client_escapes_a_signal_name_too(server: Served) -> None:
    asyncio.run(_async_signal_names(server.url))


def test_rerun_with_other_inputs_after_a_failure(server: Served) -> None:
    plan = _plan(
        "even",
        {"id": "count", **_python("word_count", text="a b")},
        {"id": "half", **_python("must_be_even", n="${inputs.n}"), "after": ["count"]},
        inputs={"n": 3},
        outputs={"half": "${steps.half.output.half}"},
    )
    with Client(server.url) as client:
        failed = client.submit(plan).wait(timeout=60)
        assert failed.status == "failed"
        assert "3 is odd" in json.dumps(failed.step("half").error)
        again = client.rerun(failed.run_id, inputs={"n": 8})
        assert again.run_id != failed.run_id
        done = again.wait(timeout=60)
        assert done.status == "succeeded"
        assert done.outputs == {"half": 4}
        with pytest.raises(InvalidRequest) as bad:
            client.rerun(failed.run_id, from_step="nope")
        assert bad.value.status == 422


def test_a_failed_python_step_shows_its_users_traceback_over_http_and_the_cli(
    server: Served,
) -> None:
    """The API, and `tiffany status RUN --url`, gave the exception's type and message only."""
    plan = _plan("odd", {"id": "half", **_python("must_be_even", n=3)})
    with Client(server.url) as client:
        failed = client.submit(plan).wait(timeout=60)
    assert failed.status == "failed"
    error = failed.step("half").error
    where = str(server.cwd / "usertools.py")
    assert error["traceback"] == [
        {
            "file": where,
            "line": 12,
            "function": "must_be_even",
            "code": 'raise ValueError(f"{n} is odd")',
        }
    ]
    env = clean_env()
    proc = subprocess.run(
        [sys.executable, "-m", "tiffany", "status", failed.run_id, "--url", server.url],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "step half failed: Traceback (most recent call last):\n"
        f'  File "{where}", line 12, in must_be_even\n'
        '    raise ValueError(f"{n} is odd")\n'
    ) in proc.stderr
    assert json.loads(proc.stdout)["steps"]["half"]["error"]["traceback"] == error["traceback"]


def test_events_end_at_run_finished_and_resume_after_a_seq(server: Served) -> None:
    with Client(server.url) as client:
        run = client.submit(COUNT)
        events = list(run.events())
        assert all(isinstance(e, Event) for e in events)
        seqs = [e.seq for e in events]
        assert seqs == sorted(set(seqs))  # strictly increasing, no duplicate
        assert events[0].kind == "run.started"
        assert events[-1].kind == "run.finished"
        assert {e.run_id for e in events} == {run.run_id}
        middle = events[len(events) // 2]
        resumed = list(client.events(run.run_id, since=middle.seq))
        assert [e.seq for e in resumed] == [s for s in seqs if s > middle.seq]


def test_events_since_beyond_the_feed_raise_the_422_http_would(server: Served) -> None:
    """Not a silent feed, nor reconnects for ever: the refusal, raised at once."""
    with Client(server.url) as client:
        run = client.submit(COUNT)
        last = list(run.events())[-1].seq
        with pytest.raises(InvalidRequest) as beyond:
            next(iter(client.events(run.run_id, since=last + 10**9)))
    assert beyond.value.status == 422
    assert beyond.value.code == "feed.since_beyond"
    assert beyond.value.errors[0].loc == ("query", "since")


def test_events_resume_across_a_restart_of_the_api_process(server: Served) -> None:
    """The API process dies mid-iteration (kill -9); serve restarts it; the iterator resumes."""
    steps = [
        {"id": f"s{i}", "tool": "sleep", "args": {"seconds": 0.4}, "after": [f"s{i - 1}"]}
        for i in range(1, 6)
    ]
    steps[0].pop("after")
    with Client(server.url) as client:
        run = client.submit(_plan("steps", *steps))
        api_pid = json.loads((server.data_dir / "serve.json").read_text())["api_pid"]
        got: list[Event] = []
        for event in run.events():
            assert isinstance(event, Event)
            got.append(event)
            if len(got) == 3:
                os.kill(api_pid, signal.SIGKILL)
        seqs = [e.seq for e in got]
        assert seqs == sorted(set(seqs))
        assert got[-1].kind == "run.finished"
        assert got[-1].run_id == run.run_id
        new_pid = wait_for(
            lambda: (
                (pid := json.loads((server.data_dir / "serve.json").read_text())["api_pid"])
                != api_pid
                and pid
            ),
            30,
            "the restarted API's pid",
        )
        assert new_pid != api_pid
        assert run.wait(timeout=60).status == "succeeded"
        # Nothing lost: the same events, read again from before the first (the new
        # API process has not seen them: it catches up from the engine).
        again = client.events(run.run_id, since=seqs[0] - 1)
        assert [e.seq for e in again if isinstance(e, Event)] == seqs


def test_wait_waits_out_a_restart_of_the_whole_server() -> None:
    """``tiffany serve`` stopped and started again while a client waits on a run.

    The wait's read during the restart was refused, and ``wait`` raised
    ConnectionFailed at once (after its 0.6 s of retries), with its own
    timeout far off. It now reads the run again until the server is back.
    """
    cwd = short_dir("tfw-")
    port = free_port()
    served = serve(cwd, port=port)
    plan = _plan("approve", {"id": "ok", "tool": "signal.wait", "args": {"name": "approve"}})
    try:
        sync = Client(served.url)
        runs = [sync.submit(plan), sync.submit(plan)]
        results: dict[str, Any] = {}

        def wait_sync() -> None:
            try:
                results["sync"] = runs[0].wait(timeout=120).status
            except Exception as exc:  # the test reads it
                results["sync"] = exc

        async def wait_async() -> None:
            try:
                async with AsyncClient(served.url) as client:
                    results["async"] = (await client.wait(runs[1].run_id, timeout=120)).status
            except Exception as exc:
                results["async"] = exc

        waiters = [
            threading.Thread(target=wait_sync),
            threading.Thread(target=lambda: asyncio.run(wait_async())),
        ]
        # The waiters start once the store shows both runs: the async client did
        # not submit its run, so it has no ``min_seq`` for it, and a read
        # before the projection got there was a 404 (NotFound) under load.
        wait_for(lambda: len(sync.list(status="waiting").runs) == 2, 30, "both runs waiting")
        for waiter in waiters:
            waiter.start()
        assert terminate(served.proc) == 0, served.log()
        served = serve(cwd, port=port)  # the same data dir, port and URL
        for run in runs:
            sync.signal(run.run_id, "approve", {"by": "ada"})
        for waiter in waiters:
            waiter.join(timeout=120)
        assert results == {"sync": "succeeded", "async": "succeeded"}, results
        sync.close()
    finally:
        assert served.stop() == 0, served.log()


def test_a_feed_left_with_unread_events_closes_cleanly(server: Served) -> None:
    """Closing a feed whose unread events passed the client's queue mark is a clean close.

    The websockets client stops reading the socket while more than 16
    messages wait unread, so the server's close frame behind them went
    unread and every ``wait`` that returned with such a feed open took the
    whole 10 s close timeout and ended in 1006. The SDK takes what is
    waiting first: the handshake completes (1000).
    """
    fan = _plan("fan", *({"id": f"c{i}", **_python("word_count", text="a")} for i in range(6)))
    with Client(server.url) as client:
        run = client.submit(fan)
        assert run.wait(timeout=60).status == "succeeded"
        with contextlib.ExitStack() as stack:
            feed = client._open_feed(stack, run.run_id, since=None)
            assert feed is not None
            time.sleep(0.3)  # the run's events (more than 16) arrive, unread
        assert feed.close_code == 1000

    async def main() -> int | None:
        async with AsyncClient(server.url) as client:
            feed = await client._open_feed(run.run_id, since=None)
            assert feed is not None
            await asyncio.sleep(0.3)
            await _aclose_feed(feed)
            return feed.close_code

    assert asyncio.run(main()) == 1000


def test_async_client_does_the_same(server: Served) -> None:
    async def main() -> tuple[RunDetail, list[Any], int]:
        async with AsyncClient(server.url) as client:
            run = await client.submit(COUNT, inputs={"text": "a b c d e"})
            assert (await client.readiness())["ready"] is True
            got = await run.get()
            assert got.run_id == run.run_id
            done = await run.wait(timeout=60)
            events = [e async for e in client.events(run.run_id)]
            listed = await client.list(limit=3)
            assert listed.runs[0].run_id == run.run_id
            nap = await client.submit(NAP)
            await nap.cancel()
            assert (await nap.wait(timeout=60)).status == "cancelled"
            with pytest.raises(InvalidRequest):
                await client.submit(_plan("bad", {"id": "x", "tool": "sleep", "args": {}}))
            return done, events, len(listed.runs)

    done, events, count = asyncio.run(main())
    assert done.status == "succeeded"
    assert done.outputs == {"words": 5}
    assert events[-1].kind == "run.finished"
    assert count >= 1


def test_invalid_plan_is_an_exception_naming_the_field(server: Served) -> None:
    bad = _plan("bad", {"id": "nap", "tool": "sleep", "args": {"secondz": 1}})
    with Client(server.url) as client, pytest.raises(InvalidRequest) as raised:
        client.submit(bad)
    exc = raised.value
    assert exc.status == 422
    assert exc.code == "plan.invalid"
    assert "steps[0].args.secondz" in [e.path for e in exc.errors], exc.errors
    assert "secondz" in str(exc)
    with Client(server.url) as client, pytest.raises(InvalidRequest) as raised:
        client.submit(COUNT, inputs={"nope": 1})
    assert any("nope" in e.path for e in raised.value.errors), raised.value.errors


def test_a_token_is_sent_as_a_bearer_header() -> None:
    cwd = short_dir("tft-")
    served = serve(cwd, token="s3cret-token")
    try:
        with Client(served.url) as anonymous, pytest.raises(Unauthorized) as refused:
            anonymous.list()
        assert refused.value.status == 401
        with Client(served.url, token="wrong") as wrong, pytest.raises(Unauthorized):
            wrong.list()
        with Client(served.url, token="s3cret-token") as client:
            run = client.submit(
                _plan("nap", {"id": "n", "tool": "sleep", "args": {"seconds": 0.1}})
            )
            assert run.wait(timeout=60).status == "succeeded"
            kinds = [e.kind for e in run.events()]  # the websocket carries the header too
            assert kinds[-1] == "run.finished"
        # The feed refused for the token is the 401 it is, at once: it was
        # retried as unreachable for 30 s, then ConnectionFailed (tail: exit 5).
        for token in (None, "wrong"):
            started = time.monotonic()
            with Client(served.url, token=token) as bad, pytest.raises(Unauthorized) as refused:
                next(iter(bad.events()))
            assert time.monotonic() - started < protocol.RECONNECT_FOR_S / 3
            assert "bearer token" in refused.value.message
        with pytest.raises(Unauthorized):
            asyncio.run(_first_event(served.url, "wrong"))
    finally:
        assert served.stop() == 0, served.log()


async def _first_event(url: str, token: str) -> None:
    async with AsyncClient(url, token=token) as client:
        async for _ in client.events():
            return


def test_a_keyed_submission_and_a_read_are_sent_again_after_a_cut_connection(
    server: Served,
) -> None:
    """A connection cut before the answer: what cannot happen twice is sent again."""
    key = f"cut-{time.monotonic_ns()}"
    front = CuttingFront(server.url, cut=1)
    try:
        with Client(front.url) as client:
            run = client.submit(COUNT, inputs={"text": "x y"}, idempotency_key=key)
        assert front.accepted == 2  # cut, then sent again
        assert run.created
    finally:
        front.close()
    front = CuttingFront(server.url, cut=1)
    try:
        with Client(front.url) as client:
            assert client.get(run.run_id, min_seq=run.seq).run_id == run.run_id
        assert front.accepted == 2
    finally:
        front.close()
    with Client(server.url) as client:  # one run for the key: the server saw it once
        again = client.submit(COUNT, inputs={"text": "x y"}, idempotency_key=key)
        assert (again.run_id, again.created) == (run.run_id, False)


def test_a_signal_whose_answer_was_lost_is_sent_again_and_answered_once_its_run_ended(
    server: Served,
) -> None:
    """The server journaled the signal and it finished the run; the 202 never arrived.

    The SDK sends it again (it has an id): the run has ended by then, and the
    answer is the first delivery's, not a 409.
    """
    approval = {
        "name": "approve",
        "steps": [{"id": "wait", "tool": "signal.wait", "args": {"name": "go", "timeout_s": 60}}],
    }
    with Client(server.url) as client:
        run = client.submit(approval)
        wait_for(lambda: client.get(run.run_id, min_seq=run.seq).steps[0].waiting, 30, "the wait")
    front = CuttingFront(server.url, cut=1, deliver=True)
    try:
        with Client(front.url) as client:
            sent = client.signal(run.run_id, "go", {"by": "ada"}, signal_id="go-once")
            assert front.accepted == 2  # answered, lost, sent again
            done = client.wait(run.run_id, timeout=30)
        assert done.status == "succeeded"
        assert done.steps[0].output == {"by": "ada"}
        with Client(server.url) as client:
            records = client.records(run.run_id, limit=1_000)
        assert records.next_after is None
        wakes = [r for r in records.records if r.type == "WAKE"]
        signals = [r.seq for r in wakes if r.data["cause"] == "signal"]
        assert signals == [sent.seq]  # journaled once, and that is the answer
    finally:
        front.close()


def test_a_submission_without_a_key_is_not_sent_twice(server: Served) -> None:
    """It may have been carried out: the error says so, and nothing is sent again."""
    front = CuttingFront(server.url, cut=1)
    try:
        with Client(front.url) as client, pytest.raises(ConnectionFailed):
            client.submit(COUNT, inputs={"text": "x"})
        assert front.accepted == 1
        with Client(front.url, retries=0) as client:  # and no retry at all when asked
            front.cut = 2
            with pytest.raises(ConnectionFailed):
                client.submit(COUNT, inputs={"text": "x"}, idempotency_key="never-retried")
        assert front.accepted == 2
    finally:
        front.close()


def test_async_client_sends_a_keyed_submission_again_after_a_cut_connection(
    server: Served,
) -> None:
    async def main() -> Any:
        async with AsyncClient(front.url) as client:
            return await client.submit(COUNT, inputs={"text": "z"}, idempotency_key=key)

    key = f"cut-async-{time.monotonic_ns()}"
    front = CuttingFront(server.url, cut=1)
    try:
        run = asyncio.run(main())
        assert run.created
        assert front.accepted == 2
    finally:
        front.close()


def test_which_failed_requests_are_sent_again_and_after_how_long() -> None:
    from tiffany.sdk.protocol import RETRY_FIRST_S, retry_delay

    refused = httpx.ConnectError("refused")
    cut = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    keyed = {"Idempotency-Key": "k"}
    assert retry_delay(refused, "POST", {}, 1, 2) == RETRY_FIRST_S  # it never left
    assert retry_delay(cut, "POST", {}, 1, 2) is None  # it may have been carried out
    assert retry_delay(cut, "POST", keyed, 1, 2) == RETRY_FIRST_S
    assert retry_delay(httpx.ReadError("reset"), "GET", {}, 2, 2) == 2 * RETRY_FIRST_S
    assert retry_delay(httpx.ReadError("reset"), "GET", {}, 3, 2) is None  # retries spent
    assert retry_delay(httpx.ReadTimeout("slow"), "GET", {}, 1, 2) is None  # busy, not gone


def test_the_feed_of_a_server_never_reached_fails_at_once() -> None:
    """events() on a URL where nothing listens: ConnectionFailed naming it, not 30 s of retries.

    Retrying is for a feed that was followed and dropped, or a server that
    answers HTTP while its feed comes back; a server that cannot be reached
    at all is said at once, as every other call says it.
    """
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url) as client, pytest.raises(ConnectionFailed, match="cannot reach"):
        next(iter(client.events()))

    async def main() -> None:
        async with AsyncClient(url) as aclient:
            with pytest.raises(ConnectionFailed, match="cannot reach"):
                await anext(aiter(aclient.events()))

    asyncio.run(main())


def test_schedules_are_listed_page_by_page(server: Served) -> None:
    yearly = {"plan": _plan("yearly", {"id": "s", "tool": "sleep", "args": {"seconds": 0}})}
    added = []
    for _ in range(5):
        r = httpx.post(
            server.url + "/api/schedules", json={**yearly, "cron": "0 0 1 1 *"}, timeout=30
        )
        assert r.status_code == 201, r.text
        added.append(r.json()["schedule_id"])
    try:
        with Client(server.url) as client:
            listed = [s.schedule_id for s in client.schedules(page_size=2)]
            assert listed[-5:] == added
            assert len(listed) == len(set(listed))
            assert next(iter(client.schedules())).cron == "0 0 1 1 *"

        async def main() -> list[str]:
            async with AsyncClient(server.url) as client:
                return [s.schedule_id async for s in client.schedules(page_size=3)]

        assert asyncio.run(main()) == listed
    finally:
        for sid in added:
            httpx.delete(f"{server.url}/api/schedules/{sid}", timeout=30)


def test_schedules_are_added_paused_resumed_and_deleted(server: Served) -> None:
    """``add_schedule``, ``schedule``, ``pause_schedule``, ``resume_schedule``, ``delete_schedule``.

    The same round trip with ``Client`` and ``AsyncClient``; a bad cron is
    an ``InvalidRequest`` naming the field, a schedule gone a ``NotFound``.
    """
    plan = _plan("weekday", {"id": "s", "tool": "sleep", "args": {"seconds": 0}})
    with Client(server.url) as client:
        added = client.add_schedule(plan, "0 9 * * 1-5", timezone="Europe/Paris")
        sid = added.schedule_id
        assert (added.cron, added.timezone, added.catchup) == (
            "0 9 * * 1-5",
            "Europe/Paris",
            "skip",
        )
        assert len(added.next_ticks) == 5
        assert added.next_ticks[0] == added.next_tick
        assert client.pause_schedule(sid).paused is True
        assert client.schedule(sid).next_ticks == []
        assert client.resume_schedule(sid).paused is False
        assert client.delete_schedule(sid) is None
        with pytest.raises(NotFound):
            client.schedule(sid)
        with pytest.raises(InvalidRequest) as bad:
            client.add_schedule(plan, "not cron")
        assert bad.value.errors[0].loc[-1] == "cron"

    async def main() -> None:
        async with AsyncClient(server.url) as aclient:
            made = await aclient.add_schedule(plan, "*/5 * * * *", inputs={})
            assert (await aclient.pause_schedule(made.schedule_id)).paused is True
            assert (await aclient.resume_schedule(made.schedule_id)).paused is False
            assert (await aclient.schedule(made.schedule_id)).schedule_id == made.schedule_id
            await aclient.delete_schedule(made.schedule_id)
            with pytest.raises(NotFound):
                await aclient.delete_schedule(made.schedule_id)

    asyncio.run(main())
