"""``python -m tiffany.api [--data-dir DIR] [--host H] [--port P] [--ready-file F] [--after F]``.

Runs the API side-process alone (``tiffany api`` does the same through the
CLI); other settings come from ``TIFFANY_*`` variables.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tiffany.api.server import run_api
from tiffany.config import Settings


def main(argv: list[str] | None = None) -> int:
    """Parse the options, build the settings, serve."""
    parser = argparse.ArgumentParser(prog="python -m tiffany.api", description=__doc__)
    parser.add_argument("--data-dir", type=Path, help="data directory (the engine's sockets)")
    parser.add_argument("--host", help="address to bind")
    parser.add_argument("--port", type=int, help="port to bind (0: any free port)")
    parser.add_argument("--ready-file", type=Path, help="write {url, pid} here once listening")
    parser.add_argument(
        "--after",
        type=Path,
        action="append",
        default=[],
        help="listen only once this file exists (repeatable: the engines' ready files)",
    )
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {
        k: v
        for k, v in (("data_dir", args.data_dir), ("host", args.host), ("port", args.port))
        if v is not None
    }
    return run_api(Settings(**overrides), ready_file=args.ready_file, after=args.after)


if __name__ == "__main__":
    raise SystemExit(main())
