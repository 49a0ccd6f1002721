"""The language server's payloads are declared three times — the structs that encode them
(server/lsp/convert.py, server/activity/), the extension's types (client-vscode/src/protocol.ts) and the
contract (docs/lsp.md) — and must say the same: every field of a struct is a field of its TypeScript
interface and none other, a field the server may leave out is optional there, and the contract's section
names every field."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from keel.server.activity.items import ActivityItem
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
