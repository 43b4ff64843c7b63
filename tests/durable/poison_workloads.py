"""Workloads whose data the journal cannot take as it is (importable by name: replay re-imports).

Lone surrogates (what a JSON ``"\\ud800"`` escape decodes to), structures
holding themselves, objects whose ``repr`` raises: in a step's result, an
error's message, a task's or step's name, a run's own result. Each root
returns (or raises) what it saw, so a replay that saw anything else diverges.
"""

from __future__ import annotations

from typing import Any

from tiffany.durable import Step
from tiffany.errors import UnjournalableValue
from tiffany.kernel import NewTask, Receive, WaitTask

#: A lone surrogate in text (not valid Unicode; UTF-8 cannot encode it).
POISON = "x\ud800y"


class BadRepr:
    """An object whose ``repr`` (and ``str``) raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


class SurrogateRepr:
    """An object whose ``repr`` holds a lone surrogate."""

    def __repr__(self) -> str:
        return f"<SurrogateRepr {POISON}>"


def _cyclic() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


def _deep() -> list[Any]:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    return deep


RESULTS = {
    "surrogate": lambda: POISON,
    "surrogate_key": lambda: {POISON: 1},
    "cyclic": _cyclic,
    "deep": _deep,
}


def _result(kind: str) -> Any:
    return RESULTS[kind]()


def _raise_surrogate() -> None:
    raise ValueError(f"bad {POISON}", {"k": POISON})


def _raise_cyclic() -> None:
    raise ValueError(_cyclic())


def _stand_ins() -> dict[str, Any]:
    return {"bad": BadRepr(), "sur": SurrogateRepr(), "n": 1}


def _child() -> Any:
    yield
    return 1


def _one() -> int:
    return 1


def poisoned_results() -> Any:
    """Each result the journal cannot take fails its step with ``journal.value``."""
    seen = []
    for kind in RESULTS:
        try:
            yield Step(_result, kind)
        except UnjournalableValue as exc:
            seen.append([kind, exc.code, exc.fields["reason"].split(":")[0]])
        else:
            seen.append([kind, "accepted"])
    return seen


def poisoned_errors() -> Any:
    """Errors whose message holds a surrogate, or whose argument holds itself, reach the task."""
    seen = []
    for fn in (_raise_surrogate, _raise_cyclic):
        try:
            yield Step(fn)
        except ValueError as exc:
            seen.append(str(exc))
    return seen


def stand_ins() -> Any:
    """Parts with no journaled form (a ``repr`` that raises or holds a surrogate): stand-ins."""
    return (yield Step(_stand_ins))


def poisoned_names() -> Any:
    """A task, a step and a signal channel named from data (lone surrogates, a raising str)."""
    tid = yield NewTask(_child(), name=f"child-{POISON}")
    a = yield WaitTask(tid)
    b = yield Step(_one, name=f"step-{POISON}" + "z" * 200)
    c = yield Step(_one, name=BadRepr())  # type: ignore[arg-type]
    return a + b + c


def poisoned_result() -> Any:
    """The run's own result holds a surrogate (its RUN_END keeps a stand-in)."""
    yield Step(_one)
    return [POISON]


def poisoned_crash() -> Any:
    """The run fails with an error whose message holds a surrogate."""
    yield Step(_one)
    raise ValueError(POISON)


def waits_for_signal() -> Any:
    """Waits for signal ``go`` and returns its payload."""
    return (yield Receive("go"))


def echo(value: Any) -> Any:
    """Returns its argument."""
    yield
    return value
