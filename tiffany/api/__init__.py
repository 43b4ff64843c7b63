"""The API side-process: FastAPI app, websocket fan-out, dashboard files.

Public API::

    from tiffany.api import create_app, run_api

    app = create_app(settings)          # an ASGI app (tests, other servers)
    run_api(settings, ready_file=path)  # uvicorn in this process, until SIGTERM

See ``app.py`` for what the app holds and docs/architecture.md ("HTTP API") for
the routes' contract.
"""

from tiffany.api.app import create_app
from tiffany.api.server import run_api

__all__ = ["create_app", "run_api"]
