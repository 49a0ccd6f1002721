"""docs/mission-file.md stays true: its complete example parses, and sets every key it documents."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec

from keel.protocol.missionfile import parse_mission
from keel.protocol.spec import MissionSpec, UnitSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "mission-file.md"


def _example() -> str:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/mission-file.md should hold exactly one complete TOML example"
    return blocks[0]


def test_the_documented_example_parses() -> None:
    spec = parse_mission(_example(), "docs/mission-file.md")
    assert spec.name == "upgrade-http-client"
    assert [u.id for u in spec.units] == ["inventory", "migrate-billing", "migrate-search", "verify"]
    assert spec.units[1].params == {"service": "billing", "paths": ["services/billing"]}
    assert spec.models.require.min_context == 32000 and spec.checkpoint.policy == "adaptive"


def test_the_example_shows_every_field_of_the_spec() -> None:
    """A field added to protocol/spec.py must be added to the documented example too."""
    doc = tomllib.loads(_example())
    flat = {**doc.pop("mission"), **doc}
    shown = {path for key, value in flat.items() if key not in ("units", "env") for path in _paths(value, key)} | {
        "env",
        "units",
    }
    shown |= {f"units.{key}" for unit in flat["units"] for key in unit}
    assert _spec_paths(MissionSpec) - shown == set(), "docs/mission-file.md does not show these"


def _paths(value: object, prefix: str) -> set[str]:
    if isinstance(value, dict):
        return {p for k, v in value.items() for p in _paths(v, f"{prefix}.{k}")}
    return {prefix}


def _spec_paths(struct: type[msgspec.Struct], prefix: str = "") -> set[str]:
    """Every leaf field of the spec as a dotted path; units' fields as `units.NAME`."""
    out: set[str] = set()
    for field in msgspec.structs.fields(struct):
        path = f"{prefix}{field.name}"
        if field.name == "units":
            out |= {"units", *(f"units.{f.name}" for f in msgspec.structs.fields(UnitSpec))}
        elif isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            out |= _spec_paths(field.type, path + ".")
        else:
            out.add(path)
    return out
