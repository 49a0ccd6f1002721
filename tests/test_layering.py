"""Dependencies point one way: protocol <- storage <- server; agents -> protocol only.

Walks every module's imports (static, with ast) and fails on a wrong arrow; also checks that only
server/ imports pygls or lsprotocol and that protocol/ needs nothing but the stdlib and msgspec.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "protocol": {"keel.protocol"},
    "storage": {"keel.protocol", "keel.storage"},
    "server": {"keel.protocol", "keel.storage", "keel.server", "keel.agents"},
    "agents": {"keel.protocol", "keel.agents"},
}
THIRD_PARTY = {
    "protocol": {"msgspec"},
    "storage": {"msgspec", "lmdb", "psycopg"},  # psycopg: storage/pg.py alone, imported only for a PostgreSQL store
    # h11 (pure Python, already under httpx) only for the ACP bridge's model proxy: an agent process
    # carries no HTTP client or server framework.
    "agents": {"msgspec", "h11"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_import_arrows(folder: str) -> None:
    wrong = []
    for path in _modules(folder):
        for line, name in _imports(path):
            top = name.split(".")[0]
            if top == "keel":
                pkg = ".".join(name.split(".")[:2])
                if pkg not in ALLOWED[folder]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
            elif top in {"protocol", "storage", "server", "agents"}:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports bare {name}; use keel.{name}")
            elif folder in THIRD_PARTY and top not in sys.stdlib_module_names and top not in THIRD_PARTY[folder]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports third-party {name}")
            elif folder != "server" and top in {"pygls", "lsprotocol"}:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}; only server/ may")
    assert not wrong, "imports pointing the wrong way:\n" + "\n".join(wrong)


def test_checker_catches_a_wrong_arrow(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from keel.server import cli\nimport pygls\n")
    assert [n for _, n in _imports(bad)] == ["keel.server", "pygls"]


ENGINE = "keel.server.engine"


def _engine_imports(path: Path, modules: set[str]) -> list[tuple[int, str, bool]]:
    """(line, engine module, inside a function) for every import of an engine module (one of `modules`,
    dotted names) in `path`, at module level (TYPE_CHECKING blocks included) and inside functions alike."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                # from keel.server.engine.files import merge, trees: the modules; else the module named
                named = [f"{child.module}.{alias.name}" for alias in child.names]
                targets = [n for n in named if n in modules] or [child.module]
            for name in targets:
                while name not in modules and name.count(".") > 3:
                    name = name.rsplit(".", 1)[0]
                if name in modules:
                    found.append((child.lineno, name, in_function))
            visit(child, local)

    visit(tree, False)
    return found


