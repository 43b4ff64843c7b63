"""``tiffany memory ls|get|search|rm``: on a data dir (no server), and with ``--url``/``--token``.

Real processes only: each command is its own ``python -m tiffany``, as a
user types it; the remote ones talk to a real ``tiffany serve`` with a
token. The same data answers the same JSON either way; refusals exit with
the table's codes (2 bad input naming it, 3 no such item, 5 nothing at the
URL).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SDK_TESTS = Path(__file__).resolve().parent / "sdk"
if str(SDK_TESTS) not in sys.path:
    sys.path.insert(0, str(SDK_TESTS))

from sdk_support import Served, clean_env, free_port, serve, short_dir  # noqa: E402

from tiffany.memory import MemoryStore  # noqa: E402
from tiffany.store.migrate import upgrade_url  # noqa: E402

TOKEN = "cli-memory-token"


def _seed(url: str) -> None:
    store = MemoryStore.open(url)
    try:
        store.put("facts", "paris", {"text": "Paris is the capital of France"}, op="s/1")
        store.put("facts", "berlin", {"text": "Berlin is the capital of Germany"}, op="s/2")
        store.put("facts", "ink", "[bold red]not markup[/] \x1b[31m", op="s/3")
        store.put("users.alice", "prefs", {"drink": "tea"}, op="s/4")
        store.link(("users.alice", "prefs"), "about", ("facts", "paris"), op="s/5")
    finally:
        store.close()


@pytest.fixture(scope="module")
def local() -> Iterator[Path]:
    """A data dir with memory and no server."""
    data_dir = short_dir("tfcm-")
    url = f"sqlite:///{data_dir / 'tiffany.db'}"
    upgrade_url(url)
    _seed(url)
    yield data_dir
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    server = serve(short_dir("tfcr-"), token=TOKEN)
    _seed(f"sqlite:///{server.data_dir / 'tiffany.db'}")
    yield server
    server.stop()


def tiffany(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiffany", *args],
        env=clean_env() | {"COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def on_dir(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return tiffany("--data-dir", str(data_dir), "memory", *args)


def on_url(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    return tiffany("memory", *args, "--url", served.url, "--token", TOKEN)


def test_local_commands_list_show_search_and_remove(local: Path) -> None:
    ls = on_dir(local, "ls")
    assert ls.returncode == 0, ls.stderr
    assert "facts" in ls.stdout
    assert "users.alice" in ls.stdout
    items = on_dir(local, "ls", "facts")
    assert items.returncode == 0, items.stderr
    assert items.stdout.index("berlin") < items.stdout.index("paris")
    # A value's markup and escapes are shown as text, not obeyed.
    assert "[bold red]not markup[/]" in items.stdout
    assert "\x1b" not in items.stdout

    got = on_dir(local, "get", "facts", "paris")
    assert got.returncode == 0, got.stderr
    assert "capital of France" in got.stdout
    assert "about" in got.stdout  # the neighbour linking in
    assert "users.alice / prefs" in got.stdout

    hits = json.loads(
        on_dir(local, "search", "facts", "capital of Germany", "-k", "1", "--json").stdout
    )
    assert [h["key"] for h in hits["items"]] == ["berlin"]
    assert hits["mode"] == "hybrid"
    table = on_dir(local, "search", "facts", "capital")
    assert table.returncode == 0, table.stderr
    assert "score" in table.stdout

    gone = on_dir(local, "rm", "facts", "ink")
    assert gone.returncode == 0, gone.stderr
    assert "deleted" in gone.stdout
    again = on_dir(local, "rm", "facts", "ink")
    assert again.returncode == 3, again.stderr
    assert "no item 'ink'" in again.stderr


def test_local_refusals_exit_with_the_tables_codes(local: Path) -> None:
    missing = on_dir(local, "get", "facts", "atlantis")
    assert missing.returncode == 3
    assert "no item 'atlantis' in namespace 'facts'" in missing.stderr
    bad_key = on_dir(local, "get", "facts", " padded")
    assert bad_key.returncode == 2
    assert "key" in bad_key.stderr
    bad_ns = on_dir(local, "ls", "no spaces")
    assert bad_ns.returncode == 2
    assert "namespace" in bad_ns.stderr
    bad_k = on_dir(local, "search", "facts", "x", "-k", "0")
    assert bad_k.returncode == 2
    assert "k" in bad_k.stderr
    empty = on_dir(local, "search", "facts", "  ")
    assert empty.returncode == 2
    assert "query" in empty.stderr.lower()


def test_remote_commands_answer_what_local_ones_do(served: Served, local: Path) -> None:
    here = json.loads(on_dir(local, "get", "users.alice", "prefs", "--json").stdout)
    there = on_url(served, "get", "users.alice", "prefs", "--json")
    assert there.returncode == 0, there.stderr
    remote = json.loads(there.stdout)
    for field in ("namespace", "key", "value", "version"):
        assert remote[field] == here[field]
    assert [(n["key"], n["direction"]) for n in remote["neighbors"]] == [("paris", "out")]
    ls = on_url(served, "ls")
    assert ls.returncode == 0, ls.stderr
    assert "users.alice" in ls.stdout
    hits = json.loads(on_url(served, "search", "facts", "capital of France", "--json").stdout)
    assert hits["items"][0]["key"] == "paris"
    removed = on_url(served, "rm", "facts", "berlin")
    assert removed.returncode == 0, removed.stderr
    assert on_url(served, "rm", "facts", "berlin").returncode == 3
    assert on_url(served, "get", "facts", "berlin").returncode == 3


def test_remote_refusals_exit_with_the_tables_codes(served: Served) -> None:
    bad_k = on_url(served, "search", "facts", "x", "-k", "101")
    assert bad_k.returncode == 2
    assert "k" in bad_k.stderr
    no_token = tiffany("memory", "ls", "--url", served.url)
    assert no_token.returncode == 2
    assert "--token" in no_token.stderr
    nobody = tiffany("memory", "ls", "--url", f"http://127.0.0.1:{free_port()}")
    assert nobody.returncode == 5
    assert "cannot reach" in nobody.stderr
