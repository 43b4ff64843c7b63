"""Run the research example: serve docs/ on 127.0.0.1, then ``tiffany run`` the plan.

python examples/research/run.py [--data-dir DIR] [extra tiffany run options]

The plan's http steps fetch from that local server, an address the http
tool refuses unless ``TIFFANY_HTTP_ALLOW`` opens it (docs/security.md): the
``tiffany run`` this script starts, and only it, is given
``TIFFANY_HTTP_ALLOW=127.0.0.1``, and the script says so on stderr.
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(HERE / "docs"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"serving {HERE / 'docs'} at {url}", file=sys.stderr)
    args = sys.argv[1:]
    data_dir = args[:2] if len(args) > 1 and args[0] == "--data-dir" else []
    rest = args[len(data_dir) :]
    try:
        cmd = [
            sys.executable,
            "-m",
            "tiffany",
            *data_dir,
            "run",
            str(HERE / "plan.yaml"),
            "--input",
            f"base_url={url}",
            *rest,
        ]
        # The http tool refuses loopback unless the operator allows it
        # (docs/security.md). This script is that operator for the run it
        # starts, and says so: the documents are on 127.0.0.1, and only the
        # `tiffany run` below (its own process, its own engine) gets the allowance.
        allow = ",".join(filter(None, [os.environ.get("TIFFANY_HTTP_ALLOW"), "127.0.0.1"]))
        env = {**os.environ, "TIFFANY_HTTP_ALLOW": allow}
        print(
            f"allowing this run's http steps to reach 127.0.0.1 (TIFFANY_HTTP_ALLOW={allow}): "
            "loopback is refused by default, docs/security.md",
            file=sys.stderr,
        )
        if not any(env.get(f"TIFFANY_LLM_{k}") for k in ("BASE_URL", "MODEL", "SCRIPT")):
            # no model configured: the summary step asks for the offline scripted one
            env["TIFFANY_LLM_MODEL"] = "scripted"
            print(
                "no model configured: the llm step uses the offline scripted provider "
                "(TIFFANY_LLM_MODEL=scripted)",
                file=sys.stderr,
            )
        return subprocess.call(cmd, env=env)
    finally:
        server.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
