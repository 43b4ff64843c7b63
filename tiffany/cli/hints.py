"""The options a command the CLI prints as a hint must repeat.

A hint (``tiffany replay RUN`` resumes it, ``tiffany signal RUN NAME``
sends it) is the next command a user types, perhaps in another shell. It
finds nothing unless it names what this command used: a data dir other than
the default (given with ``--data-dir``, or chosen by ``tiffany run`` beside
a server), the server of ``--url``, the modules of ``--import``. Every hint
takes its options from :func:`again`, so none forgets one.

Discussion: a data dir given by ``TIFFANY_DATA_DIR`` is repeated too (the
hint cannot know the next shell has the variable); a token never is (it is
a secret: the hint says ``--token T`` when one was given on the command
line, and nothing when it came from ``TIFFANY_API_TOKEN``).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path

__all__ = ["again", "shown_path"]

#: The data dir a command uses when nothing names one (``Settings.data_dir``'s default).
DEFAULT_DATA_DIR = Path(".tiffany")


def shown_path(path: Path) -> str:
    """``path`` as a user types it: relative to the working directory when under it."""
    absolute = path.expanduser().absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def again(
    data_dir: Path | None = None,
    *,
    imports: Iterable[str] = (),
    url: str | None = None,
    token_given: bool = False,
) -> str:
    """The options a hinted command needs, each after a space (empty when it needs none).

    Args:
        data_dir: This command's data dir (``settings.data_dir``): named
            unless it is the default one.
        imports: Tool modules the run's python steps need (``--import MOD``).
        url: The server this command reached (``--url URL``), unless the
            URL came from ``TIFFANY_URL``.
        token_given: Whether ``--token`` was on the command line (named as
            ``--token T``, never its value).
    """
    parts: list[str] = []
    if data_dir is not None and Path(data_dir).absolute() != DEFAULT_DATA_DIR.absolute():
        parts += ["--data-dir", shlex.quote(shown_path(Path(data_dir)))]
    for module in imports:
        parts += ["--import", shlex.quote(module)]
    if url:
        parts += ["--url", shlex.quote(url)]
    if token_given:
        parts += ["--token", "T"]
    return "".join(f" {part}" for part in parts)
