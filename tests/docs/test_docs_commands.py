"""Every shell command of docs/*.md, each page in its order, beside ``make run``'s server.

One test per command, named by its file and line. Each page is a session
of its own (its exports, ids and sample values do not reach another page)
on one fresh copy of the repository that ``make run``'s ``tiffany serve``
serves. How each command is checked is in ``doc_commands.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from doc_commands import Command, Session, all_commands, check, served_copy, unserved_copy

COMMANDS = all_commands(readme=False)


@pytest.fixture(scope="module")
def served() -> Iterator[Session]:
    with served_copy("tfdd-") as session:
        yield session


@pytest.fixture(scope="module")
def unserved() -> Iterator[Session]:
    with unserved_copy("tfdv-") as session:
        yield session


@pytest.fixture(scope="module")
def pages() -> dict[str, Session]:
    """Each page's own session (a fork of the served or unserved one, made at its first command)."""
    return {}


def test_the_docs_have_commands_to_check() -> None:
    assert {c.file for c in COMMANDS} >= {"docs/clock.md", "docs/observability.md", "docs/sdk.md"}


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_docs_command_works_as_written(
    command: Command, pages: dict[str, Session], request: pytest.FixtureRequest
) -> None:
    key = f"{command.file} {command.without_server}"
    if key not in pages:
        base = request.getfixturevalue("unserved" if command.without_server else "served")
        pages[key] = base.fork()
    check(pages[key], command)
