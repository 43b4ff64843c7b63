"""Shared test fixtures.

Services: tests that need a real service (PostgreSQL, ...) ask for it through
:func:`require_service`. When the service is unreachable the test is skipped,
unless ``TIFFANY_REQUIRE_SERVICES=1`` (set by ``.ci/run``), in which case it
fails: CI must never go green by skipping the integration tests.

Nothing here touches the kernel: kernel fixtures (manual clock, recording
instrument) live with the kernel tests.
"""

from __future__ import annotations

import importlib
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from tiffany.config import Settings

REQUIRE_SERVICES_ENV = "TIFFANY_REQUIRE_SERVICES"

#: PostgreSQL the integration tests use (trust auth on the CI machine).
#: Override with TIFFANY_TEST_POSTGRES_URL.
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

#: Where tests may leave files for a person to inspect (screenshots, logs,
#: broken WAL copies). Git-ignored. Override with TIFFANY_TEST_ARTIFACTS.
DEFAULT_ARTIFACTS_DIR = Path(__file__).resolve().parent.parent / "test-artifacts"

SERVICE_CONNECT_TIMEOUT_S = 2.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put ``suite_order.SLOW_FILES_FIRST`` first, in order; each file keeps its tests' order."""
    from suite_order import SLOW_FILES_FIRST

    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    last = len(SLOW_FILES_FIRST)
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], last))


def services_required() -> bool:
    """Return True when missing services must fail tests instead of skip them."""
    return os.environ.get(REQUIRE_SERVICES_ENV, "").strip() == "1"


def _unavailable(reason: str) -> None:
    if services_required():
        pytest.fail(f"{reason} ({REQUIRE_SERVICES_ENV}=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def unavailable() -> Callable[[str], None]:
    """``unavailable(reason)``: skip, or fail under ``TIFFANY_REQUIRE_SERVICES=1``."""
    return _unavailable


def require_service(name: str, host: str, port: int) -> None:
    """Skip the calling test unless ``host:port`` accepts TCP connections.

    With ``TIFFANY_REQUIRE_SERVICES=1`` the test fails instead of skipping.

    Args:
        name: Human name of the service, for the message ("PostgreSQL").
        host: Host to connect to.
        port: TCP port to connect to.
    """
    try:
        with socket.create_connection((host, port), timeout=SERVICE_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        _unavailable(f"{name} is not reachable at {host}:{port}: {exc}")


def require_module(module: str, why: str) -> None:
    """Skip (or, with ``TIFFANY_REQUIRE_SERVICES=1``, fail) if ``module`` is missing."""
    try:
        importlib.import_module(module)
    except ImportError:
        _unavailable(f"{module} is not installed ({why})")


@pytest.fixture(name="require_service")
def require_service_fixture() -> Callable[[str, str, int], None]:
    """The :func:`require_service` helper, for tests that prefer a fixture."""
    return require_service


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of a reachable PostgreSQL test database (skips or fails otherwise).

    The database is shared: a test creates its own tables or schema and drops
    them, and never assumes the database is empty.
    """
    url = os.environ.get("TIFFANY_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    parts = urlsplit(url)
    require_module("psycopg", "pip install -e '.[postgres]'")
    require_service("PostgreSQL", parts.hostname or "127.0.0.1", parts.port or 5432)
    return url


@contextmanager
def _pg_schema(postgres_url: str, prefix: str, *, migrate: bool) -> Iterator[str]:
    """A private schema in the shared test database; yields a URL whose connections use it."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from tiffany.store import make_engine

    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = make_engine(postgres_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(postgres_url).update_query_dict({"options": f"-csearch_path={schema}"})
    rendered = url.render_as_string(hide_password=False)
    try:
        if migrate:
            from tiffany.store.migrate import upgrade

            engine = make_engine(rendered)
            upgrade(engine)
            engine.dispose()
        yield rendered
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def pg_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose connections use a fresh, empty schema (dropped afterwards)."""
    with _pg_schema(postgres_url, "test", migrate=False) as url:
        yield url


@pytest.fixture
def pg_migrated_url(postgres_url: str) -> Iterator[str]:
    """A URL whose connections use a fresh schema with the tables (``tiffany db upgrade``)."""
    with _pg_schema(postgres_url, "test", migrate=True) as url:
        yield url


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Default settings with a fresh data dir, blind to the caller's environment.

    The ``TIFFANY_*`` variables that name settings are removed for the test, so
    a developer's own configuration cannot leak into it.
    """
    from tiffany.config import ENV_PREFIX, Settings

    for field in Settings.model_fields:
        monkeypatch.delenv(f"{ENV_PREFIX}{field.upper()}", raising=False)
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """A directory kept after the run for files a person may want to look at."""
    path = Path(os.environ.get("TIFFANY_TEST_ARTIFACTS", DEFAULT_ARTIFACTS_DIR))
    path.mkdir(parents=True, exist_ok=True)
    return path
