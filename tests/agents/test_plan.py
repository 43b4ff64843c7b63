"""Plan validation: every problem named by the path of the field at fault."""

from __future__ import annotations

import json

import pytest

from tiffany.agents.plan import PlanError, load_plan, parse_plan
from tiffany.agents.refs import RefError, find_refs, resolve

TOOLS = ["http", "shell", "python", "llm", "file.read", "file.write", "sleep"]


def _plan(*steps, **extra):
    return {"name": "p", "steps": list(steps), **extra}


def _errors(doc, tools=TOOLS):
    with pytest.raises(PlanError) as info:
        parse_plan(doc, tools)
    return {e["loc"]: e["msg"] for e in info.value.errors}


def test_a_valid_plan_parses():
    doc = _plan(
        {
            "id": "fetch",
            "tool": "http",
            "args": {"method": "GET", "url": "http://x/${inputs.repo}"},
        },
        {
            "id": "count",
            "tool": "shell",
            "args": {"argv": ["wc", "-c"], "stdin": "${steps.fetch.output.body}"},
            "after": ["fetch"],
            "retries": 2,
            "timeout_s": 10,
        },
        inputs={"repo": "demo"},
        outputs={"size": "${steps.count.output.stdout}"},
    )
    plan = parse_plan(doc, TOOLS)
    assert [s.id for s in plan.steps] == ["fetch", "count"]
    assert plan.step("count").retries == 2


def test_unknown_after_is_named_by_its_path():
    errors = _errors(
        _plan(
            {"id": "a", "tool": "sleep"},
            {"id": "b", "tool": "sleep"},
            {"id": "c", "tool": "sleep", "after": ["b", "zz"]},
        )
    )
    assert errors == {"steps[2].after[1]": "unknown step 'zz'"}


def test_cycles_are_named_with_their_members():
    errors = _errors(
        _plan(
            {"id": "a", "tool": "sleep", "after": ["c"]},
            {"id": "b", "tool": "sleep", "after": ["a"]},
            {"id": "c", "tool": "sleep", "after": ["b"]},
        )
    )
    (msg,) = errors.values()
    assert msg.startswith("cycle: ")
    assert {"a", "b", "c"} <= set(msg.replace("cycle: ", "").split(" -> "))


def test_unknown_tools_are_rejected_before_anything_runs():
    errors = _errors(_plan({"id": "a", "tool": "rm-rf"}))
    assert "steps[0].tool" in errors
    assert "unknown tool 'rm-rf'" in errors["steps[0].tool"]


def test_shape_errors_come_from_pydantic_with_paths():
    errors = _errors(_plan({"id": "a", "tool": "sleep", "retries": -1}, {"tool": "sleep"}))
    assert "steps[0].retries" in errors
    assert "steps[1].id" in errors


def test_references_must_point_upstream():
    errors = _errors(
        _plan(
            {"id": "a", "tool": "sleep"},
            {"id": "b", "tool": "shell", "args": {"argv": ["echo", "${steps.a.output.x}"]}},
        )
    )
    assert errors == {"steps[1].args.argv[1]": "step 'a' is not upstream of 'b': add it to after"}


def test_unknown_inputs_and_bad_references():
    errors = _errors(
        _plan({"id": "a", "tool": "shell", "args": {"argv": ["${inputs.nope}", "${bogus}"]}})
    )
    assert errors["steps[0].args.argv[0]"] == "unknown input 'nope'"
    assert "bad reference" in errors["steps[0].args.argv[1]"]


def test_duplicate_ids_and_extra_fields():
    errors = _errors(_plan({"id": "a", "tool": "sleep"}, {"id": "a", "tool": "sleep"}))
    assert errors == {"steps[1].id": "duplicate step id 'a'"}
    errors = _errors(_plan({"id": "a", "tool": "sleep", "colour": "red"}))
    assert errors["steps[0].colour"].startswith("unknown field 'colour' (allowed: id, tool, args,")


def test_a_misspelt_field_is_named_with_a_did_you_mean_wherever_it_is():
    """A misspelt key was "Extra inputs are not permitted": which field was meant, and where."""
    step = {"id": "a", "tool": "sleep", "args": {"seconds": 0}, "aftr": []}
    errors = _errors(
        _plan(step, ouputs={}, budget={"token": 10}, concurrency={"key": "k", "limt": 1})
    )
    assert errors == {
        "steps[0].aftr": "unknown field 'aftr'; did you mean 'after'? (allowed: id, tool, "
        "args, after, retries, backoff, timeout_s, continue_on_error, dynamic)",
        "ouputs": "unknown field 'ouputs'; did you mean 'outputs'? (allowed: name, "
        "description, inputs, steps, outputs, concurrency, budget)",
        "budget.token": "unknown field 'token'; did you mean 'tokens'? (allowed: tokens, usd)",
        "concurrency.limt": "unknown field 'limt'; did you mean 'limit'? (allowed: key, limit)",
        "concurrency.limit": "Field required",
    }


