"""The CLI against a real server: ``--url``/``--token``, and ``run`` beside it on its data dir.

Real processes only: ``tiffany serve`` (with a token, and ``--import`` of a
user's tool module) on loopback, and each command as its own ``python -m
tiffany`` process, as a user types it.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

SDK_TESTS = Path(__file__).resolve().parent / "sdk"
if str(SDK_TESTS) not in sys.path:
    sys.path.insert(0, str(SDK_TESTS))

from sdk_support import USER_TOOLS, Served, clean_env, serve, short_dir  # noqa: E402

from tiffany import Client  # noqa: E402
from tiffany.sdk.errors import ApiError  # noqa: E402

TOKEN = "cli-remote-token"
COUNT = (
    "name: count\ninputs: {text: a b c}\nsteps:\n"
    "  - {id: count, tool: python, args: {function: word_count, "
    "kwargs: {text: '${inputs.text}'}}}\n"
    "outputs: {words: '${steps.count.output.words}'}\n"
)
APPROVE = (
    "name: approve\nsteps:\n  - {id: ok, tool: signal.wait, args: {name: approve}}\n"
    "outputs: {by: '${steps.ok.output.by}'}\n"
)
NAP = "name: nap\nsteps:\n  - {id: nap, tool: sleep, args: {seconds: 60}}\n"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    cwd = short_dir("tfr-")
    (cwd / "usertools.py").write_text(USER_TOOLS)
    for name, text in (("count.yaml", COUNT), ("approve.yaml", APPROVE), ("nap.yaml", NAP)):
        (cwd / name).write_text(text)
    server = serve(cwd, "--import", "usertools", token=TOKEN)
    yield server
    server.stop()


def tiffany(
    served: Served, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiffany", *args],
        cwd=served.cwd,
        env=clean_env() | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
    )


def remote(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    return tiffany(served, *args, "--url", served.url, "--token", TOKEN)


def test_submit_tail_runs_status_over_http(served: Served) -> None:
    submitted = remote(served, "submit", "count.yaml", "--input", "text=one two")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    tailed = remote(served, "tail", "--run", run_id)
    assert tailed.returncode == 0, tailed.stderr
    lines = tailed.stdout.splitlines()
    assert "run finished    succeeded" in lines[-1]
    assert run_id in lines[-1]
    # Step-level by default over the websocket too; every dispatch with --kernel.
    assert [" ".join(line.split()[2:4]) for line in lines] == [
        "run started",
        "step started",
        "step finished",
        "run finished",
    ], tailed.stdout
    dispatches = remote(served, "tail", "--run", run_id, "--kernel")
    assert dispatches.returncode == 0, dispatches.stderr
    assert "queue_get" in dispatches.stdout
    assert "run.finished" in dispatches.stdout.splitlines()[-1]
    with Client(served.url, token=TOKEN) as client:
        done = client.wait(run_id, timeout=60)
    assert done.status == "succeeded"
    assert done.outputs == {"words": 2}
    listed = remote(served, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert rows[0]["run_id"] == run_id
    assert rows[0]["status"] == "succeeded"
    human = remote(served, "runs")
    assert run_id in human.stdout.splitlines()[0]
    assert "succeeded" in human.stdout
    status = remote(served, "status")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["ready"] is True


def test_signal_cancel_and_rerun_over_http(served: Served) -> None:
    run_id = remote(served, "submit", "approve.yaml").stdout.strip()
    # What it waits for, with the command that sends it: to this server (the
    # --url typed), a token typed named but never printed.
    waiting = remote(served, "runs", "--status", "waiting")
    assert waiting.returncode == 0, waiting.stderr
    assert (
        f"`tiffany signal {run_id} approve --data JSON --url {served.url} --token T` sends it"
        in waiting.stderr
    ), waiting.stderr
    assert TOKEN not in waiting.stderr
    from_env = tiffany(
        served,
        "runs",
        "--status",
        "waiting",
        env={"TIFFANY_URL": served.url, "TIFFANY_API_TOKEN": TOKEN},
    )
    assert f"`tiffany signal {run_id} approve --data JSON` sends it" in from_env.stderr
    sent = remote(served, "signal", run_id, "approve", "--data", '{"by": "ada"}')
    assert sent.returncode == 0, sent.stderr
    assert f"run {run_id}: signal approve journaled" in sent.stdout
    with Client(served.url, token=TOKEN) as client:
        assert client.wait(run_id, timeout=60).outputs == {"by": "ada"}
        again = remote(served, "rerun", run_id, "--from", "ok")
        assert again.returncode == 0, again.stderr
        new_id = again.stdout.strip()
        assert new_id != run_id
        # The re-run's step waits again: it takes a signal of its own.
        assert remote(served, "signal", new_id, "approve", "--data", '{"by": "bo"}').returncode == 0
        assert client.wait(new_id, timeout=60).outputs == {"by": "bo"}
        nap = remote(served, "submit", "nap.yaml").stdout.strip()
        cancelled = remote(served, "cancel", nap)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == f"run {nap}: cancelling"
        assert client.wait(nap, timeout=60).status == "cancelled"
    refused = remote(served, "cancel", nap)
    assert refused.returncode == 1
    assert "finished" in refused.stderr


def test_errors_map_onto_the_exit_code_table(served: Served) -> None:
    no_token = tiffany(served, "runs", "--url", served.url)
    assert no_token.returncode == 2
    assert "bearer token" in no_token.stderr
    assert "--token, or TIFFANY_API_TOKEN" in no_token.stderr  # how a CLI user gives one
    # TIFFANY_URL and TIFFANY_API_TOKEN instead of the options.
    env = {"TIFFANY_URL": served.url, "TIFFANY_API_TOKEN": TOKEN}
    unknown = tiffany(served, "cancel", "run-nope", env=env)
    assert unknown.returncode == 3
    assert "run-nope" in unknown.stderr
    invalid = tiffany(served, "submit", "count.yaml", "--input", "nope=1", env=env)
    assert invalid.returncode == 2
    assert "nope" in invalid.stderr
    nobody = tiffany(served, "runs", "--url", "http://127.0.0.1:9")
    assert nobody.returncode == 5
    assert "cannot reach" in nobody.stderr
    # The feed too: said at once, as every other command does (it retried for
    # 30 s, then "cannot follow the feed"); a reachable server restarting is waited for.
    no_feed = tiffany(served, "tail", "--url", "http://127.0.0.1:9")
    assert no_feed.returncode == 5
    assert "cannot reach the Tiffany API at http://127.0.0.1:9" in no_feed.stderr
    assert "Traceback" not in nobody.stderr + unknown.stderr + no_token.stderr
    # tail's websocket refused for the token: exit 2 and the server's reason, at
    # once (it was retried for 30 s, then "cannot follow the feed", exit 5).
    for token_args in ((), ("--token", "wrong")):
        tailed = tiffany(served, "tail", "--url", served.url, *token_args)
        assert tailed.returncode == 2, tailed.stderr
        assert "bearer token" in tailed.stderr
        assert "--token, or TIFFANY_API_TOKEN" in tailed.stderr


def test_run_beside_serve_runs_here_with_every_tool_in_a_data_dir_of_its_own(
    served: Served,
) -> None:
    """``tiffany run`` on a served data dir: this process, every tool, ``<data dir>/local``.

    It was submitted to the server silently, where ``shell`` is off (exit 2)
    and this shell's ``TIFFANY_HTTP_ALLOW`` does not reach (exit 1). Now
    the run keeps the tools ``run`` promises, says where it is kept, and
    every command it prints names that data dir.
    """
    (served.cwd / "mixed.yaml").write_text(
        "name: mixed\ninputs: {text: a b c}\nsteps:\n"
        "  - {id: count, tool: python, args: {function: word_count, "
        "kwargs: {text: '${inputs.text}'}}}\n"
        "  - {id: echo, tool: shell, args: {argv: [echo, hi]}}\n"
        "outputs: {words: '${steps.count.output.words}', echo: '${steps.echo.output.stdout}'}\n"
    )
    data_dir = served.data_dir
    local = data_dir / "local"
    ran = tiffany(
        served, "run", "mixed.yaml", "--import", "usertools", "--data-dir", str(data_dir), "--json"
    )
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["outputs"] == {"words": 3, "echo": "hi\n"}  # shell, off on the server
    said = ran.stderr.splitlines()  # paths as typed: relative to the working directory
    assert said[0].startswith("tiffany: d is in use by pid"), ran.stderr
    assert "kept in the data dir d/local " in said[0]
    assert "`tiffany submit PLAN` runs a plan on the server instead" in said[0]
    # Kept there, not in the server's WAL or store.
    with Client(served.url, token=TOKEN) as client, pytest.raises(ApiError) as unknown:
        client.get(result["run_id"])
    assert unknown.value.status == 404
    listed = tiffany(served, "runs", "--data-dir", str(local))
    assert listed.stdout.split()[:2] == [result["run_id"], "succeeded"], listed.stderr
    verified = tiffany(served, "replay", result["run_id"], "--verify", "--data-dir", str(local))
    assert verified.returncode == 0, verified.stderr
    # Named by the data dir the run was started with (the README's `tiffany replay
    # RUN_ID --verify` after `tiffany run`, while `make run` serves): found in local.
    found = tiffany(
        served,
        "replay",
        result["run_id"],
        "--verify",
        "--import",
        "usertools",
        "--data-dir",
        str(data_dir),
    )
    assert found.returncode == 0, found.stderr
    assert "replays identically" in found.stdout
    assert f"run {result['run_id']} is in d/local, where `tiffany run` keeps" in found.stderr
    exported = tiffany(
        served, "export", result["run_id"], "-o", "kept.tfx", "--data-dir", str(data_dir)
    )
    assert exported.returncode == 0, exported.stderr
    assert (served.cwd / "kept.tfx").stat().st_size > 0
    unknown_run = tiffany(
        served, "replay", "run-0123456789ab", "--verify", "--data-dir", str(data_dir)
    )
    assert unknown_run.returncode == 3, unknown_run.stderr
    assert "is in d/local" not in unknown_run.stderr
    # A run left waiting: the commands it prints name the data dir it is kept in.
    waited = tiffany(served, "run", "approve.yaml", "--data-dir", str(data_dir), "--no-live")
    assert waited.returncode == 1, waited.stderr
    assert "`tiffany serve --data-dir d/local`" in waited.stderr
    assert "approve --data JSON --data-dir d/local`" in waited.stderr
    # A store named in the environment (a server's on PostgreSQL, say) is the server's
    # too: a second journal would be projected into it. Refused, naming what to set.
    database = f"sqlite:///{served.cwd / 'shared.db'}"
    shared = tiffany(
        served,
        "run",
        "mixed.yaml",
        "--import",
        "usertools",
        "--data-dir",
        str(data_dir),
        env={"TIFFANY_DATABASE_URL": database},
    )
    assert shared.returncode == 2, shared.stderr
    assert "TIFFANY_DATABASE_URL" in shared.stderr
    assert "`tiffany submit PLAN`" in shared.stderr


def test_every_way_in_prints_an_invalid_plan_alike(served: Served) -> None:
    """run (beside the server and alone), plan validate, submit (socket and --url): one report."""
    (served.cwd / "typo.yaml").write_text(
        "name: typo\nsteps:\n  - {id: nap, tool: sleep, args: {secondz: 1}}\n"
    )
    expected = [
        "tiffany: invalid plan:",
        "  steps[0].args.secondz: unknown argument 'secondz' of tool 'sleep'; "
        "did you mean 'seconds'? (allowed: seconds)",
        "  steps[0].args.seconds: missing required argument 'seconds' of tool 'sleep'",
    ]
    served_dir = ("--data-dir", str(served.data_dir))
    alone = ("--data-dir", str(served.cwd / "alone"))
    ways = {
        "run beside serve": tiffany(served, "run", "typo.yaml", *served_dir),
        "run alone": tiffany(served, "run", "typo.yaml", *alone),
        "plan validate": tiffany(served, "plan", "validate", "typo.yaml"),
        "submit": tiffany(served, "submit", "typo.yaml", *served_dir),
        "submit --url": remote(served, "submit", "typo.yaml"),
    }
    for way, proc in ways.items():
        assert proc.returncode == 2, (way, proc.stderr)
        assert proc.stderr.splitlines() == expected, (way, proc.stderr)
    assert not (served.cwd / "alone" / "wal").exists()  # refused before the engine opened


def test_python_kwargs_are_checked_against_the_function_at_submission(served: Served) -> None:
    """A python step's kwargs that its function does not take failed only when the step ran.

    They are refused where the plan enters, naming ``steps[i].args.kwargs.NAME``
    with a did-you-mean, by every way in: the HTTP API (SDK and ``--url``),
    the engine's socket, ``run`` alone and beside the server, and ``plan
    validate`` with the module imported. A value holding a reference is
    checked by name only.
    """
    (served.cwd / "kwargs.yaml").write_text(
        "name: kwargs\ninputs: {text: a b}\nsteps:\n"
        "  - {id: count, tool: python, args: {function: word_count, "
        "kwargs: {txt: '${inputs.text}'}}}\n"
        "  - {id: half, tool: python, args: {function: must_be_even, kwargs: {n: 4}}}\n"
    )
    expected = [
        "tiffany: invalid plan:",
        "  steps[0].args.kwargs.txt: unexpected keyword argument 'txt' of python function "
        "'word_count'; did you mean 'text'? (parameters: text)",
        "  steps[0].args.kwargs.text: missing required argument 'text' of python function "
        "'word_count'",
    ]
    served_dir = ("--data-dir", str(served.data_dir))
    imported = ("--import", "usertools")
    ways = {
        "submit --url": remote(served, "submit", "kwargs.yaml"),
        "submit": tiffany(served, "submit", "kwargs.yaml", *served_dir),
        "run beside serve": tiffany(served, "run", "kwargs.yaml", *imported, *served_dir),
        "run alone": tiffany(
            served, "run", "kwargs.yaml", *imported, "--data-dir", str(served.cwd / "alone")
        ),
        "plan validate": tiffany(served, "plan", "validate", "kwargs.yaml", *imported),
    }
    for way, proc in ways.items():
        assert proc.returncode == 2, (way, proc.stderr)
        assert proc.stderr.splitlines() == expected, (way, proc.stderr)
    assert not (served.cwd / "alone" / "wal").exists()  # refused before the engine opened
    with Client(served.url, token=TOKEN) as client, pytest.raises(ApiError) as refused:
        client.submit((served.cwd / "kwargs.yaml").read_text())
    assert refused.value.status == 422
    assert [e.loc for e in refused.value.errors] == [
        ("steps", 0, "args", "kwargs", "txt"),
        ("steps", 0, "args", "kwargs", "text"),
    ]
    # Without the module, plan validate says the function is not there (as the server would).
    missing = tiffany(served, "plan", "validate", "kwargs.yaml")
    assert missing.returncode == 2
    assert "no python tool function 'word_count'" in missing.stderr


def test_submit_prints_the_servers_refusal_once_a_problem(served: Served) -> None:
    """A plan valid here but refused by the server (a tool it disabled): one line a step.

    ``tiffany run`` beside the same server runs it (every tool, its own data dir).
    """
    (served.cwd / "shelly.yaml").write_text(
        "name: shelly\nsteps:\n"
        "  - {id: a, tool: shell, args: {argv: ['true']}}\n"
        "  - {id: b, tool: shell, args: {argv: ['true']}}\n"
    )
    served_dir = ("--data-dir", str(served.data_dir))
    refused = tiffany(served, "submit", "shelly.yaml", *served_dir)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.splitlines()
    assert lines[0] == "tiffany: invalid plan:", refused.stderr
    assert [line.split(":", 1)[0] for line in lines[1:]] == ["  steps[0].tool", "  steps[1].tool"]
    assert all("'shell' is disabled on this server" in line for line in lines[1:])
    assert all("--enable-tool shell" in line for line in lines[1:])
    ran = tiffany(served, "run", "shelly.yaml", *served_dir, "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"] == "succeeded"


class _NotTiffany(http.server.BaseHTTPRequestHandler):
    """Another service on the URL: JSON of its own on GET, an HTML error page on POST."""

    def do_GET(self) -> None:
        self._answer(200, "application/json", b'{"hello": "world"}')

    def do_POST(self) -> None:
        self._answer(501, "text/html", b"<!DOCTYPE HTML>\n<html><body>Unsupported</body></html>")

    def _answer(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_tiffany() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotTiffany)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_url_that_is_not_a_tiffany_api_says_so(served: Served, not_tiffany: str) -> None:
    """A wrong --url: one line naming the request, never a traceback or a page of HTML."""
    # A 200 of another shape was a pydantic traceback (exit 1).
    for args in (("runs",), ("status",)):
        proc = tiffany(served, *args, "--url", not_tiffany)
        assert proc.returncode == 5, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.startswith("tiffany: not a Tiffany API answer: GET ")
        assert len(proc.stderr.splitlines()) == 1
    # An error page was printed whole.
    posted = tiffany(served, "cancel", "run-x", "--url", not_tiffany)
    assert posted.returncode == 1, posted.stderr
    assert posted.stderr.splitlines() == [
        f"tiffany: not a Tiffany API answer: POST {not_tiffany}/api/runs/run-x/cancel"
        " -> 501 (text/html)"
    ]
    # The right server under a path it does not serve: "Not Found" alone named nothing.
    prefixed = tiffany(served, "runs", "--url", served.url + "/tiffany", "--token", TOKEN)
    assert prefixed.returncode == 3, prefixed.stderr
    assert f"GET {served.url}/tiffany/api/runs" in prefixed.stderr


def test_a_plan_name_cannot_drive_the_readers_terminal(served: Served) -> None:
    """ESC, BEL and newlines in a submitted plan's name are printed escaped, not sent raw.

    ``tail`` wrote them as they came, and ``runs`` let an OSC sequence
    through (it set the terminal's title): anyone who may submit could
    drive the terminal of whoever reads the runs.
    """
    name = "evil\x1b[31mred\x1b]0;pwned\x07\nsecond line"
    plan = {"name": name, "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}
    with Client(served.url, token=TOKEN) as client:
        run = client.submit(plan)
        assert run.wait(timeout=60).status == "succeeded"
    outputs = {
        "runs --url": remote(served, "runs", "--limit", "1"),
        "runs": tiffany(served, "runs", "--limit", "1", "--data-dir", str(served.data_dir)),
        "tail --url": remote(served, "tail", "--run", run.run_id),
        "tail": tiffany(
            served, "tail", "--run", run.run_id, "--since", "0", "--data-dir", str(served.data_dir)
        ),
    }
    for way, proc in outputs.items():
        assert proc.returncode == 0, (way, proc.stderr)
        lines = [line for line in proc.stdout.splitlines() if run.run_id in line]
        assert lines, (way, proc.stdout)
        assert not any(c in proc.stdout for c in "\x1b\x07"), (way, proc.stdout)
        assert "evil\\x1b[31mred\\x1b]0;pwned\\x07\\x0asecond line" in lines[0], (way, lines)


def test_a_local_tail_of_one_run_shows_what_tail_url_shows(served: Served) -> None:
    """``tail --run`` on the data dir: the run's recent past, then live, and its end.

    It followed the engine's feed from "now" only: a finished or unknown
    run printed nothing and never ended, a running one lost its first
    events. ``--url`` always did this (docs/cli.md: same output, same exit codes).
    """
    local = ("--data-dir", str(served.data_dir))
    with Client(served.url, token=TOKEN) as client:
        done = client.submit(
            {
                "name": "two",
                "steps": [
                    {"id": "a", "tool": "sleep", "args": {"seconds": 0}},
                    {"id": "b", "tool": "sleep", "args": {"seconds": 0}, "after": ["a"]},
                ],
            }
        )
        assert done.wait(timeout=60).status == "succeeded"
        over_http = remote(served, "tail", "--run", done.run_id, "--json")
        here = tiffany(served, "tail", "--run", done.run_id, "--json", *local)
        for way, proc in (("url", over_http), ("local", here)):
            assert proc.returncode == 0, (way, proc.stderr)
        kinds = [(e["kind"], e.get("task_name")) for e in map(json.loads, here.stdout.splitlines())]
        assert kinds == [
            (e["kind"], e.get("task_name")) for e in map(json.loads, over_http.stdout.splitlines())
        ]
        assert kinds[0][0] == "run.started"
        assert kinds[-1][0] == "run.finished"

        waiting = client.submit(APPROVE).run_id
        client.get(waiting)  # with the submission's seq: in the store (tail asks it)
        follower = subprocess.Popen(
            [sys.executable, "-m", "tiffany", "tail", "--run", waiting, "--json", *local],
            cwd=served.cwd,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = json.loads(follower.stdout.readline())  # from before the tail started
            assert (first["kind"], first["run_id"]) == ("run.started", waiting)
            client.signal(waiting, "approve", {"by": "ada"})
            out, err = follower.communicate(timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
        assert follower.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["kind"] == "run.finished"

    unknown = tiffany(served, "tail", "--run", "run-000000000000", *local)
    assert unknown.returncode == 3, unknown.stderr
    assert "no run 'run-000000000000'" in unknown.stderr


def test_no_cli_message_shows_a_credential_of_the_url(served: Served, not_tiffany: str) -> None:
    """A password or a ``?token=`` in --url is masked in every message, whoever words it."""
    secret, token = "pw-s3cret-77", "tok-s3cret-88"

    def with_credentials(base: str) -> str:
        return base.replace("http://", f"http://ann:{secret}@") + f"/?token={token}"

    cases = [
        ("runs", "--url", with_credentials("http://127.0.0.1:9")),  # unreachable: httpx's words
        ("tail", "--url", with_credentials("http://127.0.0.1:9")),  # the feed's
        ("status", "--url", with_credentials(not_tiffany)),  # not the API: the request named
        ("cancel", "run-x", "--url", with_credentials(not_tiffany)),
        ("runs", "--url", f"ftp://ann:{secret}@host/?token={token}"),  # refused URL: --url echoed
        ("runs", "--url", with_credentials(served.url)),  # the server's 401
        ("--log-level", "debug", "status", "--url", with_credentials(served.url)),  # logs
    ]
    for args in cases:
        proc = tiffany(served, *args)
        assert proc.returncode != 0, (args, proc.stderr)
        shown = proc.stdout + proc.stderr
        assert secret not in shown, (args, shown)
        assert token not in shown, (args, shown)
        assert "[REDACTED]" in proc.stderr, (args, proc.stderr)


def test_the_sdk_never_words_a_credential_of_its_url() -> None:
    from tiffany.sdk import ConnectionFailed

    url = "http://ann:pw-s3cret@127.0.0.1:9/?token=tok-s3cret"
    client = Client(url, retries=0)
    assert "s3cret" not in repr(client)
    with pytest.raises(ConnectionFailed) as failed:
        client.list()
    assert "s3cret" not in str(failed.value)
    assert "s3cret" not in json.dumps(failed.value.to_dict())
    assert "http://ann:[REDACTED]@127.0.0.1:9" in failed.value.message


def test_schedule_add_list_pause_resume_rm_over_http_print_as_local(served: Served) -> None:
    """``tiffany schedule ... --url``: through the SDK, with the local commands' output.

    The same server's data dir read locally lists the schedule the remote
    ``add`` made with the same line, paused or not; an unknown id is exit 3
    either way.
    """
    local = ("--data-dir", str(served.data_dir))
    added = remote(served, "schedule", "add", "count.yaml", "--cron", "0 9 * * 1-5")
    assert added.returncode == 0, added.stderr
    sid = added.stdout.strip()
    with Client(served.url, token=TOKEN) as client:
        row = client.schedule(sid)
        assert (row.cron, row.timezone, row.paused) == ("0 9 * * 1-5", "UTC", False)
        assert len(row.next_ticks) == 5
        assert row.next_ticks[0] == row.next_tick
    lines = remote(served, "schedule", "list").stdout.splitlines()
    here = tiffany(served, *local, "schedule", "list").stdout.splitlines()
    mine = [line for line in lines if line.startswith(sid)]
    assert mine == [line for line in here if line.startswith(sid)]
    assert "active" in mine[0]
    paused = remote(served, "schedule", "pause", sid)
    assert (paused.returncode, paused.stdout.strip()) == (0, f"{sid}: paused"), paused.stderr
    listed = remote(served, "schedule", "list", "--json").stdout.splitlines()
    rows = [json.loads(line) for line in listed]
    assert next(r for r in rows if r["schedule_id"] == sid)["paused"] is True
    assert remote(served, "schedule", "resume", sid).stdout.strip() == f"{sid}: active"
    removed = remote(served, "schedule", "rm", sid)
    assert (removed.returncode, removed.stdout.strip()) == (0, f"{sid}: deleted")
    for args in (("pause", sid), ("rm", sid)):
        gone = remote(served, "schedule", *args)
        assert gone.returncode == 3, gone.stderr
        assert sid in gone.stderr
        assert gone.returncode == tiffany(served, *local, "schedule", *args).returncode


def test_export_over_http_replays_here_and_an_unfinished_run_replays_its_prefix(
    served: Served,
) -> None:
    run_id = remote(served, "submit", "count.yaml", "--input", "text=x y z").stdout.strip()
    with Client(served.url, token=TOKEN) as client:
        assert client.wait(run_id, timeout=60).status == "succeeded"
        raw = client.export(run_id)
    assert raw.startswith(b"TIFEXP")
    exported = remote(served, "export", run_id, "-o", "count.tfx")
    assert exported.returncode == 0, exported.stderr
    assert f"exported run {run_id} (" in exported.stdout
    assert "finished succeeded) to count.tfx" in exported.stdout
    from tiffany.durable.export import parse_export, read_export

    from_sdk, from_cli = parse_export(raw), read_export(served.cwd / "count.tfx")
    assert from_cli.meta.run_id == from_sdk.meta.run_id == run_id
    assert [s[:2] for s in from_cli.spans()] == [s[:2] for s in from_sdk.spans()]
    # Replayed here, with no server and no data dir: the file is the run.
    replayed = tiffany(
        served, "replay", "count.tfx", "--verify", "--import", "usertools", "--data-dir", "nowhere"
    )
    assert replayed.returncode == 0, replayed.stderr
    assert f"run {run_id} (from count.tfx) replays identically" in replayed.stdout
    waiting = remote(served, "submit", "approve.yaml").stdout.strip()
    try:
        part = remote(served, "export", waiting, "-o", "approve.tfx")
        assert part.returncode == 0, part.stderr
        assert "NOT finished (running)" in part.stdout
        prefix = tiffany(served, "replay", "approve.tfx", "--verify", "--data-dir", "nowhere")
        assert prefix.returncode == 0, prefix.stderr
        assert "replays identically up to the end of its journal" in prefix.stdout
    finally:
        remote(served, "cancel", waiting)
    missing = remote(served, "export", "run-nope")
    assert missing.returncode == 3, missing.stderr
    assert "no run 'run-nope'" in missing.stderr
