"""The shell commands of README.md and docs/*.md, and how each one is checked.

Every fenced ``sh``, ``bash``, ``shell`` or ``console`` block is read as a
reader would copy it: one command a line (a trailing ``\\`` continues it),
``#`` lines are comments; in a block with ``$`` prompts only the prompt
lines are commands and the lines after one are its sample output. Each
command is then checked the way that fits it:

* **run** (most): for real, with ``bash -c`` in a fresh copy of the
  repository (the tracked and new files of this checkout: a fresh clone of
  it) while ``tiffany serve`` serves ``./.tiffany`` there, started as
  ``make run`` starts it; ``.venv`` is this interpreter's, and ``PATH``
  holds its ``bin`` (the README says to activate it once). It must exit 0.
* **parse**: commands that do not end by themselves (``tiffany serve``,
  ``engine``, ``api``, ``projector``, ``tail`` without ``--run``): the
  CLI's own parser takes the line (``tests/docs/parse_cli.py``), with the
  command's environment.
* **dry-run**: ``make TARGET``: ``make -n TARGET`` (the whole test suite,
  the benchmarks and the server are not run; the server of the session is
  started from ``make -n run``'s own command line).
* **help**: ``python bench/X.py ...`` (minutes each): ``--help`` added,
  so argparse checks the options before it answers, and each ``--flag``
  the line names must be in the help.
* **pip**: ``pip install ...`` installs nothing here: each requirement
  must be this checkout (``.``, ``-e .``) with extras ``pyproject.toml``
  defines. A bare name is refused: this project is installed from its
  clone, it is not published on PyPI.

A pipe into ``tiffany`` is wrong as written (no command reads its standard
input) and so is a placeholder no earlier command gave a value to.

Placeholders: ``RUN_ID`` and ``SCHEDULE_ID`` are the ids the latest
command printed alone on its standard output (``submit``, ``rerun``,
``schedule add``) or as the ``run_id`` of its JSON (``run --json``);
``host:8000``, ``localhost:8000``, ``127.0.0.1:8000`` and
``build-host:8000`` are the session's server; ``TIFFANY_API_TOKEN=...``
its token (none). A value a ``console`` block shows in a sample output
(``"run_id":"run-3f2a9c1d0e7b"``, ``"seq":1042``: an id or a seq) stands,
in the commands after it, for what the real output had there, and every
key the sample shows must be in the real output.

A block preceded by ``<!-- doc-test: without a server -->`` runs in a
second copy that no server serves, whose ``./.tiffany`` holds one finished
run (``tiffany wal repair`` takes the WAL's lock).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARSE_CLI = Path(__file__).resolve().parent / "parse_cli.py"

#: Fence languages whose lines are shell commands.
SHELL_LANGUAGES = frozenset({"sh", "bash", "shell", "console"})
#: The directive (an HTML comment right above a fence) for a block no server may hold.
WITHOUT_SERVER = "<!-- doc-test: without a server -->"

#: Subcommands of ``tiffany`` that serve until stopped.
SERVING = frozenset({"serve", "engine", "api", "projector"})
#: Global options of ``tiffany`` that take a value (before the subcommand).
GLOBAL_VALUED = frozenset({"--data-dir", "--log-format", "--log-level"})
#: How long one command may take for real (an example plan on a loaded machine: seconds).
COMMAND_TIMEOUT_S = 120.0

PLACEHOLDER = re.compile(r"\b(RUN_ID|SCHEDULE_ID)\b")
#: Upper-case words that are no shell syntax nor a known placeholder: a synopsis, not a command.
UNKNOWN_PLACEHOLDER = re.compile(r"(?<![\w$={-])([A-Z][A-Z_]{1,})(?![\w=])")
SERVER_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1|build-host|host):8000\b")
TOKEN_PLACEHOLDER = re.compile(r"\bTIFFANY_API_TOKEN=\.\.\.")
BARE_ID = re.compile(r"^(run|sched)-[0-9a-f]{12}$")
#: Sample values that stand for the real ones later (ids, seqs), not words like "running".
SAMPLE_VALUE = re.compile(r'^(?:"[a-z]+-[0-9a-f]{8,}"|\d{3,})$')
SAMPLE_PAIR = re.compile(r'"(\w+)":\s*("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false|null)')


@dataclass(frozen=True)
class Command:
    """One documented command: where it is, its text, and the sample output shown under it."""

    file: str
    line: int
    text: str
    without_server: bool = False
    sample: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """``README.md:97``: how a failure names it."""
        return f"{self.file}:{self.line}"


def documented_files() -> list[Path]:
    """README.md, then docs/*.md by name."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def commands_of(path: Path, name: str | None = None) -> list[Command]:
    """The shell commands of the fenced blocks of ``path``, in order (``name``: how to cite it)."""
    out: list[Command] = []
    lines = path.read_text().splitlines()
    name = name or str(path.relative_to(REPO))
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if not fence.startswith("```") or fence[3:].strip() not in SHELL_LANGUAGES:
            if fence.startswith("```"):  # another language's block: skip to its end
                i += 1
                while i < len(lines) and not lines[i].strip().startswith("```"):
                    i += 1
            i += 1
            continue
        above = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
        without = above == WITHOUT_SERVER
        body_start = i + 1
        end = body_start
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        out += _block(name, lines, body_start, end, without)
        i = end + 1
    return out


def _block(name: str, lines: list[str], start: int, end: int, without: bool) -> list[Command]:
    body = lines[start:end]
    prompted = any(line.lstrip().startswith("$ ") for line in body)
    out: list[Command] = []
    j = 0
    while j < len(body):
        raw = body[j].strip()
        first = start + j + 1  # 1-based line number
        j += 1
        if prompted:
            if not raw.startswith("$ "):
                continue
            raw = raw[2:]
        if not raw or raw.startswith("#"):
            continue
        text = raw
        while text.endswith("\\") and j < len(body):
            text = text[:-1] + " " + body[j].strip().removeprefix("$ ")
            j += 1
        sample: list[str] = []
        if prompted:
            while j < len(body) and not body[j].strip().startswith("$ "):
                sample.append(body[j].strip())
                j += 1
        out.append(Command(name, first, text, without, tuple(sample)))
    return out


def all_commands(readme: bool) -> list[Command]:
    """The commands of README.md (``readme``) or of docs/*.md."""
    files = documented_files()
    chosen = files[:1] if readme else files[1:]
    return [c for path in chosen for c in commands_of(path)]


# -- a fresh copy of the repository ---------------------------------------------------


def fresh_copy(dest: Path) -> Path:
    """Copy this checkout's tracked and new files (not ignored ones) to ``dest``; link ``.venv``.

    Modification times are kept, so ``make`` finds the venv's install
    stamps newer than ``pyproject.toml`` and plans no ``pip`` (``make -n``).
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


def base_env() -> dict[str, str]:
    """The environment of a reader's shell with the venv activated (no TIFFANY_* of ours)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.pop("PYTHONPATH", None)
    env["VIRTUAL_ENV"] = sys.prefix
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def serve_command(root: Path, port: int) -> list[str]:
    """What ``make run PORT=port`` runs to serve, read from ``make -n`` (not run twice)."""
    planned = subprocess.run(
        ["make", "-n", "run", f"PORT={port}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    (line,) = [x for x in planned if " serve " in f"{x} "]
    assert "pip" not in "\n".join(planned), planned  # the stamps hold: nothing is installed
    return shlex.split(line)


# -- a session: the copy, its server, what earlier commands printed -------------------


@dataclass
class Session:
    """Where a document's commands run, in order, and what they left for the next ones."""

    root: Path
    env: dict[str, str]
    port: int | None = None
    token: str = ""
    #: RUN_ID / SCHEDULE_ID, from the latest command that printed one.
    ids: dict[str, str] = field(default_factory=dict)
    #: Values a console block's sample output shows -> what the real output had.
    bindings: dict[str, str] = field(default_factory=dict)

    def fork(self) -> Session:
        """The same copy and server with a document's own ids, bindings and exports."""
        return Session(self.root, dict(self.env), self.port, self.token)


def substitute(session: Session, command: Command) -> str:
    """The command with its placeholders and sample values made real (or an AssertionError)."""
    text = command.text
    for sample, real in sorted(session.bindings.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w-]){re.escape(sample)}(?![\w-])", real, text)

    def placeholder(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in session.ids:
            raise AssertionError(
                f"{command.where}: {name} is used before any command printed one: {command.text}"
            )
        return session.ids[name]

    text = PLACEHOLDER.sub(placeholder, text)
    if session.port is not None:
        text = SERVER_ADDRESS.sub(f"127.0.0.1:{session.port}", text)
    text = TOKEN_PLACEHOLDER.sub(f"TIFFANY_API_TOKEN={shlex.quote(session.token)}", text)
    code = _outside_quotes(text)
    found = UNKNOWN_PLACEHOLDER.findall(code)
    unknown = [w for w in found if not w.startswith(("TIFFANY_", "OTEL"))]
    if unknown:
        raise AssertionError(
            f"{command.where}: {', '.join(unknown)} is no value: a synopsis, not a command a "
            f"reader can run as written: {command.text}"
        )
    return text


def _outside_quotes(text: str) -> str:
    """``text`` without its quoted parts and its trailing comment: the shell's bare words."""
    text = re.sub(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"", "''", text)
    return text.split(" #", 1)[0]


def words(text: str) -> list[str]:
    """The command's words as the shell splits them (comments dropped)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _strip_assignments(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
        key, _, value = argv[0].partition("=")
        env[key] = value
        argv = argv[1:]
    return env, argv


def _subcommand(argv: list[str]) -> tuple[str | None, list[str]]:
    """The ``tiffany`` subcommand of ``argv`` (after the program), and the words after it."""
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in GLOBAL_VALUED else 1
    return (argv[i], argv[i + 1 :]) if i < len(argv) else (None, [])


def kind_of(text: str) -> str:
    """How a command is checked: run, parse, dry-run, help, pip, export, fuzz."""
    if re.search(r"\|\s*(?:\S*/)?tiffany\b", _outside_quotes(text)):
        return "pipe-into-tiffany"
    argv = words(text)
    if argv and argv[0] == "export":
        return "export"
    if re.search(r"\bschemathesis\s.*\brun\b", text):
        return "fuzz"  # minutes against a server: tests/api/test_schemathesis.py runs it
    _, argv = _strip_assignments(argv)
    if not argv:
        return "run"
    program = Path(argv[0]).name
    if program == "make":
        return "dry-run"
    if program == "tiffany":
        sub, rest = _subcommand(argv)
        if sub in SERVING or (sub == "tail" and "--run" not in rest):
            return "parse"
        return "run"
    if program in ("pip", "pip3") or argv[1:3] == ["-m", "pip"]:
        return "pip"
    if program.startswith("python") and len(argv) > 1 and argv[1].startswith("bench/"):
        return "help"
    if program in ("docker", "docker-compose", "kubectl", "systemctl"):
        return "unsupported"
    return "run"


