"""The OpenAPI schema (``/openapi.json``): what the server accepts, as a client can read it.

FastAPI derives most of it from the routes. Three things it cannot see are
added here, once, when the schema is first asked for:

* **request bodies.** No route declares a body model (``body.py`` reads
  every body itself, capped and with limits), so a route names its body by
  :func:`request_body`, and the models it names (a submission, with the
  plan's own shape; a schedule; a re-run) go into ``components/schemas``
  whole. A YAML body has the JSON body's schema: it is the same document.
* **auth.** The bearer token is checked by a middleware (``middleware.py``),
  which FastAPI does not see: the scheme ``bearerAuth`` is declared always
  (HTTP bearer), and required of every operation but the public ones
  (``/healthz``, ``/api/meta``) when ``TIFFANY_API_TOKEN`` is set. Without a token the
  server asks for none and the schema says so.
* nothing else: path and query constraints live on the routes' parameters,
  where FastAPI puts them in the schema and checks them.

Discussion: the schema is built per app (``create_app(settings)``), so it
tells the truth about the settings the server runs with (auth on or off).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tiffany.api.middleware import is_public
from tiffany.api.schemas import ErrorBody

__all__ = ["BEARER_SCHEME", "install", "request_body"]

#: The security scheme's name in ``components/securitySchemes``.
BEARER_SCHEME: Final = "bearerAuth"
_REF: Final = "#/components/schemas/{model}"
_YAML: Final = "application/yaml"


def request_body(
    *models: type[BaseModel], yaml: bool = False, required: bool = True, description: str = ""
) -> dict[str, Any]:
    """The ``requestBody`` of a route whose body is one of ``models`` (JSON, and YAML if ``yaml``).

    For ``openapi_extra={"requestBody": ...}``; :func:`install` puts the
    models' schemas in ``components/schemas``.
    """
    refs = [{"$ref": _REF.format(model=model.__name__)} for model in models]
    schema = refs[0] if len(refs) == 1 else {"anyOf": refs}
    content = {"application/json": {"schema": schema}}
    if yaml:
        content[_YAML] = {"schema": schema}
    body: dict[str, Any] = {"required": required, "content": content}
    if description:
        body["description"] = description
    return body


def install(app: FastAPI, models: Iterable[type[BaseModel]], *, token: bool) -> None:
    """Make ``app.openapi()`` add ``models``' schemas and the bearer scheme (see module doc).

    Args:
        app: The application (its routes all included).
        models: The body models routes name with :func:`request_body`.
        token: Whether the server requires the bearer token.
    """
    body_models = tuple(models)
    extended: list[dict[str, Any]] = []  # the schema extended last (FastAPI caches it)

    def openapi() -> dict[str, Any]:
        schema = FastAPI.openapi(app)  # FastAPI's own, made again if the routes changed
        if extended and extended[0] is schema:
            return schema
        components = schema.setdefault("components", {})
        _, defs = models_json_schema(
            [(model, "validation") for model in body_models], ref_template=_REF
        )
        components.setdefault("schemas", {}).update(defs.get("$defs", {}))
        components["securitySchemes"] = {
            BEARER_SCHEME: {
                "type": "http",
                "scheme": "bearer",
                "description": (
                    "The server's TIFFANY_API_TOKEN, as Authorization: Bearer <token> "
                    "(a websocket may pass ?token= instead). Required when the server "
                    "has a token; /healthz and /api/meta never need it."
                ),
            }
        }
        if token:
            _require_token(schema["paths"], components["schemas"])
        extended[:] = [schema]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _require_token(paths: Mapping[str, Any], schemas: dict[str, Any]) -> None:
    """Require the bearer scheme of every operation but the public paths', and say its 401."""
    schemas.setdefault("ErrorBody", ErrorBody.model_json_schema(ref_template=_REF))
    refused = {
        "description": "Missing or wrong bearer token.",
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorBody")}}},
    }
    for path, operations in paths.items():
        public = is_public(path)
        for operation in operations.values():
            operation["security"] = [] if public else [{BEARER_SCHEME: []}]
            if not public:
                operation.setdefault("responses", {}).setdefault("401", refused)
