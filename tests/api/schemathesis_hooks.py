"""Schemathesis hooks of ``test_schemathesis.py``: the refusals no schema can state.

Loaded by the ``schemathesis`` CLI (``SCHEMATHESIS_HOOKS=schemathesis_hooks``).
``positive_data_acceptance`` expects every request its schema allows to be
taken; these answers are 422s that depend on what the server holds, not on
the request's shape, and are documented as such (README's API table):

* ``plan.invalid``: a plan's tools, their arguments, its graph (an unknown
  tool, a cycle, a reference to a step not upstream), a re-run's
  ``from_step``: the engine's registry and the run decide;
* ``workflow.inputs``: a ``workflow`` the server did not import, its
  inputs against the function's signature: the registry decides;
* ``step.no_conversation``: the step exists and is not an ``agent`` step;
* ``min_seq`` beyond the journal's last seq: a seq this server never wrote;
* a plan sent as text whose text is not a plan (the text is a string to
  the schema; what it holds is ``contentMediaType``, an annotation);
* a grammar or a registry a pattern cannot hold: a schedule's ``cron``
  (croniter's) and ``timezone`` (the IANA database's); a ``since`` or
  ``until`` of the schema's pattern that the calendar lacks (2024-02-30),
  or an ``until`` before the ``since``;
* a memory item's key (``/api/memory/{namespace}/{key}``): the store takes
  printable text only (Python's ``str.isprintable``: no format, separator
  or unassigned character), and ``search`` is the search route's; the
  pattern states the control characters and the spaces at either end, not
  Unicode's categories;
* a document limit on a free-form value (a run's ``inputs``, a step's
  ``args``: any JSON to the schema): an integer beyond the signed 64-bit
  range (NUL, the other such limit, is not generated: schemathesis.toml).

Any other refusal of schema-valid data is a finding.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance

#: Error codes of refusals that depend on the server's state (see the module docstring).
STATEFUL_CODES = frozenset({"plan.invalid", "workflow.inputs", "step.no_conversation"})
#: The refusal of an integer the documents' limits leave out (tiffany/wire/documents.py).
INT64_LIMIT = "out of the signed 64-bit range"
#: Fields whose grammar or registry a pattern cannot hold (see the module docstring).
GRAMMARS = (
    ["body", "cron"],
    ["body", "timezone"],
    ["query", "since"],
    ["query", "until"],
)
#: The memory store's refusal of a key its pattern allows (see the module docstring).
MEMORY_KEY = ("memory.invalid", ["path", "key"])


@schemathesis.check
def positive_data_taken(ctx: Any, response: Any, case: Any) -> bool | None:
    """``positive_data_acceptance``, less the refusals listed in the module docstring."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if response.status_code == 422 and _stateful(response, case):
            return None
        raise


def _stateful(response: Any, case: Any) -> bool:
    try:
        body = json.loads(response.content)
    except ValueError:
        return False
    if not isinstance(body, dict):
        return False
    code, detail = body.get("code"), body.get("detail")
    if code in STATEFUL_CODES:
        return True
    first = detail[0] if isinstance(detail, list) and detail else {}
    loc = first.get("loc") if isinstance(first, dict) else None
    if (code, loc) == MEMORY_KEY:
        return True
    if code != "request.invalid" or not isinstance(loc, list):
        return False
    if loc == ["query", "min_seq"] and first.get("msg") == "beyond the journal":
        return True
    if loc in GRAMMARS or str(first.get("msg")).endswith(INT64_LIMIT):
        return True
    plan = case.body.get("plan") if isinstance(case.body, dict) else None
    return loc == ["body", "plan"] and isinstance(plan, str)
