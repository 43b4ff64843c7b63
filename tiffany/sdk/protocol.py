"""What :class:`~tiffany.sdk.Client` and :class:`~tiffany.sdk.AsyncClient` share.

Both speak the same HTTP API (docs/sdk.md); they differ only in how they do
I/O. Everything that is not I/O lives here, once: building request bodies,
turning answers into models or exceptions, reading feed frames, and the
policies their loops follow: when a request is sent again (:func:`resending`,
tenacity's retry, stop and exponential wait, which both clients hand to
``tenacity.Retrying`` or ``AsyncRetrying``) and the intervals of ``wait``
(:class:`Backoff`, tenacity's exponential wait).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import httpx
import tenacity
from pydantic import BaseModel
from websockets.exceptions import InvalidStatus

from tiffany.sdk.errors import ApiError, ConnectionFailed, error_from_answer
from tiffany.sdk.models import Event, FeedGap

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_URL",
    "FEED_CLOSE_TIMEOUT_S",
    "FEED_DRAIN_MAX_S",
    "FEED_SETTLE_S",
    "FEED_TAIL",
    "FINISHED_DRAIN_S",
    "RECONNECT_FOR_S",
    "WAIT_POLL_FIRST_S",
    "WAIT_POLL_MAX_S",
    "Backoff",
    "Cutoff",
    "Outage",
    "answer",
    "auth_headers",
    "feed_url",
    "foreign",
    "memory_items_params",
    "memory_path",
    "memory_search_params",
    "plan_body",
    "raise_for",
    "read_frame",
    "readiness",
    "refusal",
    "resending",
    "resolve_token",
    "resolve_url",
    "retry_delay",
    "run_path",
    "unreachable",
]

M = TypeVar("M", bound=BaseModel)

#: What a one-line YAML mapping holds: a key's colon before a space or the end.
_MAPPING_LINE: Final = re.compile(r":(\s|$)")
#: Where a client goes when given no URL and no ``TIFFANY_URL``.
DEFAULT_URL: Final = "http://127.0.0.1:8000"
#: How long one HTTP request may take, in seconds (a ``min_seq`` read waits
#: up to 5 s on the server, a submission until it is journaled).
DEFAULT_TIMEOUT_S: Final = 30.0
#: How many times a request that failed on its connection is sent again
#: (:func:`retry_delay` says which may be), waiting ``RETRY_FIRST_S``, then
#: twice as long each time.
DEFAULT_RETRIES: Final = 2
RETRY_FIRST_S: Final = 0.2
#: ``wait``: the first interval between two reads of the run when the feed is
#: quiet, in seconds; doubled after each quiet interval, up to the maximum.
WAIT_POLL_FIRST_S: Final = 0.25
WAIT_POLL_MAX_S: Final = 5.0
#: ``events`` without ``since``: the feed's events the server still holds
#: (the most it replays), then the live ones.
FEED_TAIL: Final = 10_000
#: ``events`` of a run that had finished before it was followed: the feed is
#: read until the run's ``run.finished``, or until it stays quiet this long
#: (the server sends what it holds at once), in seconds.
FINISHED_DRAIN_S: Final = 1.0
#: Closing a feed: what it still has unread is taken first, until it has been
#: quiet this long or for at most FEED_DRAIN_MAX_S, in seconds. The websockets
#: client stops reading the socket while more than its queue's high-water
#: mark of messages wait unread (flow control), so the server's close frame
#: behind them would not be read and ``close`` would wait its whole timeout.
FEED_SETTLE_S: Final = 0.05
FEED_DRAIN_MAX_S: Final = 0.5
#: The closing handshake's bound once the feed is drained, in seconds.
FEED_CLOSE_TIMEOUT_S: Final = 1.0
#: ``events``: how long a lost feed is retried before ConnectionFailed, in seconds.
RECONNECT_FOR_S: Final = 30.0


def resolve_url(url: str | None) -> str:
    """The API's base URL: ``url``, else ``TIFFANY_URL``, else :data:`DEFAULT_URL`."""
    text = (url or os.environ.get("TIFFANY_URL") or DEFAULT_URL).strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"url: not an http(s) URL: {text!r}")
    return text