def _engine_graph(folder: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The engine's import graph (module -> engine modules it imports) and its function-local imports; its
    modules are every .py file under `folder`, in folders or not (a package's __init__ is not one)."""
    paths = {
        ".".join((ENGINE, *path.relative_to(folder).with_suffix("").parts)): path
        for path in sorted(folder.rglob("*.py"))
        if path.name != "__init__.py"
    }
    graph: dict[str, set[str]] = {}
    local: list[str] = []
    for module, path in paths.items():
        graph[module] = set()
        for line, name, in_function in _engine_imports(path, set(paths)):
            if name != module:
                graph[module].add(name)
            if in_function:
                local.append(f"{path.relative_to(folder).as_posix()}:{line} imports {name} inside a function")
    return graph, local


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_engine_imports_form_no_circle() -> None:
    graph, _ = _engine_graph(ROOT / "server" / "engine")
    circles = _cycles(graph)
    assert not circles, "engine modules import each other in a circle:\n" + "\n".join(
        " <-> ".join(c.removeprefix(ENGINE + ".") for c in circle) for circle in circles
    )


# The one function-local engine import, and why: a process entry point that starts a process before it loads
# what it needs only later (the unit's worker starts its agent, then loads its loops while the agent starts).
LATE_LOADS = {"units/subagent.py": "keel.server.engine.units.workerloop"}


def test_engine_has_no_function_local_engine_import() -> None:
    _, local = _engine_graph(ROOT / "server" / "engine")
    local = [line for line in local if _late_load(line) not in LATE_LOADS.items()]
    assert not local, "engine modules imported inside functions (import them at the top):\n" + "\n".join(local)


def _late_load(line: str) -> tuple[str, str]:
    """(path, module) of a line `_engine_graph` reports: "units/subagent.py:12 imports M inside a function"."""
    return line.split(":")[0], line.split(" imports ")[1].removesuffix(" inside a function")


def test_circle_checker_catches_a_circle_and_a_local_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from keel.server.engine import b\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import keel.server.engine.sub.c\n"
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "c.py").write_text("def f():\n    from keel.server.engine.a import x\n")
    (tmp_path / "d.py").write_text("from keel.server.engine.sub import c\n")
    graph, local = _engine_graph(tmp_path)
    assert _cycles(graph) == [[f"{ENGINE}.a", f"{ENGINE}.b", f"{ENGINE}.sub.c"]]
    assert graph[f"{ENGINE}.d"] == {f"{ENGINE}.sub.c"}
    assert local == [f"sub/c.py:2 imports {ENGINE}.a inside a function"]


# modules that may name the leases' database: the leases' and host leases' own, the two that delete a
# whole mission's records, and the schema migration that moved leases to their nested form
LEASE_DB_MODULES = {
    "storage/leases.py",
    "storage/hostlease.py",
    "storage/missions.py",
    "storage/gc.py",
    "storage/migrations.py",
}


def _lease_writes(path: Path, relative: str) -> list[str]:
    """Every place in `path` that writes a unit's lease other than through storage/leases.py's operations:
    a call of `leases.put`/`leases._put`, or the leases' database named outside LEASE_DB_MODULES."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in {"put", "_put"} and isinstance(node.value, ast.Name) and node.value.id == "leases":
            found.append(f"{relative}:{node.lineno} writes a lease with leases.{node.attr}")
        elif node.attr == "LEASES" and relative not in LEASE_DB_MODULES:
            found.append(f"{relative}:{node.lineno} names DB.LEASES")
    return found


def test_leases_change_only_through_their_named_operations() -> None:
    wrong = []
    for folder in ALLOWED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            wrong += _lease_writes(path, path.relative_to(ROOT).as_posix())
    assert not wrong, "lease writes outside storage/leases.py's operations:\n" + "\n".join(wrong)


def test_lease_write_checker_catches_a_raw_put(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("leases.put(txn, mid, lease)\ntxn.put(DB.LEASES, key, lease)\nleases.moved(txn, mid, l, fence=1)\n")
    assert _lease_writes(bad, "server/engine/bad.py") == [
        "server/engine/bad.py:1 writes a lease with leases.put",
        "server/engine/bad.py:2 names DB.LEASES",
    ]


# engine folders and the engine folders each may import (besides its own); the engine's top level (the host
# and what every part shares) may import any
FOLDER_ARROWS = {"files": set(), "step": {"top", "files"}, "units": {"top", "files", "step"}}


def _folder(module: str) -> str:
    parts = module.removeprefix(ENGINE + ".").split(".")
    return parts[0] if len(parts) > 1 else "top"


def _folder_arrows(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{a} imports {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if _folder(a) in FOLDER_ARROWS and _folder(b) != _folder(a) and _folder(b) not in FOLDER_ARROWS[_folder(a)]
    ]


def test_engine_folders_import_one_way() -> None:
    graph, _ = _engine_graph(ROOT / "server" / "engine")
    assert {_folder(m) for m in graph} == {"top", *FOLDER_ARROWS}, "an engine folder the arrows do not name"
    wrong = _folder_arrows(graph)
    assert not wrong, "engine folders importing against their arrows (files <- step <- units):\n" + "\n".join(wrong)


def test_folder_arrow_checker_catches_a_wrong_arrow() -> None:
    graph = {f"{ENGINE}.files.trees": {f"{ENGINE}.journal"}, f"{ENGINE}.step.effects": {f"{ENGINE}.files.trees"}}
    assert _folder_arrows(graph) == [f"{ENGINE}.files.trees imports {ENGINE}.journal"]


# the decisions: pure functions of plain records, each with a table test. What they may import: the
# protocol, one another, and standard modules that neither wait nor read a disk, a store or a clock.
DECISIONS = ("step/core.py", "step/effects.py", "step/lookback.py", "units/ending.py", "units/unitrecovery.py")
PURE_STDLIB = {"__future__", "collections", "dataclasses", "enum", "hashlib", "json", "os", "re", "typing"}


def _impure_imports(path: Path, relative: str) -> list[str]:
    decisions = {f"{ENGINE}.{d.removesuffix('.py').replace('/', '.')}" for d in DECISIONS}
    wrong = []
    for line, name in _imports(path):
        top = name.split(".")[0]
        if name.startswith("keel.protocol") or name in decisions or top in PURE_STDLIB:
            continue
        wrong.append(f"{relative}:{line} imports {name}")
    return wrong


def test_decisions_read_nothing() -> None:
    """A decision reads no store, disk or clock: what it needs is handed to it (tests/engine/test_*_table.py)."""
    wrong = []
    for decision in DECISIONS:
        wrong += _impure_imports(ROOT / "server" / "engine" / decision, decision)
    assert not wrong, "a decision imports what could read the store, the disk or a clock:\n" + "\n".join(wrong)


def test_purity_checker_catches_an_impure_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import enum\nimport time\nfrom keel.protocol.records import JournalEntry\n"
        "from keel.server.engine.step.effects import decide\nfrom keel.storage import missions\n"
    )
    assert _impure_imports(bad, "bad.py") == ["bad.py:2 imports time", "bad.py:5 imports keel.storage"]


# a unit's journal entries are written by its recorder, by a person's answer and by a restore's new lane
JOURNAL_WRITERS = {"server/engine/units/recorder.py", "server/engine/recovery.py", "server/engine/restore.py"}


def _journal_writes(path: Path, relative: str) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{relative}:{node.lineno} writes a journal entry"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "journal_put" and relative not in JOURNAL_WRITERS
    ]


def test_a_units_journal_is_written_by_the_recorder_alone() -> None:
    wrong = []
    for path in sorted((ROOT / "server").rglob("*.py")):
        wrong += _journal_writes(path, path.relative_to(ROOT).as_posix())
    assert not wrong, "journal entries written outside the recorder:\n" + "\n".join(wrong)


def test_journal_write_checker_catches_a_write(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def settle(txn):\n    m.journal_put(txn, mid, lane, entry)\n")
    assert _journal_writes(bad, "server/engine/units/handlers.py") == [
        "server/engine/units/handlers.py:2 writes a journal entry"
    ]


def test_handlers_see_their_unit_through_its_port() -> None:
    graph, _ = _engine_graph(ROOT / "server" / "engine")
    session = {f"{ENGINE}.units.{m}" for m in ("unitrun", "recorder", "workerproc")}
    seen = graph[f"{ENGINE}.units.handlers"] & session
    assert not seen, f"the handlers import their unit's session, not its port: {sorted(seen)}"


# the rooms of a unit's run, and the most lines each may have
ROOMS = {"unitrun.py": 450, "recorder.py": 400, "handlers.py": 400, "workerproc.py": 400, "ending.py": 400}


def test_the_rooms_of_a_units_run_stay_small() -> None:
    units = ROOT / "server" / "engine" / "units"
    big = {name: n for name, most in ROOMS.items() if (n := len((units / name).read_text().splitlines())) > most}
    assert not big, f"a room of a unit's run grew past its size (lines): {big}"
