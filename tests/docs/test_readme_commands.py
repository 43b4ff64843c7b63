"""Every shell command of README.md, in order, on a fresh copy while ``make run`` serves.

One test per command, named by its file and line (``README.md:97``), run in
the README's order against one session: a fresh copy of the repository
whose ``./.tiffany`` a ``tiffany serve`` serves, started as ``make run``
starts it. How each command is checked (run for real, parsed, dry-run,
``--help``) is in ``doc_commands.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from doc_commands import Command, Session, all_commands, check, served_copy, unserved_copy

COMMANDS = all_commands(readme=True)


@pytest.fixture(scope="module")
def served() -> Iterator[Session]:
    with served_copy("tfdr-") as session:
        yield session


@pytest.fixture(scope="module")
def unserved() -> Iterator[Session]:
    with unserved_copy("tfdu-") as session:
        yield session


def test_the_readme_has_commands_to_check() -> None:
    assert len(COMMANDS) > 30
    assert any(c.without_server for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_readme_command_works_as_written(command: Command, request: pytest.FixtureRequest) -> None:
    session = request.getfixturevalue("unserved" if command.without_server else "served")
    check(session, command)
