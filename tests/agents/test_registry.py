"""The tool registry: built-ins, enabled sets, unknown and disabled tools."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from tiffany.agents.registry import DEFAULT_ENABLED, ToolDisabled, ToolRegistry, UnknownTool
from tiffany.agents.tools import BUILTIN_TOOLS, ToolArgs, ToolContext
from tiffany.agents.tools import python as pytool

ALL = [
    "agent",
    "file.read",
    "file.write",
    "http",
    "llm",
    "memory.delete",
    "memory.get",
    "memory.link",
    "memory.neighbors",
    "memory.put",
    "memory.search",
    "plan.run",
    "python",
    "shell",
    "signal.wait",
    "sleep",
]


class EchoArgs(ToolArgs):
    value: Any = None


class Echo:
    name: ClassVar[str] = "echo"
    Args: ClassVar[type[ToolArgs]] = EchoArgs
    durable: ClassVar[bool] = True

    def run(self, args: EchoArgs, ctx: ToolContext) -> Any:
        return args.value


def test_default_has_every_builtin_and_enables_all_but_shell():
    reg = ToolRegistry.default()
    assert reg.all_names() == ALL
    assert reg.names() == sorted(DEFAULT_ENABLED)
    assert "shell" not in DEFAULT_ENABLED
    assert not reg.is_enabled("shell")
    with pytest.raises(ToolDisabled) as info:
        reg.get("shell")
    assert info.value.code == "tool.disabled"
    assert reg.get("http").name == "http"


def test_everything_enabled_as_tiffany_run_does():
    reg = ToolRegistry.default(enabled=ToolRegistry.default().all_names())
    assert reg.names() == ALL
    assert reg.get("shell").name == "shell"


def test_unknown_tool_lists_the_known_ones():
    with pytest.raises(UnknownTool) as info:
        ToolRegistry.default().get("teleport")
    assert info.value.code == "tool.unknown"
    assert "file.read, file.write, http" in info.value.message
    with pytest.raises(UnknownTool, match="teleport"):
        ToolRegistry.default(enabled=["http", "teleport"])


def test_explicit_registry_enables_what_it_holds_and_register_adds():
    reg = ToolRegistry([Echo()])
    assert reg.names() == ["echo"]
    assert reg.get("echo").run(EchoArgs(value=3), None) == 3
    reg2 = ToolRegistry([Echo()], enabled=[])
    assert reg2.names() == []
    assert "echo" in reg2
    reg2.enable(["echo"])
    assert reg2.is_enabled("echo")
    reg3 = ToolRegistry.default()
    reg3.register(Echo(), enable=True)
    assert "echo" in reg3.names()


@pytest.mark.parametrize("tool_cls", BUILTIN_TOOLS, ids=lambda c: c.name)
def test_builtins_follow_the_contract(tool_cls):
    assert issubclass(tool_cls.Args, ToolArgs)
    assert issubclass(tool_cls.Args, BaseModel)
    assert tool_cls.Args.model_config.get("extra") == "forbid"
    assert isinstance(tool_cls.durable, bool)
    assert callable(tool_cls().run)


def test_default_loads_entry_point_functions(monkeypatch):
    ep = EntryPoint(name="ep_upper", value="builtins:str", group="tiffany.tools")
    monkeypatch.setattr(pytool, "entry_points", lambda *, group: [ep])
    monkeypatch.setattr(pytool, "_entry_points_loaded", False)
    try:
        ToolRegistry.default()
        assert "ep_upper" in pytool.functions()
    finally:
        pytool.unregister_function("ep_upper")


def test_the_default_tools_are_the_same_list_in_the_settings_and_the_registry() -> None:
    """Two copies on purpose (agents may not import config: tests/test_layering.py); held equal."""
    from tiffany.agents.registry import DEFAULT_ENABLED
    from tiffany.config import DEFAULT_ENABLED_TOOLS

    assert set(DEFAULT_ENABLED_TOOLS) == DEFAULT_ENABLED
    assert len(DEFAULT_ENABLED_TOOLS) == len(DEFAULT_ENABLED)
