"""The tools' JSON schemas (keel.protocol.tools) against what the host's tools really read.

The schemas are declared once, in protocol/, and both the host's tools and the coder agent use that
declaration. What can still go wrong is a schema that does not describe its tool: the coder refuses an
argument its schema does not list, so a tool reading an undeclared argument could never receive it, and
an argument a tool cannot do without must be `required`. These tests read each tool's code for the
arguments it takes (`arg(args, "name", kind)` without a default is one it cannot do without).
"""

from __future__ import annotations

import inspect
import re

import pytest

from keel.agents import coder
from keel.protocol.tools import SPECS, TOOL_SPECS
from keel.server.tools import TOOLS

_ARG = re.compile(r"""arg\(args, "(\w+)", (\w+)(, [^)]*)?\)""")


def _arguments(tool: object) -> dict[str, bool]:
    """Each argument the tool's code reads, with whether it has a default there."""
    found: dict[str, bool] = {}
    for name, _, default in _ARG.findall(inspect.getsource(type(tool))):
        found[name] = found.get(name, True) and default != ""
    return found


def test_every_tool_runs_under_its_protocol_spec() -> None:
    assert list(TOOLS) == [spec.name for spec in TOOL_SPECS]
    for name, tool in TOOLS.items():
        assert tool.parameters is SPECS[name].parameters and tool.description == SPECS[name].description
    assert coder.TOOL_SPECS is TOOL_SPECS  # what the coder offers a model is the same declaration


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_schema_lists_every_argument_the_tool_reads(name: str) -> None:
    schema = SPECS[name].parameters
    reads = _arguments(TOOLS[name])
    assert reads, f"found no arguments read by {name}: the pattern no longer matches the tools' code"
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert sorted(set(reads) - set(schema["properties"])) == [], f"{name} reads arguments its schema lacks"
    needed = sorted(arg for arg, optional in reads.items() if not optional)
    assert sorted(schema.get("required", [])) == needed, f"{name}: required arguments differ from the code's"
