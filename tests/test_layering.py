"""Layers import downwards only (docs/style.md rule 1, docs/architecture.md "Layers").

Every module under ``tiffany/`` is parsed with :mod:`ast` (nothing is
imported) and each import it contains is checked against :data:`LAYERS`: which
Tiffany packages a package may import, and, for the packages that must stay
lean, which third-party distributions. Every import counts, including imports
inside functions and under ``if TYPE_CHECKING:``: a lazy or type-only import is
still a dependency in the design.

A new top-level package or module under ``tiffany/`` fails this test until it
is given a row in :data:`LAYERS`: placing it in the layer order is a decision,
not a default.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "tiffany"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / PACKAGE


@dataclass(frozen=True)
class Layer:
    """What one top-level part of ``tiffany`` may import.

    Attributes:
        may_import: Tiffany parts it may import (``"kernel"`` for
            ``tiffany.kernel``); ``ANYTHING`` for the composition roots. Its
            own part and the ``tiffany`` root (only ``__version__``) are
            always allowed.
        third_party: Top-level names of the non-stdlib libraries it may import,
            or None for "any library".
    """

    may_import: frozenset[str]
    third_party: frozenset[str] | None = None


def _parts(*names: str) -> frozenset[str]:
    return frozenset(names)


ANYTHING = _parts("*")
STDLIB_ONLY = _parts()
BOTTOM_LIBS = _parts("pydantic", "pydantic_settings", "structlog")
CODEC_LIBS = _parts("msgspec", "crc32c", "google_crc32c", "orjson", "cbor2")

#: The layer table, bottom to top. "" is the root ``tiffany/__init__.py``: it
#: imports nothing at import time, because every ``import tiffany.x`` runs it
#: first and the API process must not pull in the kernel through it; its
#: module ``__getattr__`` imports the public names (the SDK's ``Client``, the
#: agents' ``python_tool``) on first use (tests/sdk/test_lazy_root.py).
LAYERS: dict[str, Layer] = {
    "": Layer(_parts("sdk", "agents", "workflows"), STDLIB_ONLY),
    # Bottom: the error tree, settings, logging setup.
    "errors": Layer(STDLIB_ONLY, STDLIB_ONLY),
    "config": Layer(_parts("errors", "wire.shards", "wire.redaction"), BOTTOM_LIBS),
    "log": Layer(_parts("errors", "config", "wire.redaction"), BOTTOM_LIBS),
    # What crosses a process or the network, typed once (plans' shape, statuses,
    # records, control commands, documents): leaves every room may import (WIRE
    # below), the API and the SDK included.
    "wire": Layer(STDLIB_ONLY, _parts("pydantic", "msgspec")),
    # Engines' shares of one data dir or database: seq ranges, homes, streams.
    "wire.shards": Layer(STDLIB_ONLY, STDLIB_ONLY),
    # Credentials in URLs masked wherever text is shown (logs, settings, SDK, CLI).
    "wire.redaction": Layer(STDLIB_ONLY, STDLIB_ONLY),
    # Values from outside a run as the journal packs them and a replay compares them.
    "wire.values": Layer(STDLIB_ONLY, _parts("msgspec")),
    # The journal's records: one typed definition every reader and writer imports.
    "wire.records": Layer(_parts("errors", "wire.values", "wire.entries"), _parts("msgspec")),
    # A run's entry (RUN_START's), read once into its typed kind: every reader imports it.
    "wire.entries": Layer(_parts("errors"), _parts("msgspec")),
    # What the records say of a run and its steps: the one reading every fold uses.
    "wire.runstate": Layer(_parts("wire"), STDLIB_ONLY),
    # The control channel's protocol and clients (engine <- API commands).
    "wire.control": Layer(_parts("errors"), CODEC_LIBS),
    # Bounded JSON/YAML documents: limits on depth, size, numbers, strings.
    "wire.documents": Layer(_parts("errors"), _parts("yaml")),
    # The kernel knows nothing of WAL, PAL, database or HTTP.
    "kernel": Layer(_parts("errors"), _parts("structlog")),
    "io": Layer(_parts("errors", "kernel")),
    # The WAL treats payloads as opaque bytes.
    "wal": Layer(_parts("errors"), CODEC_LIBS | _parts("structlog")),
    # The WAL's records as rows of a PostgreSQL stream, under a fenced lease.
    "wal.pg": Layer(
        _parts("errors", "config", "wal"),
        _parts("psycopg", "psycopg_pool", "structlog", "tenacity"),
    ),
    "durable": Layer(_parts("errors", "kernel", "wal")),
    # The activity feed: events, hub, rings, transports, the API's relay.
    "feed": Layer(_parts("errors")),
    # The engine's side: the instrument that turns dispatches into events.
    "feed.activity": Layer(_parts("errors", "kernel", "durable", "feed")),
    # The feed over PostgreSQL (LISTEN/NOTIFY and the journal's rows).
    "feed.pg": Layer(_parts("errors", "feed", "wal.pg", "store")),
    # The relay's sources: what it asks of one, and the engines' feed sockets.
    "feed.upstream": Layer(_parts("errors", "feed")),
    "feed.relay": Layer(_parts("errors", "feed", "feed.upstream")),
    "store": Layer(_parts("errors", "config", "store.session")),
    # The store's engines and sessions: what a room that keeps its own tables
    # in the store's database (memory) may take without the models.
    "store.session": Layer(_parts("errors")),
    # Child processes started, restarted after backoff, stopped; the
    # parent-death lifeline (serve's engines and API, an engine's projector).
    "supervisor": Layer(STDLIB_ONLY, _parts("structlog", "tenacity")),
    # The journal folded into the store, and the process that tails it.
    "projector": Layer(_parts("errors", "config", "log", "wal", "wal.pg", "store", "supervisor")),
    # records: only TaskLabel, the role and plan step a spawned task serves.
    "agents": Layer(_parts("errors", "kernel", "io")),
    # Users' durable code: @workflow, its run-level calls (tool, signal, child, patched).
    "workflows": Layer(_parts("errors", "kernel", "agents")),
    # Data only: the plans that ship with Tiffany (the demo plan).
    "plans": Layer(STDLIB_ONLY, STDLIB_ONLY),
    # Agent memory (the MemoryStore): items, links, search; in the store's
    # database, beside the store's session glue, not its models.
    "memory": Layer(
        _parts("errors", "config", "log", "kernel", "store.session"),
        _parts("sqlalchemy", "numpy", "threadpoolctl", "httpx"),
    ),
    # Metrics and spans: what the system says about itself.
    "observe": Layer(_parts("errors", "kernel", "durable", "feed")),
    # Schedules: specs, their rows, the runner (it submits through the control channel).
    "schedules": Layer(_parts("errors", "config", "store", "projector")),
    # One interface per cross-process concept (feed source, watermark, reads,
    # commands), a socket and a PostgreSQL implementation each, chosen once at start.
    "ports": Layer(_parts("errors", "config", "wire", "store", "feed", "projector")),
    # The engines' journals as readers and operators see them (files or streams):
    # what the engine's verifier, serve and the CLI ask instead of the backend.
    "ports.journals": Layer(_parts("errors", "config", "wal")),
    # Composition root of the engine process: everything below the API.
    "engine": Layer(
        _parts(
            "errors",
            "config",
            "log",
            "kernel",
            "io",
            "wal",
            "durable",
            "feed",
            "store",
            "projector",
            "agents",
            "memory",
            "observe",
            "schedules",
            "supervisor",
            "workflows",
            "ports.journals",
        )
    ),
    # The API side-process never imports kernel, wal, durable or agents.
    "api": Layer(
        _parts(
            "errors",
            "config",
            "log",
            "store",
            "feed",
            "projector",
            "observe",
            "schedules",
            "ports",
            "memory",
        )
    ),
    # The Python SDK: a client of the HTTP API, never of the server's modules.
    "sdk": Layer(_parts("errors"), _parts("httpx", "websockets", "pydantic", "tenacity")),
    # Users' tests: replay an exported run with the engine's resolvers.
    "testing": Layer(_parts("errors", "config", "durable", "engine")),
    "cli": Layer(ANYTHING),
    "__main__": Layer(_parts("cli")),
}


#: ``wire`` is below every room but the stdlib-only bottom and the root.
_NOT_ON_WIRE: frozenset[str] = _parts(
    "", "errors", "config", "log", "plans", *(k for k in LAYERS if k.split(".")[0] == "wire")
)
for _name, _layer in list(LAYERS.items()):
    if _name not in _NOT_ON_WIRE and _layer.may_import != ANYTHING:
        LAYERS[_name] = Layer(_layer.may_import | {"wire"}, _layer.third_party)


def allows(may_import: frozenset[str], other: str) -> bool:
    """True if a row's ``may_import`` covers ``other`` (a row covers its sub-rows)."""
    return any(other == name or other.startswith(f"{name}.") for name in may_import)


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    """Return the dotted module name of a file under ``package_dir``."""
    rel = path.relative_to(package_dir).with_suffix("")
    parts = [PACKAGE, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    """Return the layer key of a ``tiffany`` module ("" for the root).

    The longest dotted prefix with a row wins: ``tiffany.wal.pg.x`` is
    ``wal.pg``, ``tiffany.wal.writer`` is ``wal``.
    """
    pieces = module.split(".")[1:]
    for n in range(len(pieces), 0, -1):
        key = ".".join(pieces[:n])
        if key in LAYERS:
            return key
    return pieces[0] if pieces else ""


def imported_modules(
    module: str, tree: ast.AST, *, is_package: bool, package_dir: Path
) -> list[tuple[int, str]]:
    """Return ``(line, absolute module name)`` for every import in ``tree``."""
    found: list[tuple[int, str]] = []
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                keep = len(here) - (node.level - 1)
                if keep < 1:
                    found.append((node.lineno, "." * node.level + (node.module or "")))
                    continue
                base = ".".join(here[:keep])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target == PACKAGE:
                # `from tiffany import kernel` imports tiffany.kernel;
                # `from tiffany import __version__` only the root.
                for alias in node.names:
                    name = alias.name
                    is_part = (
                        name in LAYERS
                        or (package_dir / name).is_dir()
                        or (package_dir / f"{name}.py").is_file()
                    )
                    found.append((node.lineno, f"{PACKAGE}.{name}" if is_part else PACKAGE))
            else:
                found.append((node.lineno, target))
    return found


def check_source(
    module: str,
    source: str,
    *,
    is_package: bool = False,
    filename: str = "<source>",
    package_dir: Path = PACKAGE_DIR,
) -> list[str]:
    """Return the layering violations of one module's source (empty if none).

    Args:
        module: Dotted name of the module, e.g. ``tiffany.kernel.task``.
        source: Its Python source.
        is_package: True for an ``__init__.py`` (relative imports resolve
            against the package itself).
        filename: Used in messages.
        package_dir: The ``tiffany`` directory, to tell subpackages from names.
    """
    part = part_of(module)
    layer = LAYERS.get(part)
    if layer is None:
        return [
            f"{filename}: {PACKAGE}.{part} is not in the layer table; add a row "
            f"for it to LAYERS in tests/test_layering.py (see docs/architecture.md)"
        ]
    tree = ast.parse(source, filename=filename)
    problems: list[str] = []
    for line, target in imported_modules(
        module, tree, is_package=is_package, package_dir=package_dir
    ):
        where = f"{filename}:{line}: {module} imports {target}"
        if target.startswith("."):
            problems.append(f"{where}: relative import beyond the {PACKAGE} package")
        elif target == PACKAGE or target.startswith(f"{PACKAGE}."):
            other = part_of(target)
            if other in ("", part) or layer.may_import == ANYTHING:
                continue
            if not allows(layer.may_import, other):
                allowed = ", ".join(sorted(layer.may_import)) or "no other tiffany package"
                problems.append(f"{where}: {PACKAGE}.{part or '<root>'} may import only: {allowed}")
        else:
            top = target.split(".")[0]
            if top in sys.stdlib_module_names or layer.third_party is None:
                continue
            if top not in layer.third_party:
                allowed = ", ".join(sorted(layer.third_party)) or "the standard library"
                problems.append(f"{where}: {PACKAGE}.{part or '<root>'} may use only {allowed}")
    return problems


def check_tree(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Return the layering violations of every module under ``package_dir``."""
    problems: list[str] = []
    for path in sorted(package_dir.rglob("*.py")):
        problems.extend(
            check_source(
                module_name(path, package_dir),
                path.read_text(encoding="utf-8"),
                is_package=path.name == "__init__.py",
                filename=str(path.relative_to(package_dir.parent)),
                package_dir=package_dir,
            )
        )
    return problems


# -- The real tree --------------------------------------------------------------


def test_tiffany_imports_only_downwards() -> None:
    problems = check_tree()
    assert not problems, "upward or unlisted imports:\n" + "\n".join(problems)


def test_the_tree_is_actually_scanned() -> None:
    modules = {module_name(p) for p in PACKAGE_DIR.rglob("*.py")}
    assert {"tiffany", "tiffany.errors", "tiffany.config", "tiffany.cli"} <= modules


def test_layer_table_names_only_known_parts() -> None:
    for part, layer in LAYERS.items():
        if layer.may_import != ANYTHING:
            unknown = {n for n in layer.may_import if n not in LAYERS}
            assert not unknown, f"LAYERS[{part!r}] names unknown parts {unknown}"


# -- The checker itself, on synthetic modules --------------------------------------

# "tiffany.kernel.__init__" stands for the package tiffany.kernel itself.
BAD = {
    "kernel-imports-wal": ("tiffany.kernel.task", "import tiffany.wal.writer"),
    "from-root-import-part": ("tiffany.kernel.task", "from tiffany import wal"),
    "relative-upward": ("tiffany.kernel.task", "from ..wal.writer import W"),
    "package-relative-upward": ("tiffany.kernel.__init__", "from ..api import app"),
    "kernel-third-party": ("tiffany.kernel.task", "import sqlalchemy"),
    "kernel-imports-log": ("tiffany.kernel.task", "from tiffany.log import setup"),
    "wal-imports-kernel": ("tiffany.wal.writer", "from tiffany.kernel import Sleep"),
    "wal-third-party": ("tiffany.wal.writer", "import sqlalchemy.orm"),
    "io-imports-agents": ("tiffany.io.sockets", "from tiffany.agents import tools"),
    "api-imports-kernel": ("tiffany.api.app", "from tiffany.kernel import Scheduler"),
    "api-imports-engine": ("tiffany.api.app", "from tiffany.engine import Engine"),
    "type-checking-import-counts": (
        "tiffany.api.app",
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from tiffany.durable import Journal\n",
    ),
    "lazy-import-counts": ("tiffany.store.models", "def f():\n    import tiffany.engine\n"),
    "engine-imports-api": ("tiffany.engine.root", "from tiffany.api import create_app"),
    "config-imports-kernel": ("tiffany.config", "from tiffany.kernel import Scheduler"),
    "root-imports-kernel": ("tiffany.__init__", "from tiffany.kernel import Scheduler"),
    "errors-third-party": ("tiffany.errors", "import pydantic"),
    "unknown-package": ("tiffany.widgets", "import os"),
    "wire-imports-store": ("tiffany.wire.status", "from tiffany.store import RunStatus"),
    "wire-imports-errors": ("tiffany.wire.plan", "from tiffany.errors import TiffanyError"),
    "wire-third-party": ("tiffany.wire.plan", "import sqlalchemy"),
    "errors-imports-wire": ("tiffany.errors", "from tiffany.wire.status import TERMINAL"),
    "relative-beyond-package": ("tiffany.kernel.task", "from .... import x"),
    # Dotted rows: a room's sub-row is its own layer, the room does not reach up into it.
    "wal-imports-its-pg-row": ("tiffany.wal.writer", "from tiffany.wal.pg import PgWal"),
    "wal-pg-imports-store": ("tiffany.wal.pg", "from tiffany.store import models"),
    "feed-hub-imports-store": ("tiffany.feed.hub", "from tiffany.store import models"),
    "feed-imports-ports": ("tiffany.feed.relay", "from tiffany.ports.feed import FeedSource"),
    "ports-import-api": ("tiffany.ports.reads", "from tiffany.api.deps import ApiState"),
    "ports-import-kernel": ("tiffany.ports.commands", "from tiffany.kernel import Scheduler"),
    "ports-import-api-pg": ("tiffany.ports.commands", "from tiffany.api.deps import ApiState"),
    "ports-import-engine": ("tiffany.ports.commands", "from tiffany.engine import Engine"),
}

GOOD = {
    "kernel-errors": ("tiffany.kernel.task", "from tiffany.errors import KernelError"),
    "kernel-relative": ("tiffany.kernel.task", "from . import calls\nfrom .calls import Sleep"),
    "package-relative": ("tiffany.kernel.__init__", "from .scheduler import Scheduler"),
    "kernel-stdlib-structlog": (
        "tiffany.kernel.task",
        "from __future__ import annotations\nimport selectors, structlog",
    ),
    "io-kernel": ("tiffany.io.sockets", "from tiffany.kernel import ReadWait"),
    "wal-codecs": (
        "tiffany.wal.frame",
        "import crc32c\nimport msgspec\nfrom ..errors import WalError",
    ),
    "durable": (
        "tiffany.durable.journal",
        "from tiffany.wal import Writer\nfrom tiffany.kernel import Instrument",
    ),
    "api": (
        "tiffany.api.app",
        "import fastapi\nfrom tiffany.store import models\nfrom tiffany.feed.events import E",
    ),
    "engine": ("tiffany.engine.__init__", "from tiffany import agents, durable, kernel, store"),
    "cli-anything": (
        "tiffany.cli",
        "def serve():\n    from tiffany.api import create_app\n    from tiffany.engine import run",
    ),
    "wire-leaf": ("tiffany.wire.plan", "import msgspec\nfrom pydantic import BaseModel"),
    "sdk-wire": ("tiffany.sdk.models", "from tiffany.wire.status import RunStatusName"),
    "api-wire": ("tiffany.api.schemas", "from tiffany.wire.plan import Plan"),
    "kernel-wire": ("tiffany.kernel.task", "from tiffany.wire import status"),
    "wal-pg-uses-wal": ("tiffany.wal.pg", "import psycopg\nfrom tiffany.wal.format import F"),
    "sub-row-covered": ("tiffany.engine.x", "from tiffany.wal.pg import PgWal"),
    "api-ports": ("tiffany.api.app", "from tiffany.ports.feed import feed_source"),
    "ports-feed-store": (
        "tiffany.ports.watermark",
        "from tiffany.feed.pg import PgFeed\nfrom tiffany.store.models import PROJECTED_CHANNEL",
    ),
    "root-version": (
        "tiffany.log",
        "from tiffany import __version__\nfrom tiffany.config import Settings",
    ),
}


def _check(module: str, source: str) -> list[str]:
    is_package = module.endswith(".__init__")
    return check_source(module.removesuffix(".__init__"), source, is_package=is_package)


@pytest.mark.parametrize(("module", "source"), BAD.values(), ids=BAD.keys())
def test_checker_rejects_upward_import(module: str, source: str) -> None:
    assert _check(module, source), f"{module} should not be allowed: {source!r}"


@pytest.mark.parametrize(("module", "source"), GOOD.values(), ids=GOOD.keys())
def test_checker_accepts_downward_import(module: str, source: str) -> None:
    assert _check(module, source) == []


def test_checker_reports_file_and_line_in_a_tree(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    (pkg / "kernel").mkdir(parents=True)
    (pkg / "wal").mkdir()
    (pkg / "__init__.py").write_text('__version__ = "0"\n')
    (pkg / "errors.py").write_text("class TiffanyError(Exception): ...\n")
    (pkg / "wal" / "__init__.py").write_text("")
    (pkg / "kernel" / "__init__.py").write_text("from .scheduler import Scheduler\n")
    (pkg / "kernel" / "scheduler.py").write_text(
        "import heapq\n\nfrom tiffany.errors import TiffanyError\nfrom tiffany.wal import Writer\n"
    )
    problems = check_tree(pkg)
    assert len(problems) == 1
    assert problems[0].startswith(
        "tiffany/kernel/scheduler.py:4: tiffany.kernel.scheduler imports tiffany.wal"
    )
