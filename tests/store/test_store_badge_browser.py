"""The dashboard's store badge in a real browser: quarantined records are shown.

A data dir whose WAL holds a record that cannot be projected (a payload
that does not decode), served by ``tiffany serve``: the projector
quarantines it and ``/readyz`` reports one dead letter; the page's store
badge, beside the connection status, says so. Skipped when chromium or
Playwright is missing, unless ``TIFFANY_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from store_support import get_json, serve, wait_for

from tiffany.store import RecordType


def test_the_store_badge_shows_dead_letters(
    tmp_path: Path, unavailable: Callable[[str], None]
) -> None:
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[dev]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        unavailable("chromium is not installed (apt-get install chromium)")
    from tiffany.wal import Wal

    data = tmp_path / "data"
    wal = Wal.open(data / "wal")
    wal.append(RecordType.DISPATCH, (1).to_bytes(4, "little") + b"\xc1 not msgpack")
    wal.commit()
    wal.close()
    proc, url = serve(data)
    try:
        wait_for(
            lambda: (get_json(url + "readyz")[1].get("store") or {}).get("dead_letters") == 1,
            60,
            "the dead letter in /readyz",
        )
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True)
            try:
                page = browser.new_page()
                page.goto(url)
                badge = page.get_by_test_id("store-badge")
                expect(badge).to_be_visible(timeout=15_000)
                expect(badge).to_have_text("1 dead letters")
            finally:
                browser.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
