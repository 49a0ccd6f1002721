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
    "storage": {"msgspec", "lmdb"},
    "agents": {"msgspec"},
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
