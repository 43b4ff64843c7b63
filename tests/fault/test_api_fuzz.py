"""Fuzz the API: schemathesis against its OpenAPI schema, hypothesis bodies and plans.

A real engine process and the app under a real uvicorn (127.0.0.1), as
``tiffany serve`` runs them, with a bearer token. Every operation of the
schema is called with generated parameters and bodies, with the token and
without it; hypothesis also posts generated JSON and YAML documents (deep,
wide, big numbers, NaN, lone surrogates, NUL, non-string keys) and generated
plans. What must hold for every request:

* no 5xx (``not_a_server_error``; the engine's 503 while busy is not
  expected on a quiet engine either);
* the answer matches the schema (``response_schema_conformance``);
* a refused submission journals nothing: the engine's durable WAL seq is
  unchanged.

Deterministic (``derandomize=True``); the examples per operation are bounded
(``TIFFANY_FUZZ_EXAMPLES``, default 30) so the module stays near a minute.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for extra in (HERE.parent, HERE.parent / "api"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import httpx  # noqa: E402
import schemathesis  # noqa: E402
import yaml  # noqa: E402
from api_support import make_settings, serve_in_thread, short_dir, start_engine  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance  # noqa: E402

from tiffany.wire import control  # noqa: E402

TOKEN = "fuzz-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = int(os.environ.get("TIFFANY_FUZZ_EXAMPLES", "30"))
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def served() -> Iterator[Any]:
    data_dir = short_dir("tfz-")
    engine = start_engine(data_dir)
    live = serve_in_thread(make_settings(data_dir, api_token=TOKEN))
    try:
        yield engine, live
    finally:
        live.stop()
        engine.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def _load_schema() -> Any:
    """The app's OpenAPI schema (an app built, not started, on a scratch dir)."""
    from tiffany.api import create_app

    scratch = short_dir("tfs-")
    try:
        return schemathesis.openapi.from_dict(create_app(make_settings(scratch)).openapi())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


SCHEMA = _load_schema()
OPERATIONS = sorted(
    (op.method.upper(), op.path) for op in (result.ok() for result in SCHEMA.get_all_operations())
)


def durable_seq(engine: Any) -> int:
    return int(control.call(engine.data_dir, "status")["durable_seq"])


def _no_write_when_refused(engine: Any, before: int, method: str, status: int) -> None:
    if method == "POST" and status >= 400:
        assert durable_seq(engine) == before, f"a refused {method} ({status}) was journaled"


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_schema_operations_never_fail_with_or_without_the_token(
    method: str, path: str, served: Any
) -> None:
    engine, live = served
    operation = SCHEMA[path][method]
    checks = [not_a_server_error, response_schema_conformance]
    cases = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @given(case=cases)
    @FUZZ_SETTINGS
    def call(case: Any) -> None:
        for headers in ({}, AUTH):
            before = durable_seq(engine)
            response = case.call(base_url=live.base, headers=headers, timeout=30)
            case.validate_response(response, checks=checks, headers=headers)
            _no_write_when_refused(engine, before, method, response.status_code)

    call()


# -- generated documents --------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)  # lone surrogates and NUL included
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=30,
)
_steps = st.lists(
    st.fixed_dictionaries(
        {"id": st.sampled_from(["a", "b", "c"]), "tool": st.sampled_from(["sleep", "nope"])},
        optional={
            "args": st.fixed_dictionaries(
                {"seconds": st.one_of(st.floats(), st.integers(), st.text(max_size=4))},
                optional={"x": _values},
            ),
            "after": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
            "retries": st.one_of(st.integers(), st.floats()),
            "timeout_s": st.one_of(st.none(), st.floats(), st.integers()),
            "backoff": st.floats(),
        },
    ),
    max_size=3,
)
_plans = st.fixed_dictionaries(
    {"name": st.text(max_size=8), "steps": _steps},
    optional={"inputs": st.dictionaries(st.text(max_size=4), _values, max_size=3)},
)


def _json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def _yaml(value: Any) -> bytes | None:
    try:
        return yaml.safe_dump(value, allow_unicode=False).encode("utf-8", "surrogatepass")
    except (yaml.YAMLError, UnicodeError):
        return None


def _finite_json(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_json(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite_json(v) for v in value)
    return True


def _post(served: Any, body: bytes, content_type: str) -> httpx.Response:
    engine, live = served
    before = durable_seq(engine)
    headers = {**AUTH, "content-type": content_type}
    r = httpx.post(f"{live.base}/api/runs", content=body, headers=headers, timeout=30)
    assert r.status_code < 500, r.text
    assert r.status_code in (200, 201, 413, 422), r.text
    if r.status_code >= 400:
        assert durable_seq(engine) == before
    if r.status_code == 422:
        detail = r.json()["detail"]
        assert detail
        assert detail[0]["loc"]
    return r


@given(doc=st.one_of(_plans, st.fixed_dictionaries({"plan": _plans, "inputs": _values}), _values))
@FUZZ_SETTINGS
def test_generated_plans_and_bodies_are_accepted_or_refused_cleanly(doc: Any, served: Any) -> None:
    _post(served, _json(doc), "application/json")
    as_yaml = _yaml(doc)
    if as_yaml is not None:
        _post(served, as_yaml, "application/yaml")


@given(
    depth=st.integers(min_value=60, max_value=30_000),
    opener=st.sampled_from(["[", '{"k": ', "- ", "a: "]),
    tail=st.sampled_from(["", "1", "1" * 4_400, "NaN", '"\\ud800"', '"\\u0000"']),
)
@FUZZ_SETTINGS
def test_generated_hostile_shapes_are_refused_cleanly(
    depth: int, opener: str, tail: str, served: Any
) -> None:
    if opener in ("- ", "a: "):
        body = "".join(" " * (2 * i) + opener + "\n" for i in range(min(depth, 3_000))) + tail
        _post(served, body.encode(), "application/yaml")
    else:
        closer = "]" if opener == "[" else "}"
        body = opener * depth + tail + closer * depth
        _post(served, body.encode(), "application/json")
