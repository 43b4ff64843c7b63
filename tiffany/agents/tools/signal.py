"""``signal.wait``: wait for a signal sent to the run (human approval, a webhook).

``{"tool": "signal.wait", "args": {"name": "approve", "timeout_s": 3600}}``
waits until ``POST /api/runs/{run_id}/signals/approve`` (or ``tiffany
signal RUN approve --data JSON``) sends one, and outputs the signal's JSON
payload. A signal sent before the step waits is kept for it, and each
signal is taken by one wait (oldest first), as Temporal's signals are.

Not a durable *step*: it runs in the worker task itself, and the journal
records the wait (a ``Receive`` dispatch) and the signal (a WAKE record of
the run, written before the sender's 202). A replay hands the recorded
signal back at the same point, and an engine killed while the step waits
resumes the wait on restart, with what is left of the timeout. When the
timeout passes first the step fails with ``signal.timeout`` (its
``retries`` and ``continue_on_error`` apply: a retry waits again).

A payload schema: ``"schema": {...}`` (JSON Schema, draft 2020-12 unless
the schema's ``$schema`` names another) is what the wait's payload must
be. The schema itself is checked when the plan is submitted (422 naming
``steps[i].args.schema``); it is self-contained (a ``$ref`` points inside
it: nothing is fetched). A payload is checked where the engine takes the
signal (``tiffany/engine/requests.py``, from the socket or the database
alike) with :class:`RunSignals`, before anything is journaled: one that
does not satisfy it is refused (422 naming the field by its JSON pointer),
so a step never takes a payload its later steps cannot use. The dashboard
makes its signal form from the schema.

Invariants:

* A payload is checked against the schema of *every* step of the run that
  waits for its name, reached or not (a signal is taken by whichever wait
  asks first, so it must do for any of them); a plan that wants different
  payloads uses different names. A step whose name is a reference to a
  step's output is known at run time only: its schema is not applied at
  send time.
* The schema is not applied again when the step takes the payload: the
  journal's record is what the replay hands back, whatever the schema says.

Discussion: rejected, checking the payload in the step (a ``ValueError``
when it takes it): the signal is journaled and taken by then, and the step
fails, its approval used up (what the approval example did when its
``publish`` step read a field the dashboard's Approve had not sent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.validators import validator_for
from pydantic import Field, field_validator
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with

from tiffany.agents.refs import RefError, find_refs, resolve
from tiffany.agents.tools.base import FreeFormOutput, ToolArgs, ToolContext, ToolError
from tiffany.errors import WaitTimeout
from tiffany.kernel import Coroutine, Receive
from tiffany.wire.documents import SIGNAL_NAME_PATTERN
from tiffany.wire.records import reserved_signal, reserved_signal_message

__all__ = [
    "MAX_PAYLOAD_ERRORS",
    "MAX_SIGNAL_WAIT_S",
    "PAYLOAD_INVALID",
    "RunSignals",
    "SignalTimeout",
    "SignalWaitArgs",
    "SignalWaitOutput",
    "SignalWaitTool",
]

#: Longest a step may wait for a signal, in seconds (a year).
MAX_SIGNAL_WAIT_S: Final = 366 * 86_400.0
#: The most fields one refused payload's answer names (the first, by place in the payload).
MAX_PAYLOAD_ERRORS: Final = 20
#: The code of a payload its wait's schema refuses (a 422's ``detail`` items carry it).
PAYLOAD_INVALID: Final = "signal.payload_invalid"
#: The JSON Schema dialect of a schema that names none (``$schema``).
_DIALECT: Final = Draft202012Validator
#: Resolves a schema's references inside it only: nothing is ever fetched.
_NO_RETRIEVAL: Final[Registry[Any]] = Registry()


class SignalTimeout(ToolError):
    """No signal of the name came within the step's ``timeout_s``."""

    code = "signal.timeout"


class SignalWaitArgs(ToolArgs):
    """Arguments of ``signal.wait``: the signal's ``name``; ``timeout_s`` (none: wait for ever)."""

    name: str = Field(
        pattern=SIGNAL_NAME_PATTERN,
        description=(
            "The signal to wait for (names starting with child:, concurrency. or tiffany. "
            "are the engine's)."
        ),
    )
    timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_SIGNAL_WAIT_S, description="Fail the step after this long."
    )
    payload_schema: dict[str, Any] | None = Field(
        default=None,
        alias="schema",
        description=(
            "A JSON Schema the payload must satisfy: a payload that does not is refused when "
            "it is sent (422 naming the field), and the dashboard's form is made from it."
        ),
    )

    @field_validator("payload_schema")
    @classmethod
    def _a_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            check_schema(schema)
        return schema

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        # A wait on the engine's own signal would take a sub-plan's end, or a
        # run's slot, from the step or planner it is meant for.
        if reserved_signal(name) is not None:
            raise ValueError(reserved_signal_message(name))
        return name


