"""``redact_url_credentials``: the one rule for credentials in URLs, in any text."""

from __future__ import annotations

import json

import pytest

from tiffany.log import redact_text
from tiffany.wire.redaction import REDACTED, redact_url_credentials


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://ann:pw@h:1/p", f"http://ann:{REDACTED}@h:1/p"),
        ("postgresql+psycopg://u:p%40ss@db/x", f"postgresql+psycopg://u:{REDACTED}@db/x"),
        ("clone https://ghp_tok@github.com/o/r", f"clone https://{REDACTED}@github.com/o/r"),
        ("ws://h/ws/activity?run_id=r&token=abc", f"ws://h/ws/activity?run_id=r&token={REDACTED}"),
        ("GET http://h/x?API_KEY=k&n=1 -> 404", f"GET http://h/x?API_KEY={REDACTED}&n=1 -> 404"),
        ("write to ann@example.com", "write to ann@example.com"),  # not a URL's userinfo
        ("http://h:8000/api/runs?min_seq=3", "http://h:8000/api/runs?min_seq=3"),
    ],
)
def test_credentials_of_urls_are_masked_and_the_rest_kept(text: str, shown: str) -> None:
    assert redact_url_credentials(text) == shown


def test_a_line_already_rendered_as_json_stays_json() -> None:
    line = json.dumps({"event": 'WebSocket "/ws?token=abc" at http://u:p@h/', "n": 1})
    masked = redact_url_credentials(line)
    assert (
        json.loads(masked)["event"] == f'WebSocket "/ws?token={REDACTED}" at http://u:{REDACTED}@h/'
    )


def test_log_lines_take_the_same_rule() -> None:
    assert (
        redact_text("connect postgresql://app:pw@db/x")
        == f"connect postgresql://app:{REDACTED}@db/x"
    )
