"""The language server's payloads are declared three times — the structs that encode them
(server/lsp/convert.py, server/activity/), the extension's types (client-vscode/src/protocol.ts) and the
contract (docs/lsp.md) — and must say the same: every field of a struct is a field of its TypeScript
interface and none other, of the same type (the same set of values for a state), a field the server may
leave out is optional there, and the contract's section names every field. The value sets of the states and
what may be asked of a mission in each are generated into protocol.ts (scripts/protocol_ts.py)."""

from __future__ import annotations

import enum
import importlib.util
import re
import types
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from keel.server.activity.items import ActivityItem, FileChange
from keel.server.activity.reader import ActivityPage
from keel.server.lsp import convert as c

ROOT = Path(__file__).resolve().parents[1]
TS = (ROOT / "client-vscode" / "src" / "protocol.ts").read_text()
DOCS = (ROOT / "docs" / "lsp.md").read_text()

# struct -> (its TypeScript interface, the docs/lsp.md section that shows it)
PAYLOADS: dict[type[msgspec.Struct], tuple[str, str]] = {
    c.MissionSummary: ("MissionSummary", "MissionSummary"),
    c.QuestionPayload: ("Question", "MissionSummary"),
    c.UnitCounts: ("UnitCounts", "MissionSummary"),
    c.UsagePayload: ("MissionUsage", "MissionSummary"),
    c.HostPayload: ("MissionHost", "MissionSummary"),
    c.ForkOrigin: ("ForkOrigin", "MissionSummary"),
    c.MissionDetail: ("MissionDetail", "MissionDetail (`keel/mission`)"),
    c.UnitPayload: ("UnitInfo", "MissionDetail (`keel/mission`)"),
    c.EventPayload: ("MissionEvent", "MissionDetail (`keel/mission`)"),
    c.RestorePointPayload: ("RestorePoint", "RestorePoint (`keel/restorePoints`)"),
    c.SubagentPayload: ("Subagent", "Subagent (`keel/subagents`)"),
    c.ProvidersPayload: ("ProvidersPayload", "Providers (`keel/providers`, `keel/providersChanged`)"),
    c.ProviderEndpointPayload: ("ProviderEndpoint", "Providers (`keel/providers`, `keel/providersChanged`)"),
    ActivityItem: ("ActivityItem", "Activity (`keel/activity`, `keel/activityChanged`)"),
    FileChange: ("ActivityFileChange", "Activity (`keel/activity`, `keel/activityChanged`)"),
    ActivityPage: ("ActivityPage", "Activity (`keel/activity`, `keel/activityChanged`)"),
}


def ts_fields(source: str, name: str) -> dict[str, bool]:
    """The fields of `export interface name` in `source`: name -> optional."""
    found = re.search(rf"^export interface {name} \{{\n(.*?)^\}}", source, re.S | re.M)
    assert found, f"protocol.ts declares no interface {name}"
    fields = {}
    for line in found.group(1).splitlines():
        field = re.match(r"^  (\w+)(\??):", line)  # two spaces: the interface's own fields, not nested ones
        if field:
            fields[field.group(1)] = field.group(2) == "?"
    return fields


def ts_field_types(source: str, name: str) -> dict[str, str]:
    """The declared type of each field of `export interface name` in `source`."""
    found = re.search(rf"^export interface {name} \{{\n(.*?)^\}}", source, re.S | re.M)
    assert found, f"protocol.ts declares no interface {name}"
    return dict(re.findall(r"^  (\w+)\??: (.+);$", found.group(1), re.M))


def ts_aliases(source: str) -> dict[str, set[str]]:
    """`export type X = | "a" | "b";` -> {"X": {'"a"', '"b"'}}: the value sets of protocol.ts's unions."""
    found = re.findall(r"^export type (\w+) =\s*((?:\|?\s*\"\w+\"\s*)+);", source, re.M)
    return {name: set(re.findall(r'"\w+"', body)) for name, body in found}


def ts_values(declared: str, aliases: dict[str, set[str]]) -> set[str]:
    """A declared type as the set of its alternatives, a union alias replaced by its values."""
    out: set[str] = set()
    for alternative in (a.strip() for a in declared.split(" | ")):
        out |= aliases.get(alternative, {alternative})
    return out