def resolve_token(token: str | None) -> str | None:
    """The bearer token: ``token``, else ``TIFFANY_API_TOKEN``, else None (empty is none)."""
    value = token if token is not None else os.environ.get("TIFFANY_API_TOKEN")
    return value.strip() or None if value else None


def auth_headers(token: str | None) -> dict[str, str]:
    """The headers every request carries."""
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def run_path(run_id: str, *rest: str) -> str:
    """The path ``/api/runs/{run_id}/...`` with each part percent-encoded.

    A run id or signal name is one path segment whatever it holds: ``/``,
    ``?`` or ``#`` in it cannot reach another route or become a query, and
    ``.`` or ``..`` cannot climb a level (a URL drops dot-segments), so a
    signal named ``../cancel`` is refused as a name, not sent as a cancel.
    """
    return "/".join(["/api/runs", *(_segment(part) for part in (run_id, *rest))])


def schedule_path(schedule_id: str, *rest: str) -> str:
    """The path ``/api/schedules/{schedule_id}/...``, each part encoded as :func:`run_path` does."""
    return "/".join(["/api/schedules", *(_segment(part) for part in (schedule_id, *rest))])


def memory_path(namespace: str, *rest: str) -> str:
    """The path ``/api/memory/{namespace}/...``, each part encoded as :func:`run_path` does.

    A key is one segment whatever it holds: its ``/`` travels as ``%2F``
    and the server takes the rest of the path as the key.
    """
    return "/".join(["/api/memory", *(_segment(part) for part in (namespace, *rest))])


def memory_search_params(q: str, k: int, mode: str) -> dict[str, Any]:
    """The query of ``GET /api/memory/{namespace}/search``."""
    return {"q": q, "k": k, "mode": mode}


def memory_items_params(after: str | None, limit: int) -> dict[str, Any]:
    """The query of ``GET /api/memory/{namespace}``: ``limit``, and ``after`` when given."""
    return {"limit": limit, **({"after": after} if after is not None else {})}


def schedule_body(
    plan: Mapping[str, Any] | None,
    cron: str,
    timezone: str,
    catchup: str,
    inputs: Mapping[str, Any] | None,
    workflow: str | None = None,
) -> dict[str, Any]:
    """The body of ``POST /api/schedules`` (of ``plan``, or of the ``@workflow`` ``workflow``).

    Raises:
        TypeError: ``plan`` or ``inputs`` is not a mapping (a schedule's plan
            is a document, read by the caller), or not one of ``plan`` and
            ``workflow`` is given.
    """
    if (plan is None) == (workflow is None):
        raise TypeError("give a plan or a workflow (one of them)")
    if plan is not None and not isinstance(plan, Mapping):
        raise TypeError(f"plan: a mapping, not {type(plan).__name__}")
    if inputs is not None and not isinstance(inputs, Mapping):
        raise TypeError(f"inputs: a mapping, not {type(inputs).__name__}")
    what: dict[str, Any] = {"workflow": workflow}
    if plan is not None:
        what = {"plan": dict(plan)}
    return {
        **what,
        "inputs": dict(inputs or {}),
        "cron": cron,
        "timezone": timezone,
        "catchup": catchup,
    }


