"""Logging: one renderer for ours and the libraries' records."""

from __future__ import annotations

import io
import json
import logging

import structlog

from tiffany.log import configure_logging


def _lines(buf: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_json_lines_for_ours_and_foreign_records() -> None:
    buf = io.StringIO()
    configure_logging(log_format="json", log_level="INFO", stream=buf)
    try:
        structlog.get_logger("tiffany.test").info("run.started", run_id="run-1", task_id=3)
        logging.getLogger("uvicorn.error").info(
            "Uvicorn running on %s", "http://x", extra={"color_message": "\x1b[1mcoloured\x1b[0m"}
        )
        logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
        logging.getLogger("alembic.runtime.migration").warning("something odd")
        ours, uvicorn, alembic = _lines(buf)
    finally:
        configure_logging(log_format="console")  # back to stderr for the tests after this one
    assert ours["event"] == "run.started"
    assert (ours["run_id"], ours["task_id"], ours["level"]) == ("run-1", 3, "info")
    assert uvicorn["event"] == "Uvicorn running on http://x"
    assert uvicorn["logger"] == "uvicorn.error"
    assert "color_message" not in uvicorn
    # Alembic's INFO narration is dropped; its warnings are kept.
    assert alembic["event"] == "something odd"


def test_the_default_handler_follows_a_swapped_stderr(monkeypatch) -> None:
    """Lines go to the standard error of the moment, not the one seen at configuration."""
    import sys

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging(log_format="json", log_level="INFO")
    try:
        first.close()  # what pytest's capture does to a finished test's stream
        monkeypatch.setattr(sys, "stderr", second)
        structlog.get_logger("tiffany.test").info("after.swap")
        assert [line["event"] for line in _lines(second)] == ["after.swap"]
    finally:
        monkeypatch.undo()
        configure_logging(log_format="console")
