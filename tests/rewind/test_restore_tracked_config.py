"""Restore with files in a repository that tracks keel's config file: `.keel/config.toml` is the person's
file (a team commits its provider settings), so it is part of every snapshot and a restore puts it back
like any other file; keel's own state under `.keel/` never is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundles.kit import files, git, keel, ok, record
from tests.rewind.kit import imported_into_a_clone, mission_toml, point_after, points

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

CONFIG = b"# the team's provider settings, committed with the code\n"
UNITS = [
    {"id": "u1", "params": {"steps": [{"tool": "write_file", "args": {"path": "a.txt", "content": "one\n"}}]}},
    {
        "id": "u2",
        "after": ["u1"],
        "params": {
            "steps": [
                {"tool": "write_file", "args": {"path": "b.txt", "content": "two\n"}},
                {"tool": "run", "args": {"cmd": "echo '# tuned by u2' >> .keel/config.toml && rm notes.txt"}},
            ]
        },
    },
]
AT_START = {"README.md": b"hello\n", "notes.txt": b"notes\n", ".keel/config.toml": CONFIG}
AFTER_U1 = {**AT_START, "a.txt": b"one\n"}
AFTER_U2 = {
    "README.md": b"hello\n",
    "a.txt": b"one\n",
    "b.txt": b"two\n",
    ".keel/config.toml": CONFIG + b"# tuned by u2\n",
}


def test_restore_files_puts_back_a_tracked_keel_config(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".keel").mkdir(parents=True)
    git(ws, "init", "-q", "-b", "main")
    for name, data in AT_START.items():
        (ws / name).write_bytes(data)
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "base")  # before keel wrote .keel/.gitignore: the config is tracked
    (tmp_path / "mission.toml").write_text(mission_toml(UNITS))
    store = ws / ".keel" / "store"  # where the editor keeps it
    ok(keel("run", str(tmp_path / "mission.toml"), "--plain", store=store))
    mid = json.loads(ok(keel("missions", "--json", store=store)).stdout)[0]["id"]
    sandbox = Path(record(store, mid).sandbox)
    assert files(sandbox) == AFTER_U2
    assert git(ws, "show", f"keel/{mid}:.keel/config.toml") + "\n" == (CONFIG + b"# tuned by u2\n").decode()
    other = imported_into_a_clone(tmp_path, ws, store, mid)  # an export carries the config's change too
    assert files(Path(record(other, mid).sandbox)) == AFTER_U2

    # back to the mission's start (its first snapshot: the config as the repository has it) and on again
    restored = keel("restore", mid, points(store, mid)[0]["id"], "--files", store=store)
    assert restored.returncode == 0, restored.stderr
    assert files(sandbox) == AT_START
    ok(keel("resume", mid, "--plain", store=store))
    assert record(store, mid).state.value == "completed"
    assert files(sandbox) == AFTER_U2

    # back to the end of u1: u2's change of the config is undone with the rest of its work
    restored = keel("restore", mid, point_after(store, mid, "unit succeeded: u1"), "--files", store=store)
    assert restored.returncode == 0, restored.stderr
    assert files(sandbox) == AFTER_U1
    assert (ws / ".keel" / "config.toml").read_bytes() == CONFIG  # the person's own copy untouched
    ok(keel("resume", mid, "--plain", store=store))
    assert files(sandbox) == AFTER_U2