@dataclass
class Outcome:
    """What checking a command gave: its exit code and output."""

    code: int
    stdout: str
    stderr: str


def check(session: Session, command: Command) -> Outcome:
    """Check one documented command in ``session``; raise AssertionError, naming it, if wrong."""
    text = substitute(session, command)
    kind = kind_of(text)
    where = f"{command.where}: `{command.text}`"
    if kind == "fuzz":
        return _check_fuzz(session, where, text)
    if kind == "pipe-into-tiffany":
        raise AssertionError(f"{where}: a pipe into tiffany: no tiffany command reads stdin")
    if kind == "unsupported":
        raise AssertionError(f"{where}: no way to check this here; give it a kind in {__file__}")
    if kind == "export":
        session.env.update(_strip_assignments(words(text)[1:])[0])
        return Outcome(0, "", "")
    if kind == "pip":
        _check_pip(where, words(text))
        return Outcome(0, "", "")
    script = text
    if kind == "dry-run":
        assigned, argv = _strip_assignments(words(text))
        script = shlex.join(["make", "-n", *argv[1:]])
    elif kind == "parse":
        assigned, argv = _strip_assignments(words(text))
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in assigned.items())
        script = f"{prefix} {shlex.join([sys.executable, str(PARSE_CLI), *argv[1:]])}"
    elif kind == "help":
        script = f"{text.split(' #', 1)[0]} --help"
    outcome = _bash(session, script)
    if outcome.code != 0:
        raise AssertionError(
            f"{where} exited {outcome.code} ({kind}: {script})\n"
            f"--- stdout\n{outcome.stdout[-3000:]}\n--- stderr\n{outcome.stderr[-3000:]}"
        )
    if kind == "help":
        for flag in re.findall(r"(?<!\S)(--[\w-]+)", _outside_quotes(text)):
            helped = outcome.stdout
            assert flag in helped, f"{where}: {flag} is not an option of it:\n{helped}"
    if kind == "run":
        _learn(session, command, outcome.stdout)
    return outcome


