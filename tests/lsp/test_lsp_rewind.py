"""The rewind commands and requests through a real `keel serve`: fork, apply, export, import, and the
point-file requests a diff view is built from."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pygls.exceptions import JsonRpcException

from tests.lsp.conftest import Env

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def _git(cwd: Path, *args: str) -> str:
    import os

    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env={**os.environ, **GIT_ENV}
    ).stdout


async def test_fork_diff_files_apply_export_import(env: Env, tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "notes.txt").write_text("first\n")
    (tmp_path / ".gitignore").write_text(".keel/\n*.toml\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "base")
    path = env.write_mission(
        "edits",
        [
            {"id": "a", "steps": [{"tool": "write_file", "args": {"path": "notes.txt", "content": "second\n"}}]},
            {"id": "b", "after": ["a"], "steps": [{"tool": "run", "args": {"cmd": "echo shell > made.txt"}}]},
        ],
    )
    mid = (await env.command("keel.startMission", path))["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    points = await env.request("keel/restorePoints", {"id": mid})
    after_a = next(p["id"] for p in points if p["reason"] == "unit succeeded: a")

    changes = await env.request("keel/pointChanges", {"id": mid, "point": after_a})
    assert changes == [{"path": "made.txt", "status": "added"}]
    changes = await env.request("keel/pointChanges", {"id": mid, "point": "p1", "point2": after_a})
    assert changes == [{"path": "notes.txt", "status": "modified"}]
    old = await env.request("keel/pointFile", {"id": mid, "point": "p1", "path": "notes.txt"})
    now = await env.request("keel/pointFile", {"id": mid, "point": "sandbox", "path": "notes.txt"})
    assert (old["text"], now["text"], now["exists"]) == ("first\n", "second\n", True)
    gone = await env.request("keel/pointFile", {"id": mid, "point": "p1", "path": "made.txt"})
    assert gone == {"missionId": mid, "point": "p1", "path": "made.txt", "exists": False, "binary": False, "text": ""}

    fork = await env.command("keel.fork", mid, after_a)
    assert fork["id"] != mid and fork["state"] == "paused"
    await env.wait_for(lambda c: c["id"] == fork["id"])
    fork_file = await env.request("keel/pointFile", {"id": fork["id"], "point": "sandbox", "path": "made.txt"})
    assert not fork_file["exists"]

    applied = await env.command("keel.apply", mid)
    assert applied["added"] == ["made.txt"] and applied["modified"] == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "second\n" and (tmp_path / "made.txt").read_text() == "shell\n"

    bundle = await env.command("keel.export", mid, "out.keel")
    assert bundle["mission"] == mid and (tmp_path / "out.keel").is_file()
    with pytest.raises(JsonRpcException, match="already exists"):
        await env.command("keel.import", "out.keel", {"allowUnsigned": True})
    with pytest.raises(JsonRpcException, match="no restore point"):
        await env.request("keel/pointFile", {"id": mid, "point": "p99", "path": "notes.txt"})
    with pytest.raises(JsonRpcException, match=r"keel\.fork expects a restore point"):
        await env.command("keel.fork", mid)
