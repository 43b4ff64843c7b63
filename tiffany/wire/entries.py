"""A run's entry (its RUN_START's ``entry``), read once into a typed value.

A run's first record holds what the run runs, as a JSON object whose
``kind`` says which of three it is:

============  ==============================================================
kind          fields (besides the common ``parent``, ``idempotency``, ``schedule``)
============  ==============================================================
``plan``      ``plan`` (the document), ``inputs``, ``concurrency``
              (``{"key", "limit"}``), ``limits`` (``{"max_steps"}``), a
              re-run's ``rerun_of`` and ``reuse`` (``tiffany/agents/rerun.py``)
``workflow``  ``workflow`` (a ``@workflow``'s name), ``inputs``,
              ``concurrency``, ``budget``, a re-run's ``rerun_of`` (with
              ``fork``: ``tiffany/workflows/rerun.py``)
``callable``  ``target`` (``module:qualname``), ``args``, ``kwargs``
============  ==============================================================

:func:`read_entry` turns the object into a :class:`PlanEntry`,
:class:`WorkflowEntry` or :class:`CallableEntry` (a msgspec tagged union on
``kind``), refusing a malformed one with :class:`MalformedEntry` naming the
field; every reader asks the typed value (``plan_doc``, ``inputs``,
``workflow_name``, ``concurrency``, ``budget``) instead of re-reading keys.

One runtime: a plan run is the built-in workflow ``plan``
(:data:`PLAN_WORKFLOW`): a :class:`PlanEntry`'s ``workflow_name`` is
``plan`` and its ``runner`` is ``workflow``, so the durable runtime resolves
plan and workflow runs through one resolver. The journal keeps the
``{"kind": "plan", ...}`` shape: old journals replay byte for byte, and the
store, the dashboard and the HTTP API see one shape for every plan run.

Invariants:
    - Reading never changes what was journaled: the typed value is a
      reading of the raw object, which stays the record's (the store's
      ``runs.entry`` column and the WAL's bytes are the raw object's).
    - Fields this code does not know are ignored, not refused (a newer
      engine's entry is still read for what it shares).

Rejected: a typed entry written into RUN_START in place of the dict. The
bytes would differ from what old engines wrote and read, and the dict is
already JSON; the reading is what was repeated, so the reading is typed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final, TypeAlias

import msgspec

from tiffany.errors import TiffanyError

__all__ = [
    "PLAN_WORKFLOW",
    "CallableEntry",
    "Entry",
    "EntryKind",
    "MalformedEntry",
    "PlanEntry",
    "RunConcurrency",
    "RunLimits",
    "WorkflowEntry",
    "entry_kind",
    "read_entry",
    "reading",
]

#: The built-in workflow a plan run is (its root: the planner).
PLAN_WORKFLOW: Final = "plan"


class EntryKind(StrEnum):
    """What a run runs: its entry's ``kind``."""

    PLAN = "plan"
    WORKFLOW = "workflow"
    CALLABLE = "callable"


class MalformedEntry(TiffanyError):
    """A run's entry is not one this code reads (``field``: the first field at fault)."""

    code = "run.entry"


class RunConcurrency(msgspec.Struct, frozen=True):
    """A run's concurrency slot: at most ``limit`` runs of ``key`` at once."""

    key: str
    limit: int


class RunLimits(msgspec.Struct, frozen=True):
    """The engine's bounds on a run, written at submission (the replay reads them here)."""

    max_steps: int | None = None


class _Entry(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """The fields every kind may carry."""

    #: A child run's parent: ``{"run_id", "step", ...}`` (``plan.run``, ``child(...)``).
    parent: dict[str, Any] | None = None
    #: ``{"key", "digest"}`` of a submission with an Idempotency-Key.
    idempotency: dict[str, Any] | None = None
    #: ``{"id", "tick"}`` of the schedule tick that submitted it.
    schedule: dict[str, Any] | None = None

    @property
    def kind(self) -> EntryKind:
        """The entry's kind."""
        return EntryKind(str(self.__struct_config__.tag))

    @property
    def runner(self) -> str:
        """The runtime resolver that rebuilds its root: ``workflow`` or ``callable``."""
        return EntryKind.WORKFLOW.value

    @property
    def workflow_name(self) -> str | None:
        """The workflow it runs (``plan`` for a plan run); None for a callable."""
        return None

    @property
    def plan_doc(self) -> dict[str, Any] | None:
        """The plan document of a plan run; None for any other."""
        return None

    @property
    def run_inputs(self) -> dict[str, Any]:
        """What the run was given: a plan's or workflow's inputs, a callable's arguments."""
        return {}

    @property
    def concurrency_key(self) -> str | None:
        """The concurrency key it is admitted by, or None (no limit)."""
        spec: RunConcurrency | None = getattr(self, "concurrency", None)
        return spec.key if spec is not None else None

    @property
    def budget_spec(self) -> dict[str, Any] | None:
        """Its budget (``{"tokens"?, "usd"?}``): a plan's document's, a workflow's entry's."""
        return None


class PlanEntry(_Entry, frozen=True, kw_only=True, tag="plan"):
    """A plan run: the built-in workflow ``plan`` given a document and its inputs."""

    #: The document, the very object the entry holds (``Any``, checked
    #: below: a ``dict`` field would be a copy, and the engine knows the
    #: plan it validated at submission by the document's identity).
    plan: Any
    inputs: dict[str, Any] = {}
    concurrency: RunConcurrency | None = None
    limits: RunLimits | None = None
    #: A re-run's reused steps (``tiffany/agents/rerun.py``), by step id.
    reuse: dict[str, dict[str, Any]] | None = None
    #: A re-run's earlier run: ``{"run_id", "restart"}``.
    rerun_of: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.plan, dict):
            kind = type(self.plan).__name__
            raise TypeError(f"Expected `object`, got `{kind}` - at `$.plan`")

    @property
    def workflow_name(self) -> str:
        """``plan``: a plan run is the built-in workflow ``plan``."""
        return PLAN_WORKFLOW

    @property
    def plan_doc(self) -> dict[str, Any]:
        """The plan document."""
        doc: dict[str, Any] = self.plan  # a dict: __post_init__
        return doc

    @property
    def run_inputs(self) -> dict[str, Any]:
        """The inputs given (the plan's defaults are the plan's)."""
        return self.inputs

    @property
    def budget_spec(self) -> dict[str, Any] | None:
        """The plan's ``budget``."""
        budget = self.plan.get("budget")
        return budget if isinstance(budget, dict) else None

    @property
    def max_steps(self) -> int | None:
        """The engine's bound on its steps, dynamic ones included (None: the default)."""
        bound = self.limits.max_steps if self.limits is not None else None
        return bound if bound is not None and bound > 0 else None

    @property
    def rerun_source(self) -> str | None:
        """The run a re-run reuses steps of, or None."""
        source = (self.rerun_of or {}).get("run_id")
        return source if isinstance(source, str) else None