def _check_fuzz(session: Session, where: str, text: str) -> Outcome:
    """A schemathesis run: its program starts (hooks importable) and knows every flag given.

    The run itself is tests/api/test_schemathesis.py's (minutes of fuzzing).
    """
    exe = re.search(r"^(.*?\S*schemathesis)\s", text, re.S)
    assert exe, f"{where}: no schemathesis program in it"
    helped = ""
    for sub_help in ("--help", "run --help"):
        outcome = _bash(session, f"{exe.group(1)} {sub_help}")
        assert outcome.code == 0, f"{where}: `{sub_help}` exited {outcome.code}: {outcome.stderr}"
        helped += outcome.stdout
    for flag in re.findall(r"(?<!\S)(--[\w-]+)", _outside_quotes(text)):
        assert flag in helped, f"{where}: {flag} is not an option of schemathesis"
    return Outcome(0, helped, "")


def _bash(session: Session, script: str) -> Outcome:
    try:
        proc = subprocess.run(
            ["bash", "-c", f"set -o pipefail\n{script}"],
            cwd=session.root,
            env=session.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"`{script}` did not end within {COMMAND_TIMEOUT_S:.0f} s: a command that serves "
            "until stopped needs a parse-only kind (doc_commands.kind_of)"
        ) from None
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def _check_pip(where: str, argv: list[str]) -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    start = argv.index("install") + 1
    wanted = [a for a in argv[start:] if not a.startswith("-")]
    assert wanted, f"{where}: installs nothing"
    for requirement in wanted:
        match = re.fullmatch(r"(\.|\./[^\[]*)(?:\[([\w,-]+)\])?", requirement)
        assert match, (
            f"{where}: {requirement!r} is not this checkout: Tiffany is installed from its "
            "clone (`pip install -e '.[EXTRA]'`), it is not published on PyPI"
        )
        for extra in (match.group(2) or "").split(","):
            assert not extra or extra in extras, (
                f"{where}: no extra {extra!r} in pyproject.toml (extras: {sorted(extras)})"
            )


