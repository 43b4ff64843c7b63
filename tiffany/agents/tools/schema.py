"""What a tool declares, as data: its arguments, its output, one line about it.

``describe(tool)`` is what ``GET /api/tools``, ``tiffany tools`` and
docs/tools.md show: ``{"name", "description", "durable", "args", "output"}``,
``args`` and ``output`` being the JSON Schemas of the tool's ``Args`` and
``Output`` models. A field's description comes from its ``Field(description=)``
or else from the ``Attributes:`` section of its model's docstring (where the
built-in tools document their arguments), so the two never disagree.

``arg_fields(model)`` is what plan validation checks a step's arguments
against at submission: the names a plan may write (a field's alias when it
has one: ``http``'s ``json``), and which of them are required.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

__all__ = [
    "ArgField",
    "arg_fields",
    "args_schema",
    "describe",
    "output_schema",
    "summary",
]

#: Indentation of an entry of a docstring's ``Attributes:`` section (continuations: more).
_ENTRY_INDENT: Final = 4
_ATTRIBUTE: Final = re.compile(r"^(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


@dataclass(frozen=True, slots=True)
class ArgField:
    """One argument a plan may write.

    Attributes:
        key: The name in the plan (the alias, if any).
        name: The model's field name.
        required: No default: the step must give it.
        shown: The key listed to users (False: a field name also accepted for its alias).
    """

    key: str
    name: str
    required: bool
    shown: bool = True


@functools.cache
def arg_fields(model: type[BaseModel]) -> dict[str, ArgField]:
    """Return the arguments of ``model`` by the key a plan writes (field names too, if accepted).

    The aliases come first, in declaration order: that is how errors list them.
    Made once per model (a 1,000-step plan asked 1,000 times); do not change it.
    """
    out: dict[str, ArgField] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        out[key] = ArgField(key, name, info.is_required())
    if model.model_config.get("populate_by_name"):
        for name, info in model.model_fields.items():
            out.setdefault(name, ArgField(name, name, info.is_required(), shown=False))
    return out


def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """The ``Attributes:`` entries of a model's (Google-style) docstring, by name."""
    doc = inspect.cleandoc(model.__doc__ or "")
    out: dict[str, str] = {}
    current: str | None = None
    inside = False
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):
            break  # the next section
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        match = _ATTRIBUTE.match(stripped) if indent == _ENTRY_INDENT else None
        if match:
            current = match.group(1)
            out[current] = match.group(2)
        elif current and stripped and indent > _ENTRY_INDENT:
            out[current] += " " + stripped
    return out


def _fill_descriptions(model: type[BaseModel], schema: dict[str, Any]) -> dict[str, Any]:
    docs = _attribute_docs(model)
    fields = arg_fields(model)
    for key, prop in schema.get("properties", {}).items():
        name = fields[key].name if key in fields else key
        text = docs.get(key) or docs.get(name)
        if text and "description" not in prop:
            prop["description"] = text
    description = schema.get("description")
    if isinstance(description, str):  # the summary only: the Attributes now sit on the fields
        schema["description"] = description.split("\n\n")[0].strip()
    return schema


def args_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Return the JSON Schema of an ``Args`` model, its fields described."""
    return _fill_descriptions(model, model.model_json_schema(by_alias=True))


def output_schema(model: type[BaseModel] | None) -> dict[str, Any]:
    """Return the JSON Schema of an ``Output`` model (a tool without one: free-form)."""
    if model is None:
        return {"description": "Free-form: this tool declares no output model."}
    return _fill_descriptions(model, model.model_json_schema(by_alias=True))


def summary(tool: object) -> str:
    """The first line of a tool's docstring."""
    doc = inspect.getdoc(tool) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    return line.replace("``", "`")  # Markdown, as docs/tools.md and the API show it


def describe(tool: Any) -> dict[str, Any]:
    """Return ``{"name", "description", "durable", "args", "output"}`` for ``tool``."""
    return {
        "name": str(tool.name),
        "description": summary(tool),
        "durable": bool(tool.durable),
        "args": args_schema(tool.Args),
        "output": output_schema(getattr(tool, "Output", None)),
    }
