"""Mission files (TOML) → MissionSpec, with errors that name the file, the field path and the line.

Checks beyond types: unit ids unique and well-formed, dependencies that exist, no cycles (the cycle is
named), a non-empty agent command, at least one unit unless the agent plans them, every number within
its bounds (`_BOUNDS`), integers that fit in 64 bits, no NaN or infinity, and nesting no deeper than
`MAX_NESTING` (checked on the text before tomllib, which recurses, ever sees it).
Depends only on the standard library, msgspec and the protocol's spec and errors.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from keel.protocol.errors import MissionFileError
from keel.protocol.spec import MissionSpec, UnitSpec

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PATH_PART = re.compile(r"\.(\w+)|\[(\d+)\]")
MAX_NESTING = 32  # tables, arrays and inline tables inside each other, counted from the top of the file
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_PARALLEL = 256
_INT64 = (-(2**63), 2**63 - 1)  # what msgpack (the store) and JSON-RPC peers carry exactly


class Bound(NamedTuple):
    low: float
    high: float
    above_low: bool = False  # True: `low` itself is refused (a timeout of 0 s makes no sense)


# Spec field (`units[]` for every unit) -> the values it may take.
_BOUNDS: dict[str, Bound] = {
    "mission.max_parallel": Bound(1, MAX_PARALLEL),
    "units[].timeout_s": Bound(0, MAX_TIMEOUT_S, above_low=True),
    "permissions.command_timeout_s": Bound(0, MAX_TIMEOUT_S, above_low=True),
    "checkpoint.group_window_ms": Bound(0, 10_000),
    "checkpoint.expensive_step_ms": Bound(0, 3_600_000),
    "checkpoint.snapshot_budget_ms": Bound(0, 86_400_000),
    "checkpoint.interval_ms": Bound(0, 86_400_000, above_low=True),
    "models.require.min_context": Bound(0, 100_000_000),
    "models.require.max_cost_per_mtok": Bound(0, 1_000_000),
    "budget.model_requests": Bound(0, 100_000_000),
    "budget.tokens": Bound(0, 10**15),
}


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
    _check_nesting(text, filename)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        where = f"{filename}:{at.group(1)}" if at else filename
        raise MissionFileError(f"{where}: TOML syntax error: {exc}") from None
    except RecursionError:  # the scan above missed a nesting (it only approximates TOML strings)
        raise MissionFileError(f"{filename}: nested more than {MAX_NESTING} levels deep") from None
    _check_depth(doc, filename, text)
    raw = _flatten(doc, filename, text)
    try:
        spec = msgspec.convert(raw, MissionSpec)
    except msgspec.ValidationError as exc:
        raise _field_error(str(exc), filename, text) from None
    _check_bounds(spec, filename, text)
    _check_numbers(doc, filename, text)
    _check_graph(spec, filename, text)
    return spec


# Structure characters outside comments and strings (multi-line strings first); approximate on purpose:
# tomllib still parses the file, this only has to see every bracket that opens a nested value.
_TOKEN = re.compile(
    "|".join(
        (
            r"#[^\n]*",
            r'"""(?:[^"\\]|\\[\s\S]|"(?!""))*"""',
            r"'''[\s\S]*?'''",
            r'"(?:[^"\\\n]|\\.)*"',
            r"'[^'\n]*'",
            r"[\[\]{}=,\n]",
        )
    )
)


def _check_nesting(text: str, filename: str) -> None:
    """Refuse, before tomllib sees them, arrays and inline tables nested deeper than MAX_NESTING (tomllib
    parses them recursively and runs out of stack) and keys or table headers of more parts than that
    (tomllib's cost grows with the square of a dotted key's length); the message names the key."""
    depth, line, line_start, key_start, pos = 0, 1, 0, 0, 0
    table, key = "", ""
    arrays: dict[str, int] = {}

    def too_deep(path: str) -> MissionFileError:
        return MissionFileError(f"{filename}:{line}: {path or 'mission'}: nested more than {MAX_NESTING} levels deep")

    while token := _TOKEN.search(text, pos):
        kind, pos = token.group(), token.end()
        if kind in ("\n", ",", "{"):
            key_start = pos
        if kind == "\n":
            line, line_start = line + 1, pos
            continue
        if "\n" in kind:  # a multi-line string
            line, line_start = line + kind.count("\n"), text.rfind("\n", 0, pos) + 1
        if kind == "[" and depth == 0 and not text[line_start : token.start()].strip():
            line_end = text.find("\n", line_start)
            header = _HEADER.match(text, line_start, len(text) if line_end < 0 else line_end)
            if header:  # a table header: the keys that follow belong to it
                if header.group(1).count(".") >= MAX_NESTING:
                    raise too_deep(header.group(1)[:200])
                table, key = _header_path(header.group(1), text.startswith("[[", token.start()), arrays), ""
                pos = header.end()
                continue
        if kind in ("[", "{"):
            depth += 1
            if depth > MAX_NESTING:
                raise too_deep(".".join(p for p in (table, key) if p))
        elif kind in ("]", "}"):
            depth = max(0, depth - 1)
        elif kind == "=":
            written = text[key_start : token.start()].strip()
            if depth == 0:
                key = written.strip("\"'")
            if written.count(".") >= MAX_NESTING:
                raise too_deep(".".join(p for p in (table, written[:200]) if p))


def _header_path(name: str, is_array: bool, arrays: dict[str, int]) -> str:
    """`[[units]]` / `[units.params]` -> `units[2]` / `units[2].params` (arrays counts `[[...]]` headers)."""
    name = re.sub(r"\s*\.\s*", ".", name)
    if is_array:
        arrays[name] = arrays.get(name, 0) + 1
    path, prefix = "", ""
    for part in name.split("."):
        prefix = f"{prefix}.{part}" if prefix else part
        path = f"{path}.{part}" if path else part
        if prefix in arrays:
            path += f"[{arrays[prefix] - 1}]"
    return path


def _values(doc: dict[str, Any]) -> Iterator[tuple[str, Any, int]]:
    """(path, value, depth) of every value of the parsed file, depth first, without recursion."""
    stack: list[tuple[str, Any, int]] = [(key, value, 1) for key, value in reversed(doc.items())]
    while stack:
        path, value, depth = stack.pop()
        yield path, value, depth
        if isinstance(value, dict):
            stack += [(f"{path}.{k}", v, depth + 1) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", v, depth + 1) for i, v in reversed(list(enumerate(value)))]


def _check_depth(doc: dict[str, Any], filename: str, text: str) -> None:
    """Dotted keys and table headers nest without brackets: the parsed document is measured too."""
    for path, _, depth in _values(doc):
        if depth > MAX_NESTING:
            raise _error(filename, text, path, f"nested more than {MAX_NESTING} levels deep")


def _check_numbers(doc: dict[str, Any], filename: str, text: str) -> None:
    """Integers the store and JSON peers carry exactly; no NaN or infinity (JSON has neither)."""
    for path, value, _ in _values(doc):
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
            raise _error(filename, text, path, f"integer {value} does not fit in 64 bits")
        if isinstance(value, float) and not math.isfinite(value):
            raise _error(filename, text, path, f"expected a finite number, got {value}")


def _numbers(spec: MissionSpec) -> Iterator[tuple[str, str, float | None]]:
    """(field path, its key in _BOUNDS, value) for every number of the spec."""
    yield "mission.max_parallel", "mission.max_parallel", spec.max_parallel
    for index, unit in enumerate(spec.units):
        yield f"units[{index}].timeout_s", "units[].timeout_s", unit.timeout_s
    yield "permissions.command_timeout_s", "permissions.command_timeout_s", spec.permissions.command_timeout_s
    for name in ("group_window_ms", "expensive_step_ms", "snapshot_budget_ms", "interval_ms"):
        yield f"checkpoint.{name}", f"checkpoint.{name}", getattr(spec.checkpoint, name)
    require = spec.models.require
    yield "models.require.min_context", "models.require.min_context", require.min_context
    yield "models.require.max_cost_per_mtok", "models.require.max_cost_per_mtok", require.max_cost_per_mtok
    for name in ("model_requests", "tokens"):
        yield f"budget.{name}", f"budget.{name}", getattr(spec.budget, name)


def _check_bounds(spec: MissionSpec, filename: str, text: str) -> None:
    for path, field, value in _numbers(spec):
        bound = _BOUNDS[field]
        if value is None:
            continue
        if bound.above_low and value <= bound.low:
            raise _error(filename, text, path, f"must be greater than {_show(bound.low)}, got {_show(value)}")
        if value < bound.low:
            raise _error(filename, text, path, f"must be at least {_show(bound.low)}, got {_show(value)}")
        if value > bound.high:
            raise _error(filename, text, path, f"must be at most {_show(bound.high)}, got {_show(value)}")


def _show(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


_TABLES = ("units", "models", "checkpoint", "permissions", "env", "budget")


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
    elif isinstance(flat.get("agent"), dict):
        flat["agent"] = _acp_agent(flat["agent"], "mission.agent" if "agent" in mission else "agent", filename, text)
    return flat


ACP_PRESETS = ("claude", "gemini", "codex")


def _acp_agent(table: dict[str, Any], path: str, filename: str, text: str) -> list[str]:
    """`agent = { acp = "claude" }` (a preset) or `{ acp = ["node", "agent.js"] }` (any ACP command): keel's
    ACP bridge agent (keel.agents.acp) driving that outside agent."""
    unknown = sorted(set(table) - {"acp"})
    if unknown or "acp" not in table:
        what = f"unknown key {unknown[0]!r}" if unknown else "missing key 'acp'"
        raise _error(
            filename,
            text,
            path,
            f'{what}: an agent table is {{ acp = "claude" | "gemini" | "codex" }} or {{ acp = [COMMAND...] }}',
        )
    acp = table["acp"]
    if isinstance(acp, str):
        if acp not in ACP_PRESETS:
            raise _error(
                filename,
                text,
                f"{path}.acp",
                f"unknown ACP agent {acp!r} (known: {', '.join(ACP_PRESETS)}; or give a command list)",
            )
        return ["python", "-m", "keel.agents.acp", acp]
    if isinstance(acp, list) and acp and all(isinstance(part, str) and part for part in acp):
        return ["python", "-m", "keel.agents.acp", "--", *acp]
    raise _error(
        filename, text, f"{path}.acp", "expected a preset name or a non-empty list of strings (the agent's command)"
    )


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
        key = re.compile(rf"\s*[\"']?{re.escape(part)}[\"']?\s*[=.]")  # `part =` or a dotted `part.x =`
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
    if not spec.units and not spec.plan:
        raise MissionFileError(
            f"{filename}:{locate_field(text, 'mission') or 1}: units: no [[units]] given and "
            "plan = false; nothing to do"
        )
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
                    return path[path.index(nxt) :]
                if not color.get(nxt) and nxt in deps:
                    stack.append((nxt, 0))
            else:
                color[node] = 2
                path.pop()
    return None