class SignalWaitOutput(FreeFormOutput):
    """Free-form: the signal's payload, any JSON value its sender gave."""


class SignalWaitTool:
    """Wait for signal ``name``; output its payload."""

    name: ClassVar[str] = "signal.wait"
    Args: ClassVar[type[ToolArgs]] = SignalWaitArgs
    Output: ClassVar[type[FreeFormOutput]] = SignalWaitOutput
    durable: ClassVar[bool] = False

    def run(self, args: SignalWaitArgs, ctx: ToolContext) -> Coroutine:
        """Receive the signal in the worker task (journaled; see the module docstring)."""
        try:
            payload: Any = yield Receive(args.name, args.timeout_s)
        except WaitTimeout:
            raise SignalTimeout(
                f"no signal {args.name!r} came within {args.timeout_s} s",
                signal=args.name,
                timeout_s=args.timeout_s,
            ) from None
        return payload


def check_schema(schema: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``schema`` is a valid, self-contained JSON Schema.

    Self-contained: every ``$ref`` (and ``$dynamicRef``) points inside it
    (``#...``): a schema from a plan never makes the engine fetch a URL.
    """
    cls = validator_for(schema, default=_DIALECT)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        at = pointer(exc.absolute_path)
        raise ValueError(
            f"not a valid JSON Schema: {exc.message}" + (f" (at {at})" if at else "")
        ) from None
    dialect = schema.get("$schema")
    spec = specification_with(dialect if isinstance(dialect, str) else "", default=DRAFT202012)
    resolver = _NO_RETRIEVAL.resolver_with_root(spec.create_resource(schema))
    for at, ref in _references(schema, ""):
        if not ref.startswith("#"):
            raise ValueError(
                f"$ref {ref!r} at {at} points outside the schema: a wait's schema is "
                "self-contained (references start with #)"
            )
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ValueError(f"$ref {ref!r} at {at} points to nothing in the schema") from None


def pointer(path: Iterable[Any]) -> str:
    """The JSON pointer (RFC 6901) of a path of keys and indexes: ``/items/0/by``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _references(value: Any, at: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, Mapping):
        for key, sub in value.items():
            if key in ("$ref", "$dynamicRef") and isinstance(sub, str):
                yield f"{at}/{key}", sub
            else:
                yield from _references(sub, pointer([*_split(at), key]))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _references(sub, f"{at}/{i}")


def _split(at: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in at.split("/")[1:]]


class _Wait:
    """One ``signal.wait`` step of a run: its name (None: known at run time only), its schema."""

    __slots__ = ("name", "schema", "step", "validator")

    def __init__(
        self, step: str, name: str | None, schema: Mapping[str, Any] | None, checked: bool
    ) -> None:
        self.step, self.name, self.schema = step, name, schema
        self.validator: Any = None
        if schema is not None:
            try:  # a dynamic step's was not checked at submission (the step fails when run)
                if not checked:
                    check_schema(schema)
            except ValueError:
                return
            self.validator = validator_for(schema, default=_DIALECT)(schema, registry=_NO_RETRIEVAL)


class RunSignals:
    """The signals a plan run's steps wait for, and their schemas: what a sent signal is held to.

    Built from the plan's steps when the run starts (and when a dynamic step
    adds some: :meth:`plus`); never changed after (a new one replaces it),
    so the threads that check payloads read it without a lock.
    """

    __slots__ = ("_by_name", "_open", "_waits")

    def __init__(self, waits: Iterable[_Wait] = ()) -> None:
        self._waits = tuple(waits)
        by_name: dict[str, list[_Wait]] = {}
        for wait in self._waits:
            if wait.name is not None:
                by_name.setdefault(wait.name, []).append(wait)
        self._by_name = by_name
        #: A wait whose name is known at run time only: any name may be awaited.
        self._open = any(w.name is None for w in self._waits)

    @classmethod
    def of_steps(cls, steps: Any, inputs: Mapping[str, Any]) -> RunSignals:
        """The waits among a submitted plan's ``steps`` (its document's), names resolved.

        ``inputs``: the run's, for a name that references one. Cheap (on the
        loop): the schemas were checked at submission, a validator is made
        lazily.
        """
        return cls(_waits_of(steps, inputs, checked=True))

    @classmethod
    def open(cls) -> RunSignals:
        """A code run's (a workflow's): any name may be awaited; schemas join as it waits."""
        return cls([_Wait("code", None, None, True)])

    def plus(self, steps: Any, inputs: Mapping[str, Any]) -> RunSignals:
        """These waits and those among ``steps`` (a dynamic step's, schemas checked here)."""
        return RunSignals([*self._waits, *_waits_of(steps, inputs, checked=False)])

    def names(self) -> list[str]:
        """The signal names the run's steps wait for, sorted."""
        return sorted(self._by_name)

    def schema(self, name: str) -> Mapping[str, Any] | None:
        """The payload schema of the newest wait for ``name`` that declares one, or None."""
        for wait in reversed(self._by_name.get(name, ())):
            if wait.schema is not None:
                return wait.schema
        return None

    def refusal(self, name: str, payload: Any) -> tuple[str, list[dict[str, Any]]] | None:
        """Why ``payload`` cannot be signal ``name``'s: ``(message, 422 detail)``, or None.

        Each detail item: ``{"loc": ["body", ...], "msg", "pointer", "step",
        "code"}``, the fields at fault by their place in the payload, at most
        :data:`MAX_PAYLOAD_ERRORS`.
        """
        for wait in self._by_name.get(name, ()):
            if wait.validator is None:
                continue
            try:
                errors = sorted(wait.validator.iter_errors(payload), key=_place)
            except Unresolvable:  # a reference check_schema could not follow (a nested $id)
                continue
            if not errors:
                continue
            items = [i for e in errors for i in _items(e, wait.step)][:MAX_PAYLOAD_ERRORS]
            first = items[0]
            where = first["pointer"] or "the payload"
            message = (
                f"signal {name}'s payload does not satisfy step {wait.step}'s schema: "
                f"{where}: {first['msg']}"
            )
            return message, items
        return None

    def warning(self, name: str, whose: str) -> str | None:
        """What to tell the sender of signal ``name`` that no step waits for, or None.

        ``whose``: the steps' owner as the words say it (``run RUN_ID``).
        """
        if name in self._by_name or self._open:
            return None
        awaited = ", ".join(
            f"{n} (step {', '.join(w.step for w in self._by_name[n])})" for n in self.names()
        )
        return (
            f"no step of {whose} waits for signal {name!r}: it is kept, and taken only by a "
            f"wait for that name; its steps wait for: {awaited or 'no signal'}"
        )


def _waits_of(steps: Any, inputs: Mapping[str, Any], *, checked: bool) -> list[_Wait]:
    out = []
    for spec in steps if isinstance(steps, list | tuple) else ():
        if isinstance(spec, Mapping):
            step, tool, args = spec.get("id"), spec.get("tool"), spec.get("args")
        else:  # a StepSpec
            step, tool, args = spec.id, spec.tool, spec.args
        if tool != SignalWaitTool.name or not isinstance(args, Mapping):
            continue
        name = args.get("name")
        if isinstance(name, str) and find_refs(name):
            try:
                name = resolve(name, inputs, {})
            except (RefError, KeyError, TypeError):
                name = None  # a step's output: known at run time only
        schema = args.get("schema")
        out.append(
            _Wait(
                str(step),
                name if isinstance(name, str) else None,
                schema if isinstance(schema, Mapping) else None,
                checked,
            )
        )
    return out


def _place(error: ValidationError) -> list[str]:
    """Where an error is in the payload, as a sort key (keys and indexes alike)."""
    return [str(p) for p in error.absolute_path]


def _items(error: ValidationError, step: str) -> list[dict[str, Any]]:
    """The 422 items of one schema error: a missing property names the property itself."""
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [p for p in error.validator_value if p not in error.instance]
        return [_item([*path, p], f"{p!r} is a required property", step) for p in missing] or [
            _item(path, error.message, step)
        ]
    return [_item(path, error.message, step)]


def _item(path: list[Any], msg: str, step: str) -> dict[str, Any]:
    return {
        "loc": ["body", *path],
        "msg": msg,
        "pointer": pointer(path),
        "step": step,
        "code": PAYLOAD_INVALID,
    }
