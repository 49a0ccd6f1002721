"""Which paths of a workspace are the person's files (protocol/treepaths.py): what restore, fork and
import may write, what snapshots, commits and exports count, and keel's temporary files told apart from
a person's file that merely ends like them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from keel.protocol.treepaths import GIT_EXCLUDE_TEMPS, create_temp, is_persons, is_temp, path_problem, temp_name

# path -> why it may not be written ("" when it may)
PATHS = [
    ("a.txt", ""),
    ("src/deep/a.py", ""),
    (".keel/config.toml", ""),  # the person's provider settings, committed by a team
    ("sub/.keel/config.toml", ""),  # a nested workspace's own
    (".keelrc", ""),
    ("notes.keel-tmp", ""),  # a person's file that merely ends like keel's temporary files
    (".a.txt.k3x9_q0z.keel-tmp", ""),  # harmless to write; a picture leaves it out (is_persons)
    (".gitignore", ""),
    ("", "is absolute or malformed"),
    ("/etc/passwd", "is absolute or malformed"),
    ("C:/x", "is absolute or malformed"),
    ("a\\b", "is absolute or malformed"),
    ("a\x00b", "is absolute or malformed"),
    ("../up", "leaves the workspace"),
    ("a/../../up", "leaves the workspace"),
    ("a//b", "leaves the workspace"),
    ("./a", "leaves the workspace"),
    ("a/", "leaves the workspace"),
    (".git/config", "is inside .git, which is git's"),
    ("sub/.git/hooks/post-checkout", "is inside .git, which is git's"),
    (".keel/store/data.mdb", "is keel's own state (of .keel/, only .keel/config.toml is the workspace's)"),
    (".keel/.gitignore", "is keel's own state (of .keel/, only .keel/config.toml is the workspace's)"),
    (".keel/config.toml/x", "is keel's own state (of .keel/, only .keel/config.toml is the workspace's)"),
    (".keel/sandboxes/m1/config.toml", "is keel's own state (of .keel/, only .keel/config.toml is the workspace's)"),
    (".keel", "is keel's own state (of .keel/, only .keel/config.toml is the workspace's)"),
]


@pytest.mark.parametrize(("path", "problem"), PATHS)
def test_path_problem_table(path: str, problem: str) -> None:
    assert path_problem(path) == problem


# file name -> keel's temporary file?
NAMES = [
    (".a.txt.k3x9_q0z.keel-tmp", True),
    (".big.tar.gz.abcdefgh.keel-tmp", True),
    (".a.txt.k3x9_q0.keel-tmp", False),  # seven characters
    (".a.txt.K3X9_Q0Z.keel-tmp", False),  # keel's are lower case
    ("a.txt.k3x9_q0z.keel-tmp", False),  # no leading dot
    ("..k3x9_q0z.keel-tmp", False),  # no name
    ("notes.keel-tmp", False),
    (".notes.keel-tmp", False),
    (".a.txt.k3x9_q0z.keel-tmp.bak", False),
    (".a.txt.k3x9_q0z.keel-merge", False),
]


@pytest.mark.parametrize(("name", "temp"), NAMES)
def test_is_temp_table(name: str, temp: bool) -> None:
    assert is_temp(name) is temp
    assert is_persons(f"sub/{name}") is not temp


def test_keel_makes_only_names_it_recognises(tmp_path: Path) -> None:
    target = tmp_path / "big file.txt"
    assert all(is_temp(temp_name(target).name) for _ in range(200))
    fd, made = create_temp(target)
    try:
        assert made.parent == tmp_path and is_temp(made.name) and made.name.startswith(".big file.txt.")
        assert made.stat().st_mode & 0o777 == 0o600
    finally:
        os.close(fd)


def test_git_leaves_out_exactly_keel_temporary_files(tmp_path: Path) -> None:
    """The pathspec keel adds to its `git add` names the same files as is_temp, at any depth."""
    names = [name for name, _ in NAMES]
    for folder in ("", "deep/er/"):
        for name in names:
            (tmp_path / folder).mkdir(parents=True, exist_ok=True)
            (tmp_path / folder / name).write_text("x")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("add", "-A", "--", ".", GIT_EXCLUDE_TEMPS)
    added = set(git("ls-files", "-z").split("\0")) - {""}
    assert added == {f"{folder}{name}" for folder in ("", "deep/er/") for name, temp in NAMES if not temp}