class WorkflowEntry(_Entry, frozen=True, kw_only=True, tag="workflow"):
    """A run of a ``@workflow`` registered by name."""

    workflow: str
    inputs: dict[str, Any] = {}
    concurrency: RunConcurrency | None = None
    budget: dict[str, Any] | None = None
    #: A re-run's earlier run: ``{"run_id", "restart", "fork": {"seq", "records"}}``.
    rerun_of: dict[str, Any] | None = None

    @property
    def workflow_name(self) -> str:
        """The workflow's registered name."""
        return self.workflow

    @property
    def run_inputs(self) -> dict[str, Any]:
        """The function's keyword arguments."""
        return self.inputs

    @property
    def budget_spec(self) -> dict[str, Any] | None:
        """The workflow's ``budget``, as registered when the run was submitted."""
        return self.budget


class CallableEntry(_Entry, frozen=True, kw_only=True, tag="callable"):
    """A run of an importable generator function (``Runtime.submit``)."""

    target: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}

    @property
    def runner(self) -> str:
        """``callable``: the runtime imports the target."""
        return EntryKind.CALLABLE.value

    @property
    def run_inputs(self) -> dict[str, Any]:
        """``{"args", "kwargs"}``."""
        return {"args": self.args, "kwargs": self.kwargs}


#: A run's entry, by its ``kind``.
Entry: TypeAlias = PlanEntry | WorkflowEntry | CallableEntry

_AT: Final = re.compile(r"at `\$((?:\.[A-Za-z0-9_]+|\[[^\]]*\])*)`")
_MISSING: Final = re.compile(r"missing required field `([^`]+)`")


def read_entry(raw: Any) -> Entry:
    """Read a RUN_START's entry (a decoded JSON object) into its typed value.

    Raises:
        MalformedEntry: ``raw`` is not an object, its ``kind`` is unknown, or
            a field is missing or has the wrong type (``field`` names it:
            ``plan``, ``concurrency.limit``).
    """
    if isinstance(raw, PlanEntry | WorkflowEntry | CallableEntry):
        return raw
    if not isinstance(raw, Mapping):
        raise MalformedEntry(
            f"a run's entry must be an object, not {type(raw).__name__}", field="entry"
        )
    kind = raw.get("kind")
    # Rejected: converting to the union; msgspec then takes many times a
    # struct's time (bench/README.md, "Figures behind design choices in the code").
    typed = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if typed is None:
        known = ", ".join(_BY_KIND)
        raise MalformedEntry(f"a run's entry: kind {kind!r} is not one of {known}", field="kind")
    try:
        return msgspec.convert(raw, typed, strict=True)
    except msgspec.ValidationError as exc:
        text = str(exc)
        found = _AT.search(text) or _MISSING.search(text)
        field = found.group(1).lstrip(".") if found is not None else ""
        raise MalformedEntry(f"a run's entry: {text}", field=field or "entry") from None


_BY_KIND: Final[dict[str, type[Entry]]] = {
    EntryKind.PLAN.value: PlanEntry,
    EntryKind.WORKFLOW.value: WorkflowEntry,
    EntryKind.CALLABLE.value: CallableEntry,
}


def entry_kind(raw: Any) -> EntryKind | None:
    """The kind ``raw`` says it is, without reading the rest (None: none known).

    For indexes and displays that list every run, malformed ones included.
    """
    kind = raw.get("kind") if isinstance(raw, Mapping) else getattr(raw, "kind", None)
    try:
        return EntryKind(kind) if isinstance(kind, str) else None
    except ValueError:
        return None


def reading(raw: Any) -> Entry | None:
    """``raw`` read as :func:`read_entry` reads it, or None when it is malformed.

    For the store's readers and displays, which show every run, an old or
    damaged one included; the runtime refuses to run a malformed entry.
    """
    try:
        return read_entry(raw)
    except MalformedEntry:
        return None
