"""The documented-commands check fails on a wrong command, naming its file and line.

A page of commands that are each wrong in one of the ways the README and
docs/ once were (a synopsis with placeholders, a pipe into ``tiffany``, a
package name that is not this project, an extra pyproject.toml lacks, an
option a command does not take, a file that is not there, a sample output
with a field the real one lacks), and a few right ones beside them: each
wrong one is refused, each right one passes. The checks are the ones
``test_readme_commands.py`` and ``test_docs_commands.py`` apply.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_commands import REPO, Session, base_env, check, commands_of

PAGE = """\
# A page

```sh
tiffany submit PLAN [--input k=v]                 # a synopsis
tiffany cancel RUN_ID | tiffany status            # a pipe that does nothing
pip install 'tiffany[otel]'                       # not this project
pip install -e '.[telemetry]'                     # no such extra
tiffany serve --demo --prot 8000                  # a misspelt option of a serving command
tiffany run examples/nope/plan.yaml               # no such file
python bench/ring.py --originator fixed --nope    # no such option
make runn                                         # no such target
```

```console
$ echo '{"run_id": "run-0123456789ab"}'
{"run_id":"run-0123456789ab","seq":1042}
```

```sh
make run                                          # right: a dry run
tiffany serve --demo --port 8000                  # right: parsed
pip install -e '.[otel]'                          # right: this checkout, a real extra
python bench/ring.py --originator fixed --journal # right: its --help
tiffany plan graph examples/build/plan.yaml       # right: run
```
"""

WRONG = {
    4: "is no value: a synopsis",
    5: "a pipe into tiffany",
    6: "is not this checkout",
    7: "no extra 'telemetry'",
    8: "No such option: --prot",
    9: "exited 2",
    10: "--nope is not an option of it",
    11: "exited 2",
    15: "the sample shows 'seq'; the output has not",
}


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("page") / "page.md"
    path.write_text(PAGE)
    return path


def test_each_wrong_command_is_refused_naming_its_line_and_the_right_ones_pass(page: Path) -> None:
    # Nothing here writes: dry runs, parses, --help, and one plan drawn.
    session = Session(REPO, base_env())
    session.ids["RUN_ID"] = "run-0123456789ab"
    refused: dict[int, str] = {}
    for command in commands_of(page, "page.md"):
        try:
            check(session, command)
        except AssertionError as exc:
            refused[command.line] = str(exc)
    assert sorted(refused) == sorted(WRONG), refused
    for line, why in WRONG.items():
        assert why in refused[line], (line, refused[line])
        assert refused[line].startswith(f"page.md:{line}"), refused[line]
