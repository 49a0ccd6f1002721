"""Helpers for the rewind tests: one finished mission in a git workspace (tools and shell commands both
change files), and fingerprints of the person's checkout and of a mission's records."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from keel.storage import DB, Txn
from keel.storage.keys import mission_prefix
from tests.bundles.kit import BINARY, files, git, git_workspace, keel, ok, read

DIFF = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
# u1: tools and a shell command; u2: apply_diff, sed -i, echo >, rm — the sandbox after each is known
UNITS = [
    {
        "id": "u1",
        "params": {
            "steps": [
                {"tool": "write_file", "args": {"path": "a.txt", "content": "one\ntwo\nthree\n"}},
                {
                    "tool": "run",
                    "args": {"cmd": "mkdir -p sub && echo made by shell > sub/s.txt && chmod +x sub/s.txt"},
                },
            ]
        },
    },
    {
        "id": "u2",
        "after": ["u1"],
        "params": {
            "steps": [
                {"tool": "apply_diff", "args": {"diff": DIFF}},
                {"tool": "run", "args": {"cmd": "sed -i 's/hello/HELLO/' README.md && echo new > b.txt && rm old.txt"}},
            ]
        },
    },
]
AFTER_U1 = {
    "README.md": b"hello\n",
    "data.bin": BINARY,
    "a.txt": b"one\ntwo\nthree\n",
    "old.txt": b"to be deleted\n",
    "sub/s.txt": b"made by shell\n",
}
AFTER_U2 = {
    "README.md": b"HELLO\n",
    "data.bin": BINARY,
    "a.txt": b"one\nTWO\nthree\n",
    "b.txt": b"new\n",
    "sub/s.txt": b"made by shell\n",
}


def mission(tmp: Path, units: list[dict[str, Any]] = UNITS) -> tuple[Path, Path, str]:
    """(workspace, store, mission id) of a completed mission."""
    ws = tmp / "ws"
    git_workspace(ws)
    (tmp / "mission.toml").write_text(mission_toml(units))
    store = tmp / "store"
    ok(keel("run", str(tmp / "mission.toml"), "--plain", store=store))
    ids = json.loads(ok(keel("missions", "--json", store=store)).stdout)
    return ws, store, ids[0]["id"]


def mission_toml(units: list[dict[str, Any]]) -> str:
    from tests.bundles.kit import toml

    lines = ["[mission]", 'name = "rewind"', 'agent = "python -m keel.agents.scripted"', 'workspace = "ws"']
    for unit in units:
        lines += ["", "[[units]]"] + [f"{k} = {toml(v)}" for k, v in unit.items()]
    return "\n".join(lines) + "\n"


def sandbox_files(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in files(root).items() if "__pycache__" not in k}


def checkout(ws: Path) -> dict[str, Any]:
    """The person's checkout: working files (bytes), status, HEAD, branch, index, every ref but keel's."""
    raw = {
        str(p.relative_to(ws)): p.read_bytes()
        for p in sorted(ws.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(ws).parts
    }
    refs = [
        r
        for r in git(ws, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
        if not r.startswith("refs/heads/keel/")
    ]
    return {
        "files": raw,
        "status": git(ws, "status", "--porcelain", "--untracked-files=all"),
        "head": git(ws, "rev-parse", "HEAD"),
        "branch": git(ws, "symbolic-ref", "HEAD"),
        "refs": refs,
        "index": git(ws, "ls-files", "-s"),
    }


def mission_records(store: Path, mission_id: str) -> list[tuple[str, bytes, bytes]]:
    """Every record of one mission, raw (missions, heads, points, journal, events, evidence, control)."""

    def scan(t: Txn) -> list[tuple[str, bytes, bytes]]:
        out = [
            (db.value, k, v)
            for db in (DB.MISSIONS, DB.HEADS)
            for k, v in t.scan_raw(db, mission_id.encode())
            if k == mission_id.encode()
        ]
        for db in (DB.POINTS, DB.JOURNAL, DB.EVENTS, DB.EVIDENCE, DB.CONTROL):
            out += [(db.value, k, v) for k, v in t.scan_raw(db, mission_prefix(mission_id))]
        return out

    return read(store, scan)  # type: ignore[no-any-return]


def points(store: Path, mission_id: str) -> list[dict[str, Any]]:
    return json.loads(ok(keel("points", mission_id, "--json", store=store)).stdout)  # type: ignore[no-any-return]


def point_after(store: Path, mission_id: str, reason: str) -> str:
    return next(p["id"] for p in points(store, mission_id) if p["reason"] == reason)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)


def imported_into_a_clone(tmp: Path, ws: Path, store: Path, mission_id: str) -> Path:
    """The store of another workspace (a clone of `ws`) the mission was exported to and imported into."""
    bundle = tmp / "m.keel"
    ok(keel("export", mission_id, "-o", str(bundle), store=store))
    clone = tmp / "other" / "ws"
    git(tmp, "clone", "-q", str(ws), str(clone))
    other = tmp / "other" / "store"
    ok(keel("import", str(bundle), "--workspace", str(clone), "--allow-unsigned", store=other))
    return other
