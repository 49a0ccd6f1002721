"""Mission files (TOML) → MissionSpec, with errors that name the file, the field path and the line.

Checks beyond types: unit ids unique and well-formed, dependencies that exist, no cycles (the cycle is
named), a non-empty agent command, at least one unit unless the agent plans them.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from keel.protocol.errors import MissionFileError
from keel.protocol.spec import MissionSpec, UnitSpec

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PATH_PART = re.compile(r"\.(\w+)|\[(\d+)\]")


def load_mission_file(path: str | Path) -> MissionSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MissionFileError(f"{path}: cannot read mission file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise MissionFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return parse_mission(text, str(path))


def parse_mission(text: str, filename: str = "<mission>") -> MissionSpec:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        where = f"{filename}:{at.group(1)}" if at else filename
        raise MissionFileError(f"{where}: TOML syntax error: {exc}") from None
    raw = _flatten(doc, filename, text)
    try:
        spec = msgspec.convert(raw, MissionSpec)
    except msgspec.ValidationError as exc:
        raise _field_error(str(exc), filename, text) from None
    _check_graph(spec, filename, text)
    return spec


_TABLES = ("units", "models", "checkpoint", "permissions", "env")


def _error(filename: str, text: str, path: str, message: str) -> MissionFileError:
    """The one message shape: `file:line: field.path: what is wrong` (no line when none fits)."""
    line = locate_field(text, path)
    return MissionFileError(f"{filename}:{line}: {path}: {message}" if line else f"{filename}: {path}: {message}")


def _flatten(doc: dict[str, Any], filename: str, text: str) -> dict[str, Any]:
    """The file keeps `[mission]` for identity and top-level tables for the rest; the spec is flat."""
    unknown = set(doc) - {"mission", *_TABLES}
    if unknown:
        key = sorted(unknown)[0]
        raise _error(filename, text, key, "unknown top-level key (expected mission, " + ", ".join(_TABLES) + ")")
    mission = doc.get("mission")
    if not isinstance(mission, dict):
        raise MissionFileError(f"{filename}:1: mission: missing [mission] table (it needs at least name and agent)")
    flat = dict(mission)
    for key in _TABLES:
        if key in doc:
            if key in flat:
                raise _error(filename, text, f"mission.{key}", f"{key!r} given both in [mission] and at top level")
            flat[key] = doc[key]
    env = flat.get("env")
    if isinstance(env, dict):
        for name, value in env.items():
            if not isinstance(value, str):
                path = f"mission.env.{name}" if "env" in mission else f"env.{name}"
                raise _error(filename, text, path, f"expected a string, got {type(value).__name__}")
    if isinstance(flat.get("agent"), str):
        flat["agent"] = flat["agent"].split()
    return flat


def _field_error(detail: str, filename: str, text: str) -> MissionFileError:
    # msgspec says e.g. "Expected `int`, got `str` - at `$.units[1].timeout_s`"
    message, _, where = detail.partition(" - at ")
    path = where.strip("`").removeprefix("$").lstrip(".")
    unknown = re.match(r"Object contains unknown field `(\w+)`", message)
    if unknown:
        path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
        message = "unknown key"
    missing = re.match(r"Object missing required field `(\w+)`", message)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        message = "required key is missing"
    message = re.sub(r"^Expected `(.+)`, got `(.+)`$", r"expected \1, got \2", message)
    return _error(filename, text, _file_path(path) or "mission", message)


def _file_path(path: str) -> str:
    """Spec field path → the path as written in the file (identity fields live under [mission])."""
    if not path:
        return path
    head = re.split(r"[.\[]", path, maxsplit=1)[0]
    if head in _TABLES:
        return path
    return f"mission.{path}"


_HEADER = re.compile(r"\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def locate_field(text: str, path: str) -> int | None:
    """Best-effort line number of a field path such as `units[2].after` or `models.require.tools`.

    Walks the path down the file's table headers (`[[units]]`, `[models.require]`); the first part
    that has no header of its own is looked up as `key =` inside the table found so far.
    """
    parts: list[str | int] = [m.group(1) or int(m.group(2)) for m in _PATH_PART.finditer("." + path)]
    lines = text.splitlines()
    headers = [(n, m.group(1)) for n, line in enumerate(lines) if (m := _HEADER.match(line))]
    best: int | None = None
    table, start = "", 0
    for i, part in enumerate(parts):
        if isinstance(part, int):
            continue
        name = f"{table}.{part}" if table else part
        following = parts[i + 1] if i + 1 < len(parts) else None
        index = following if isinstance(following, int) else 0
        found = [n for n, h in headers if h == name and n >= start]
        if len(found) > index:
            best, table, start = found[index], name, found[index] + 1
            continue
        if any(h.startswith(name + ".") for n, h in headers if n >= start):
            table = name  # a super-table only named by its sub-tables' headers
            continue
        stop = next((n for n, _ in headers if n >= start), len(lines))
        key = re.compile(rf"\s*[\"']?{re.escape(part)}[\"']?\s*=")
        line = next((n for n in range(start, stop) if key.match(lines[n])), None)
        if line is not None:
            best = line
        break
    return None if best is None else best + 1


def _check_graph(spec: MissionSpec, filename: str, text: str) -> None:
    def fail(index: int, field: str, message: str) -> MissionFileError:
        return _error(filename, text, f"units[{index}].{field}", message)

    if not spec.agent or not spec.agent[0]:
        raise _error(filename, text, "mission.agent", "the agent command is empty")
    if spec.max_parallel < 1:
        raise _error(filename, text, "mission.max_parallel", f"must be at least 1, got {spec.max_parallel}")
    if not spec.units and not spec.plan:
        raise MissionFileError(f"{filename}:{locate_field(text, 'mission') or 1}: units: no [[units]] given and "
                               "plan = false; nothing to do")
    seen: dict[str, int] = {}
    for index, unit in enumerate(spec.units):
        if not _ID.match(unit.id):
            raise fail(index, "id", f"{unit.id!r} is not a valid unit id (letters, digits, _ . -; max 64)")
        if unit.id in seen:
            raise fail(index, "id", f"duplicate unit id {unit.id!r} (first used by units[{seen[unit.id]}])")
        seen[unit.id] = index
    for index, unit in enumerate(spec.units):
        for dep in unit.after:
            if dep not in seen:
                raise fail(index, "after", f"unknown dependency {dep!r} of unit {unit.id!r}")
            if dep == unit.id:
                raise fail(index, "after", f"unit {unit.id!r} depends on itself")
    cycle = find_cycle(spec.units)
    if cycle:
        first = seen[cycle[0]]
        raise fail(first, "after", "dependency cycle: " + " -> ".join([*cycle, cycle[0]]))


def find_cycle(units: tuple[UnitSpec, ...] | list[UnitSpec]) -> list[str] | None:
    """A dependency cycle as a list of unit ids, or None; iterative DFS (graphs can be large)."""
    deps = {u.id: u.after for u in units}
    color: dict[str, int] = {}
    for root in deps:
        if color.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                color[node] = 1
                path.append(node)
            after = deps.get(node, ())
            if i < len(after):
                stack.append((node, i + 1))
                nxt = after[i]
                if color.get(nxt) == 1:
                    return path[path.index(nxt):]
                if not color.get(nxt) and nxt in deps:
                    stack.append((nxt, 0))
            else:
                color[node] = 2
                path.pop()
    return None
