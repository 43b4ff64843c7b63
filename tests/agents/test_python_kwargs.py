"""A python step's kwargs are checked against its function's signature where the plan enters.

By name only: a value may hold a ``${...}`` reference (known when the step
runs). A function taking ``**kwargs`` takes any name; one without a
signature (a builtin) is called as given.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tiffany.agents.plan import parse_plan
from tiffany.agents.tools.python import (
    check_python_steps,
    register_function,
    unregister_function,
)

PREFIX = "tests_python_kwargs."


def _greet(name: str, *, loud: bool = False, greeting: str = "hi") -> str:
    return f"{greeting} {name}"


def _anything(first: str, **rest: Any) -> str:
    return first


def _by_position(value: str, /) -> str:
    return value


@pytest.fixture(autouse=True)
def _registered() -> Iterator[None]:
    functions = {"greet": _greet, "anything": _anything, "by_position": _by_position, "dict": dict}
    for name, fn in functions.items():
        register_function(PREFIX + name, fn, replace=True)
    yield
    for name in functions:
        unregister_function(PREFIX + name)


def _problems(*calls: tuple[str, Any]) -> dict[str, str]:
    steps = [
        {"id": f"s{i}", "tool": "python", "args": {"function": PREFIX + fn, "kwargs": kwargs}}
        for i, (fn, kwargs) in enumerate(calls)
    ]
    plan = parse_plan({"name": "p", "inputs": {"who": "ada"}, "steps": steps}, None)
    return {p["loc"]: p["msg"] for p in check_python_steps(plan.steps)}


def test_fitting_kwargs_pass_whatever_their_values() -> None:
    assert (
        _problems(
            ("greet", {"name": "${inputs.who}"}),
            ("greet", {"name": 3, "loud": "${inputs.who}", "greeting": None}),
            ("anything", {"first": "x", "whatever": 1}),
            ("dict", {"a": 1}),  # no signature to check against: called as given
            ("greet", "${inputs.who}"),  # kwargs as a whole from a reference: the run's to check
        )
        == {}
    )


def test_an_unknown_or_missing_name_is_refused_with_its_path() -> None:
    assert _problems(
        ("greet", {"nmae": "${inputs.who}", "lod": True}),
        ("anything", {}),
    ) == {
        "steps[0].args.kwargs.nmae": f"unexpected keyword argument 'nmae' of python function "
        f"'{PREFIX}greet'; did you mean 'name'? (parameters: name, loud, greeting)",
        "steps[0].args.kwargs.lod": f"unexpected keyword argument 'lod' of python function "
        f"'{PREFIX}greet'; did you mean 'loud'? (parameters: name, loud, greeting)",
        "steps[0].args.kwargs.name": f"missing required argument 'name' of python function "
        f"'{PREFIX}greet'",
        "steps[1].args.kwargs.first": f"missing required argument 'first' of python function "
        f"'{PREFIX}anything'",
    }


def test_a_positional_only_parameter_cannot_be_given() -> None:
    problems = _problems(("by_position", {"value": "x"}))
    assert problems["steps[0].args.kwargs.value"].startswith("unexpected keyword argument")
    assert "by position only" in problems["steps[0].args.kwargs"]