def py_values(annotation: Any) -> set[str]:
    """The TypeScript alternatives a field's Python type is declared with: a state is its set of values."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(py_values(arg) for arg in args))
    if origin in (tuple, list):
        (inner,) = py_values(args[0])
        return {f"{inner}[]"}
    if origin is dict:
        return {f"Record<string, {next(iter(py_values(args[1])))}>"}
    if isinstance(annotation, type) and issubclass(annotation, enum.StrEnum):
        return {f'"{value.value}"' for value in annotation}
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return {PAYLOADS[annotation][0]}
    simple = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null", Any: "unknown"}
    return {simple[annotation]}


def py_field_types(struct: type[msgspec.Struct]) -> dict[str, set[str]]:
    """Each field as encoded -> its TypeScript alternatives; None left out when the server omits it."""
    hints = typing.get_type_hints(struct)
    omits = struct.__struct_config__.omit_defaults
    out = {}
    for field in msgspec.structs.fields(struct):
        values = py_values(hints[field.name])
        if omits and field.default is None:
            values.discard("null")  # never sent as null: left out
        out[field.encode_name] = values
    return out


def py_fields(struct: type[msgspec.Struct]) -> dict[str, bool]:
    """The fields of `struct` as encoded: name -> may be left out (omit_defaults and a default)."""
    omits = struct.__struct_config__.omit_defaults
    return {
        f.encode_name: omits and (f.default is not msgspec.NODEFAULT or f.default_factory is not msgspec.NODEFAULT)
        for f in msgspec.structs.fields(struct)
    }


def docs_section(source: str, title: str) -> str:
    found = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^##)", source, re.S | re.M)
    assert found, f"docs/lsp.md has no section '### {title}'"
    return found.group(1)


@pytest.mark.parametrize("struct", list(PAYLOADS), ids=lambda s: s.__name__)
def test_a_payload_is_declared_alike_in_all_three_places(struct: type[msgspec.Struct]) -> None:
    interface, section = PAYLOADS[struct]
    python, typescript = py_fields(struct), ts_fields(TS, interface)
    assert sorted(python) == sorted(typescript), f"{struct.__name__} and protocol.ts's {interface} differ"
    required_there = [name for name, omitted in python.items() if omitted and not typescript[name]]
    assert not required_there, f"{interface} requires fields the server may leave out: {required_there}"
    aliases = ts_aliases(TS)
    declared = {name: ts_values(text, aliases) for name, text in ts_field_types(TS, interface).items()}
    for name, values in py_field_types(struct).items():
        there = declared[name] - ({"null"} if "null" not in values else set())  # TS may allow null for absent
        assert there == values, f"{interface}.{name} is declared {sorted(there)}, the server sends {sorted(values)}"
    text = docs_section(DOCS, section)
    missing = [name for name in python if f'"{name}"' not in text]
    assert not missing, f"docs/lsp.md's {section} does not show {struct.__name__}'s {missing}"


def test_the_checker_sees_a_field_missing_or_wrongly_required() -> None:
    source = "export interface X {\n  a: string;\n  b?: number;\n  /** c */\n  nested?: { d: string };\n}\n"
    assert ts_fields(source, "X") == {"a": False, "b": True, "nested": True}

    class X(msgspec.Struct, rename="camel", omit_defaults=True):
        a: str
        b_c: int = 0

    assert py_fields(X) == {"a": False, "bC": True}


class _Mode(enum.StrEnum):
    ON = "on"
    OFF = "off"
    AUTO = "auto"


class _Sample(msgspec.Struct, omit_defaults=True):
    a: str
    m: _Mode
    names: tuple[str, ...] = ()
    r: dict[str, Any] | None = None


def test_the_checker_sees_a_field_of_another_type_or_value_set() -> None:
    source = (
        'export type Mode =\n  | "on" | "off";\n\nexport interface X {\n  a: number;\n  m: Mode;\n'
        "  names?: string[];\n  r?: Record<string, unknown> | null;\n}\n"
    )
    declared = {name: ts_values(text, ts_aliases(source)) for name, text in ts_field_types(source, "X").items()}
    assert declared == {
        "a": {"number"},
        "m": {'"on"', '"off"'},
        "names": {"string[]"},
        "r": {"Record<string, unknown>", "null"},
    }
    found = py_field_types(_Sample)
    assert found["a"] != declared["a"] and found["m"] != declared["m"]  # a string is no number; "auto" is new
    assert found["names"] == declared["names"] and found["r"] == declared["r"] - {"null"}


def test_the_generated_part_of_protocol_ts_is_up_to_date() -> None:
    """The states' value sets and what may be asked of a mission in each come from protocol/states.py: the
    section scripts/protocol_ts.py writes equals what it writes now."""
    spec = importlib.util.spec_from_file_location("protocol_ts", ROOT / "scripts" / "protocol_ts.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert generator.rewritten(TS) == TS, "protocol.ts is out of date: run python scripts/protocol_ts.py"
    stale = TS.replace("running: { pause: true", "running: { pause: false")
    assert generator.rewritten(stale) == TS  # a hand edit of the section is undone
