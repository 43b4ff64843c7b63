"""A private PostgreSQL schema for a benchmark's cells, made and dropped (shared by the benches)."""

from __future__ import annotations

import uuid
from typing import Any


def pg_schema(url: str, prefix: str) -> tuple[str, Any] | None:
    """A fresh schema ``<prefix>_<hex>`` and the URL that uses it, or None if unreachable.

    The second item is the handle :func:`drop_pg_schema` takes.
    """
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:  # reported, and the PostgreSQL cells skipped
        print(f"PostgreSQL not usable at {url}: {exc}")
        admin.dispose()
        return None
    scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    return scoped.render_as_string(hide_password=False), (admin, schema)


def drop_pg_schema(handle: Any) -> None:
    """Drop the schema :func:`pg_schema` made, with everything in it."""
    from sqlalchemy import text

    admin, schema = handle
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()
