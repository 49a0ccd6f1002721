"""Every git command keel runs goes through keel.server.gitrun, and a full disk under git is always a
DiskFullError naming the full filesystem — also when git does not say "No space left" and when the full
filesystem holds the workspace's .git rather than the folder git ran in. Real git, a real tmpfs."""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.protocol.errors import DiskFullError
from keel.server.engine.files import merge
from keel.server.engine.files.sandbox import SandboxError
from tests import tmpfs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def full_git(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(workspace, mount): a repository whose .git is a link to a full tmpfs; the workspace is not on it."""
    ws, mnt = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    (ws / "README").write_text("hello\n")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=ws, check=True)
    subprocess.run([*git, "add", "."], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=ws, check=True)
    with tmpfs.mounted(mnt, "1m"):
        subprocess.run(["cp", "-a", str(ws / ".git"), str(mnt / "git")], check=True)
        subprocess.run(["rm", "-rf", str(ws / ".git")], check=True)
        (ws / ".git").symlink_to(mnt / "git")
        (ws / "README").write_text("hello again\n")  # a change: the next index write is a real one
        tmpfs.fill(mnt)
        yield ws, mnt


@pytest.mark.parametrize(
    "args",
    [
        ("branch", "keel/x"),  # "couldn't write '…/refs/heads/keel/x.lock'": git does not say why
        ("update-index", "--refresh"),  # "index.lock write error. Out of diskspace"
        ("add", "-A"),  # "unable to write loose object file: No space left on device"
    ],
)
def test_git_on_a_full_git_folder_is_a_disk_full_error_naming_it(
    full_git: tuple[Path, Path], args: tuple[str, ...]
) -> None:
    ws, mnt = full_git
    with pytest.raises(DiskFullError) as caught:
        merge.git(ws, *args)
    assert not isinstance(caught.value, SandboxError)
    assert caught.value.message.startswith(f"disk full: the filesystem mounted at {mnt} "), caught.value.message
    assert caught.value.mount == str(mnt)


def test_a_probe_that_fails_on_a_full_disk_is_an_answer(full_git: tuple[Path, Path]) -> None:
    """A failure the caller reads as an answer (a ref that does not exist) is not a full disk."""
    ws, _ = full_git
    assert merge.git(ws, "rev-parse", "--verify", "-q", "refs/heads/none", check=False).returncode == 1


def _runs_git(node: ast.AST) -> bool:
    """A subprocess call whose command starts with the literal "git" (subprocess.run(["git", ...]) and the like)."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    if node.func.attr not in {"run", "Popen", "call", "check_call", "check_output", "create_subprocess_exec"}:
        return False
    for arg in node.args:
        if isinstance(arg, ast.List | ast.Tuple) and arg.elts:
            first = arg.elts[0]
            if isinstance(first, ast.Constant) and first.value == "git":
                return True
    return False


def test_every_git_command_goes_through_gitrun() -> None:
    found = []
    for folder in ("protocol", "storage", "server", "agents"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "server" / "gitrun.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if _runs_git(node):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")  # type: ignore[attr-defined]
    assert found == [], f"git run outside keel.server.gitrun: {found}"