def _segment(text: str) -> str:
    quoted = quote(text, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def submit_body(
    plan: Any, inputs: Mapping[str, Any] | None, workflow: str | None
) -> dict[str, Any]:
    """The body of ``POST /api/runs``: a plan's (:func:`plan_body`), or a workflow's.

    Raises:
        TypeError: Both or neither of ``plan`` and ``workflow``; inputs not a mapping.
    """
    if workflow is None:
        if plan is None:
            raise TypeError("submit: give a plan, or workflow=NAME")
        return plan_body(plan, inputs)
    if plan is not None:
        raise TypeError("submit: give a plan or workflow=NAME, not both")
    if not isinstance(workflow, str) or not workflow:
        raise TypeError(f"workflow: a workflow's registered name, not {workflow!r}")
    if inputs is not None and not isinstance(inputs, Mapping):
        raise TypeError(f"inputs: a mapping, not {type(inputs).__name__}")
    return {"workflow": workflow, "inputs": dict(inputs or {})}


def plan_body(plan: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The body of ``POST /api/runs`` for ``plan`` (a dict, JSON or YAML text, or a path).

    A :class:`~pathlib.Path` (or any path-like) is read; a string that names
    an existing file (one line, not JSON) is too; any other string is sent as
    the plan's text, which the server parses as JSON or YAML. A one-line
    string that no mapping can be (no ``{``, no ``key: value``) is taken for
    a path: one that names no file is an error here, not a plan the server
    refuses as "not an object".

    Raises:
        ValueError: ``plan`` names a file that cannot be read, or none.
    """
    one_line = isinstance(plan, str) and "\n" not in plan and not plan.lstrip().startswith("{")
    if isinstance(plan, os.PathLike) or (one_line and _is_file(plan)):
        path = Path(os.fspath(plan))
        try:
            plan = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"plan: cannot read {path}: {exc.strerror}") from None
    elif one_line and plan.strip() and not _MAPPING_LINE.search(plan):
        raise ValueError(f"plan: no file {plan!r} (a plan given as text is a JSON or YAML mapping)")
    elif not isinstance(plan, dict | str):
        raise TypeError(f"plan: a dict, JSON or YAML text, or a path, not {type(plan).__name__}")
    if inputs is not None and not isinstance(inputs, Mapping):
        raise TypeError(f"inputs: a mapping, not {type(inputs).__name__}")
    return {"plan": plan, "inputs": dict(inputs or {})}


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def list_params(limit: int, **given: Any) -> dict[str, Any]:
    """The query of ``GET /api/runs``: ``limit`` and whichever of the rest were given.

    ``status``, ``before`` (the previous page's ``next_before``), and the
    list's filters: ``name`` (a part of it), ``q`` (text in the inputs),
    ``since``/``until`` (a created-at range).
    """
    return {"limit": limit, **{k: v for k, v in given.items() if v is not None}}


def answer(response: httpx.Response, model: type[M]) -> M:
    """``response``'s JSON as ``model``, or the :class:`~tiffany.sdk.errors.ApiError` it is.

    Raises:
        ConnectionFailed: The answer is not the API's (a URL that names
            another server, or a path under which no Tiffany API is served).
    """
    if response.status_code >= 400:
        raise_for(response)
    try:
        return model.model_validate(response.json())
    except ValueError:  # not JSON, or not this model (pydantic's error is one)
        raise foreign(response, f"not a {model.__name__}") from None


def readiness(response: httpx.Response) -> dict[str, Any]:
    """The ``/readyz`` answer ``response`` as ``{"ready": bool, ...}`` (200 or 503).

    Raises:
        ApiError: Any other status.
        ConnectionFailed: A 200 that is not the API's readiness.
    """
    if response.status_code not in (200, 503):
        raise_for(response)
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        if response.status_code == 200:
            raise foreign(response, "not a JSON object")
        body = {"detail": response.text}  # a proxy's 503 page: not ready
    return {"ready": response.status_code == 200, **body}


def raise_for(response: httpx.Response) -> None:
    """Raise the error ``response`` answers (it is one: status 400 and up)."""
    raise _api_error(
        response.status_code,
        response.text,
        response.headers.get("content-type", ""),
        _request_line(response),
        response.headers.get("retry-after"),
    )


def _api_error(
    status: int, text: str, content_type: str, where: str, retry_after: str | None
) -> ApiError:
    """The exception for an error answer ``text`` to the request ``where`` ("GET url").

    An answer that is not the API's error body (a proxy's or another
    server's page, a route the API does not have) names the request, so a
    wrong ``url`` shows as one, not as a bare "Not Found" or a page of HTML.
    """
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not (isinstance(body, dict) and "code" in body and "message" in body):
        kind = content_type.split(";")[0] or "no content type"
        message = f"not a Tiffany API answer: {where} -> {status} ({kind})"
        body = {**(body if isinstance(body, dict) else {}), "message": message}
    elif str(body["code"]).startswith("http."):  # no such route, or method: not one of ours
        body = {**body, "message": f"{body['message']}: {where}"}
    return error_from_answer(status, body, text=text, retry_after=retry_after)


def foreign(response: httpx.Response, why: str) -> ConnectionFailed:
    """The error for a success answer that is not the API's: the URL names something else."""
    url = str(response.request.url)
    return ConnectionFailed(
        f"not a Tiffany API answer: {_request_line(response)} -> "
        f"{response.status_code} ({why}); is the URL the API's base URL?",
        url=url,
    )


def _request_line(response: httpx.Response) -> str:
    return f"{response.request.method} {response.request.url}"


#: The wait before sending a request again: ``RETRY_FIRST_S``, then twice as long each time.
_RESEND_WAIT: Final = tenacity.wait_exponential(multiplier=RETRY_FIRST_S)


def may_resend(exc: BaseException, method: str, headers: Mapping[str, str]) -> bool:
    """Whether a request that failed with ``exc`` may be sent again (:func:`retry_delay`)."""
    if not isinstance(exc, httpx.TransportError) or isinstance(exc, httpx.TimeoutException):
        return False
    never_sent = isinstance(exc, httpx.ConnectError)
    keyed = any(k.lower() == "idempotency-key" for k in headers)
    broken = isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError)
    return never_sent or (broken and (method == "GET" or keyed))


def resending(method: str, headers: Mapping[str, str], retries: int) -> dict[str, Any]:
    """The arguments of ``tenacity.Retrying`` (or ``AsyncRetrying``) that send a request again.

    What may be sent again is :func:`may_resend`'s; at most ``retries``
    times more, after :func:`retry_delay`; the last error is raised as is
    (the client turns it into :class:`~tiffany.sdk.errors.ConnectionFailed`).
    """
    return {
        "retry": tenacity.retry_if_exception(lambda exc: may_resend(exc, method, headers)),
        "stop": tenacity.stop_after_attempt(retries + 1),
        "wait": _RESEND_WAIT,
        "reraise": True,
    }


def retry_delay(
    exc: httpx.TransportError, method: str, headers: Mapping[str, str], attempt: int, retries: int
) -> float | None:
    """How long to wait before sending a request again after ``exc``, or None: do not.

    Only what cannot do a thing twice is sent again: a request that never
    left (the connection was refused), a read (``GET``), or a request with
    an ``Idempotency-Key`` (a submission, re-run or signal given one: the
    server answers a repeat with the first one's result). A request whose
    connection broke after it was sent may have been carried out; without
    a key it is not sent again, and the error says the server could not be
    reached. Timeouts are not retried (the server may be busy with it).
    ``attempt``: how many times the request was sent already (from 1).
    """
    if attempt > retries or not may_resend(exc, method, headers):
        return None
    return _wait_at(_RESEND_WAIT, attempt)


def _wait_at(wait: tenacity.wait.wait_base, attempt: int) -> float:
    """What tenacity's ``wait`` gives after ``attempt`` tries (from 1)."""
    state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = attempt
    return float(wait(state))


def refusal(exc: Exception, url: str) -> ApiError | None:
    """The error a websocket handshake's answer is, if trying again cannot help; else None.

    A 4xx (a missing or wrong token, no such route) stays what it is: it is
    raised at once, as the same answer over HTTP would be, not retried
    until the feed is given up as unreachable. A 408, a 429, a 5xx (the API
    restarting behind a proxy) and a failed connection may pass: None.
    ``url``: the websocket's URL, named in a refusal that is not the API's.
    """
    if not isinstance(exc, InvalidStatus):
        return None
    response = exc.response
    status = response.status_code
    if not 400 <= status < 500 or status in (408, 429):
        return None
    return _api_error(
        status,
        response.body.decode("utf-8", "replace") if response.body else "",
        response.headers.get("Content-Type", ""),
        f"GET {url}",
        response.headers.get("Retry-After"),
    )


def unreachable(base: str, exc: Exception) -> ConnectionFailed:
    """The error for a transport failure (connection refused, timeout...)."""
    reason = str(exc) or type(exc).__name__
    return ConnectionFailed(f"cannot reach the Tiffany API at {base}: {reason}", url=base)


def get_params(min_seq: int | None, outputs: bool) -> dict[str, Any]:
    """The query of ``GET /api/runs/{id}``: ``min_seq`` when given, ``outputs=false`` when asked."""
    params: dict[str, Any] = {} if min_seq is None else {"min_seq": min_seq}
    if not outputs:
        params["outputs"] = "false"
    return params


def feed_url(base: str, run_id: str | None, since: int | None, tail: int = 0) -> str:
    """The websocket URL of the activity feed (``ws://`` for ``http://``).

    Without ``since``, ``tail`` > 0 asks first for the last events the
    server holds (of the run, when ``run_id`` is given).
    """
    parts = urlsplit(base)
    scheme = "wss" if parts.scheme == "https" else "ws"
    query: dict[str, Any] = {}
    if run_id is not None:
        query["run_id"] = run_id
    if since is not None:
        query["since"] = since
    elif tail:
        query["tail"] = tail
    path = parts.path.rstrip("/") + "/ws/activity"
    return urlunsplit((scheme, parts.netloc, path, urlencode(query), ""))


class Cutoff(Exception):
    """The server cut this subscriber off (too slow): resume with ``since``."""


def read_frame(text: str | bytes) -> Event | FeedGap | None:
    """One websocket message as an event, a gap, or None (a ping or unknown control frame).

    Raises:
        Cutoff: The frame is ``cutoff``: reconnect with the last seq.
        ApiError: The frame is ``error``: the server refused the feed as it
            would refuse the same request over HTTP (a ``since`` beyond the
            feed: :class:`~tiffany.sdk.errors.InvalidRequest`, 422).
    """
    doc = json.loads(text)
    if not isinstance(doc, dict):
        return None
    kind = doc.get("type")
    if kind is None and "seq" in doc and "kind" in doc:
        return Event.model_validate(doc)
    if kind == "gone":
        return FeedGap.model_validate({k: v for k, v in doc.items() if k != "type"})
    if kind == "cutoff":
        raise Cutoff(str(doc.get("reason") or "cut off"))
    if kind == "error":
        status = doc.get("status")
        body = {k: v for k, v in doc.items() if k != "type"}
        raise error_from_answer(status if isinstance(status, int) else 400, body)
    return None


class Outage:
    """How long the server has been out of reach, for ``wait``: given up after RECONNECT_FOR_S.

    A server restarting (its API process, or the whole service) refuses
    connections for a few seconds; ``wait`` reads the run again meanwhile,
    as ``events`` reconnects, instead of failing on the first refusal.
    """

    def __init__(self) -> None:
        self.since: float | None = None

    def failed(self, exc: ConnectionFailed) -> None:
        """Note a failed read; raise ``exc`` once the server has been out of reach too long."""
        now = time.monotonic()
        self.since = self.since if self.since is not None else now
        if now - self.since > RECONNECT_FOR_S:
            raise exc

    def ended(self) -> None:
        """Note a read that reached the server."""
        self.since = None


class Backoff:
    """The intervals ``wait`` reads the run at while the feed is quiet: doubling, capped.

    Tenacity's exponential wait from ``first`` up to ``most``.
    """

    def __init__(self, first: float = WAIT_POLL_FIRST_S, most: float = WAIT_POLL_MAX_S) -> None:
        self._wait = tenacity.wait_exponential(multiplier=first, max=most)
        self._steps = 0

    def step(self) -> float:
        """Return the next interval, in seconds."""
        self._steps += 1
        return _wait_at(self._wait, self._steps)
