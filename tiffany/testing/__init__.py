"""Test helpers for users' code: replay exported production runs in CI.

A team keeps a few runs as fixtures (``tiffany export RUN -o
tests/runs/RUN.tfx``) and checks, before a deploy, that the code as it is
now replays each of them exactly::

    from tiffany.testing import replay_file

    def test_production_runs_still_replay():
        for path in Path("tests/runs").glob("*.tfx"):
            replay_file(path, imports=["myapp.tools"])

A change that alters what a run's code yields (a step added, arguments
changed, a ``Now()`` read moved) would break the runs in flight when the
new code resumes them: :func:`replay_file` raises
:class:`~tiffany.errors.NondeterminismError` naming the first divergence
(run, task, dispatch, the journal's seq, expected and actual call, the
code's stack). docs/replay.md has the recipe.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tiffany.durable.export import read_export, verify_export
from tiffany.durable.runtime import Resolver, VerifyReport
from tiffany.errors import NondeterminismError

__all__ = ["ReplayProblem", "replay_file"]


class ReplayProblem(AssertionError):
    """An export did not replay, for a reason other than a divergence.

    The run's entry kind has no resolver here (its module was not
    imported), or its replay ended otherwise than the journal says.
    """


def replay_file(
    path: str | os.PathLike[str],
    imports: Iterable[str] = (),
    *,
    resolvers: dict[str, Resolver] | None = None,
) -> VerifyReport:
    """Replay an exported run against the code as it is now; raise unless it matches.

    Args:
        path: A file written by ``tiffany export``.
        imports: Modules to import first (the ``--import`` of ``tiffany
            replay``): where the run's ``@python_tool`` functions, generator
            functions or workflows are registered.
        resolvers: Runners besides ``callable`` (default: the engine's,
            ``tiffany.engine.replay_resolvers``: ``workflow``, which rebuilds
            plan runs, the built-in workflow ``plan``, and users' workflows).

    Returns:
        The report (``partial`` for a run exported before its end: its
        recorded dispatches were reproduced).

    Raises:
        NondeterminismError: The replay diverged; the message names the
            first divergence, its fields say where (``seq``: the record's
            seq in the journal the run was exported from).
        ExportError: The file is not an export, or is damaged or truncated
            (names the byte offset); ExportTooNew: a newer format.
        ReplayProblem: The run could not be replayed (see the class).
    """
    for name in imports:
        importlib.import_module(name)
    export = read_export(path)
    if resolvers is None:
        resolvers = _engine_resolvers()
    report = verify_export(export, resolvers)
    if report.ok:
        return report
    d = report.divergence
    if d is not None:
        fields: dict[str, Any] = {k: v for k, v in d.items() if k not in ("code", "message")}
        raise NondeterminismError(f"{export.path}: {d.get('message')}", **fields)
    raise ReplayProblem(f"{export.path}: run {export.meta.run_id}: " + "; ".join(report.problems))


def _engine_resolvers() -> dict[str, Resolver]:
    """The resolvers a local replay has (plans: tools known, none run), outside any data dir."""
    from tiffany.config import Settings
    from tiffany.engine import replay_resolvers

    # Nothing runs in a verify; the workspaces dir a plan env names is never made.
    return replay_resolvers(Settings(data_dir=Path(tempfile.gettempdir())))
