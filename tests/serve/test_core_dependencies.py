"""``make run`` installs only the package's own dependencies: the main job must need no more.

``make run`` runs ``pip install -e .`` (not the dev extras), so ``tiffany
serve --demo`` on the embedded default must start every process and finish
the demo without the optional packages: PostgreSQL's driver (the
``postgres`` extra), OpenTelemetry (``otel``) and the test tools. A module
on the default path that imports one of them at the top took the API down
at its first start on a fresh machine (``import psycopg`` in the API's
dependencies): here each served process runs with those packages made
unimportable, as on a machine that never installed them.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from process_support import serve_argv, terminate, wait_for

#: Packages ``pip install -e .`` does not install (extras and dev tools), by
#: module prefix (FastAPI needs ``opentelemetry-api``; the otel extra adds the
#: SDK and the exporter).
OPTIONAL = (
    "psycopg",
    "psycopg_binary",
    "opentelemetry.sdk",
    "opentelemetry.exporter",
    "pytest",
    "hypothesis",
    "playwright",
    "schemathesis",
    "trio",
    "curio",
    "nats",
)

#: Put first on the served processes' path: every import of OPTIONAL fails.
SITECUSTOMIZE = f"""
import importlib.abc
import sys

OPTIONAL = {OPTIONAL!r}


class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in OPTIONAL):
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed)", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_serve_runs_the_demo_with_only_the_packages_make_run_installs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(site), env.get("PYTHONPATH")] if p)
    env["TIFFANY_LOG_FORMAT"] = "json"
    data = tmp_path / "data"
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        serve_argv(data, 0, "--demo"), stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        ready = data / "serve.json"
        wait_for(lambda: ready.exists() or proc.poll() is not None, 120, "serve.json")
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        url = json.loads(ready.read_text())["url"]
        runs = wait_for(
            lambda: _get(url + "api/runs?status=succeeded")["runs"], 120, "the demo to succeed"
        )
        assert runs[0]["name"] == "demo-research"
        assert _get(url + "readyz")["ready"] is True
    finally:
        code = terminate(proc)
        log.close()
    served = (tmp_path / "serve.log").read_text()
    assert "ModuleNotFoundError" not in served, served[-3000:]
    assert code == 0, served[-3000:]