def _learn(session: Session, command: Command, stdout: str) -> None:
    """Keep the ids and sample values a command printed, for the commands after it."""
    text = stdout.strip()
    if BARE_ID.match(text):
        session.ids["RUN_ID" if text.startswith("run-") else "SCHEDULE_ID"] = text
    else:
        for candidate in (text, text.splitlines()[0] if text else ""):
            try:
                doc = json.loads(candidate)
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("run_id"), str):
                session.ids["RUN_ID"] = doc["run_id"]
            break
    sample = "\n".join(command.sample)
    if not sample:
        return
    try:
        real = json.loads(text)
    except ValueError as exc:
        raise AssertionError(
            f"{command.where}: the sample shows {sample!r}; the output is not that JSON: {text!r}"
        ) from exc
    for key, shown in SAMPLE_PAIR.findall(sample):
        assert key in real, f"{command.where}: the sample shows {key!r}; the output has not: {text}"
        if SAMPLE_VALUE.match(shown):  # an id or a seq: the commands after it use the real one
            session.bindings[shown.strip('"')] = str(real[key])


def iter_checks(session: Session, commands: list[Command]) -> Iterator[tuple[Command, Outcome]]:
    """Check ``commands`` in order (the self-test's loop); stop at the first wrong one."""
    for command in commands:
        yield command, check(session, command)


# -- the sessions the tests use ----------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served_copy(prefix: str) -> Iterator[Session]:
    """A fresh copy with ``make run``'s server on ``./.tiffany`` (a free port): its session."""
    import httpx
    from process_support import terminate, wait_for

    root = fresh_copy(Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")))  # short: socket paths
    env = base_env()
    port = _free_port()
    log = root / "make-run.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            serve_command(root, port), cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        ready = root / ".tiffany" / "serve.json"
        wait_for(lambda: ready.exists() or proc.poll() is not None, 120, "make run's serve.json")
        assert proc.poll() is None, log.read_text()[-3000:]
        url = f"http://127.0.0.1:{port}/readyz"
        wait_for(lambda: httpx.get(url).status_code == 200, 120, "make run's /readyz")
        yield Session(root, env, port)
    finally:
        terminate(proc)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def unserved_copy(prefix: str) -> Iterator[Session]:
    """A fresh copy no server serves, whose ``./.tiffany`` holds one finished run."""
    root = fresh_copy(Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")))
    env = base_env()
    try:
        subprocess.run(
            ["tiffany", "run", "examples/approval/plan.yaml", "--json", "--signal",
             'approve={"approved": true, "by": "alice"}'],
            cwd=root, env=env, check=True, capture_output=True, timeout=COMMAND_TIMEOUT_S,
        )  # fmt: skip
        yield Session(root, env)
    finally:
        shutil.rmtree(root, ignore_errors=True)