def test_resolve_keeps_types_for_whole_references_and_interpolates_text():
    inputs = {"n": 3}
    outputs = {"fetch": {"items": [{"name": "x"}], "body": "hello"}}
    assert resolve("${inputs.n}", inputs, outputs) == 3
    assert resolve("${steps.fetch.output.items}", inputs, outputs) == [{"name": "x"}]
    assert (
        resolve("n=${inputs.n} first=${steps.fetch.output.items[0].name}", inputs, outputs)
        == "n=3 first=x"
    )
    assert resolve({"a": ["${steps.fetch.output.body}"]}, inputs, outputs) == {"a": ["hello"]}
    with pytest.raises(RefError):
        resolve("${steps.fetch.output.items[5]}", inputs, outputs)
    assert [r.name for r in find_refs({"x": "${inputs.n} ${steps.fetch.output.body}"})] == [
        "n",
        "fetch",
    ]


def test_load_plan_reads_json_and_yaml_and_names_syntax_errors(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps(_plan({"id": "a", "tool": "sleep"})))
    (tmp_path / "p.yaml").write_text("name: p\nsteps:\n  - id: a\n    tool: sleep\n")
    (tmp_path / "bad.json").write_text("{nope")
    assert load_plan(tmp_path / "p.json")["name"] == "p"
    assert load_plan(tmp_path / "p.yaml")["steps"][0]["id"] == "a"
    with pytest.raises(PlanError, match=r"bad\.json: not valid json"):
        load_plan(tmp_path / "bad.json")


def test_a_long_chain_listed_backwards_validates_without_recursion_limits() -> None:
    n = 5_000
    steps = [{"id": "s0", "tool": "sleep", "args": {"seconds": 0}}] + [
        {"id": f"s{i}", "tool": "sleep", "after": [f"s{i - 1}"], "args": {"seconds": 0}}
        for i in range(1, n)
    ]
    plan = parse_plan({"name": "long", "steps": steps[::-1]})
    assert len(plan.steps) == n
    steps[0]["after"] = [f"s{n - 1}"]
    with pytest.raises(PlanError) as err:
        parse_plan({"name": "loop", "steps": steps})
    assert err.value.errors[0]["msg"].startswith("cycle: ")
    assert err.value.errors[0]["msg"].count("->") == n


def test_a_reference_to_an_indirect_upstream_step_is_fine() -> None:
    doc = {
        "name": "x",
        "steps": [
            {"id": "a", "tool": "sleep", "args": {"seconds": 0}},
            {"id": "b", "tool": "sleep", "after": ["a"], "args": {"seconds": 0}},
            {
                "id": "c",
                "tool": "file.write",
                "after": ["b"],
                "args": {"path": "x", "content": "${steps.a.output.slept}"},
            },
            {
                "id": "d",
                "tool": "file.write",
                "args": {"path": "y", "content": "${steps.a.output.slept}"},
            },
        ],
    }
    with pytest.raises(PlanError) as err:
        parse_plan(doc)
    assert [e["loc"] for e in err.value.errors] == ["steps[3].args.content"]
    assert "not upstream" in err.value.errors[0]["msg"]


def test_bad_references_in_outputs_are_refused_before_anything_runs() -> None:
    # They passed validation, the run did every step, then failed on its outputs.
    doc = _plan(
        {"id": "a", "tool": "sleep", "args": {"seconds": 0}},
        outputs={
            "z": "${bogus}",
            "y": "${steps.a.outptu}",
            "n": {"deep": ["${inputs.q}", "${steps.zz.output}"]},
            "ok": "${steps.a.output.slept}",
        },
    )
    assert _errors(doc) == {
        "outputs.z": "bad reference ${bogus}: use inputs.NAME or steps.ID.output",
        "outputs.y": "bad reference ${steps.a.outptu}: use inputs.NAME or steps.ID.output",
        "outputs.n.deep[0]": "unknown input 'q'",
        "outputs.n.deep[1]": "unknown step 'zz'",
    }


def test_a_bad_step_id_is_listed_with_the_plans_other_problems() -> None:
    """A bad id (or retries, or an unknown field) was told alone; the rest came after its fix."""
    errors = _errors(
        _plan(
            {"id": "../x", "tool": "sleep"},
            {"id": "b", "tool": "nosuch", "after": ["zzz", "../x"], "retries": -3, "timeout": 5},
            {"id": "c", "tool": "shell", "args": {"argv": ["${steps.b.output}"]}},
            name="",
        )
    )
    assert set(errors) == {
        "name",
        "steps[0].id",
        "steps[1].retries",
        "steps[1].timeout",
        "steps[1].tool",
        "steps[1].after[0]",  # not [1]: the bad id is still the step's id
        "steps[2].args.argv[0]",
    }
    assert "unknown tool 'nosuch'" in errors["steps[1].tool"]
    assert errors["steps[1].after[0]"] == "unknown step 'zzz'"


def test_a_shape_error_other_checks_would_build_on_is_told_alone() -> None:
    # Without its `after`, b's reference would be "not upstream": a consequence, not a problem.
    errors = _errors(
        _plan(
            {"id": "a", "tool": "sleep"},
            {"id": "b", "tool": "nosuch", "after": "a", "args": {"x": "${steps.a.output}"}},
        )
    )
    assert list(errors) == ["steps[1].after"]
