"""A host killed in the middle of a big `write_file` (its temporary file written, not yet renamed into
place) leaves that temporary file in the unit's sandbox; it is keel's, never the mission's: after a resume
the mission branch, the sandbox, `keel apply` and `keel verify` are exactly the undisturbed run's, and the
leftover is gone from the unit's sandbox."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path
from typing import Any

from engine_helpers import files, keel, mission_id_of, read, record, start_keel, wait_for, write_mission

from keel.storage import missions as m
from tests.bundles.kit import git

LINE = "0123456789abcdef" * 64 + "\n"
TIMES = 16 * 1024  # 16 MiB and 16 KiB of text
UNITS = [
    {
        "id": "big",
        "params": {
            "steps": [
                {"tool": "write_file", "args": {"path": "data/big.txt", "content": LINE}, "content_times": TIMES},
                {"tool": "write_file", "args": {"path": "done.txt", "content": "done\n"}},
            ]
        },
    },
    {"id": "after", "after": ["big"], "params": {"steps": [{"tool": "read_file", "args": {"path": "data/big.txt"}}]}},
]


def _workspace(folder: Path) -> Path:
    ws = folder / "ws"
    ws.mkdir(parents=True)
    (ws / "README.md").write_text("hello\n")
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "base")
    return ws


def _temps(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.keel-tmp") if ".git" not in p.parts)


def _outcome(folder: Path, store: Path, mid: str) -> dict[str, Any]:
    """What the mission made: its branch's files, its sandbox's, the person's tree after `keel apply`."""
    ws = folder / "ws"
    branch = git(ws, "ls-tree", "-r", "--full-tree", f"keel/{mid}")
    sandbox = _digests(Path(record(store, mid).sandbox))
    assert keel("verify", store=store).returncode == 0
    keel("apply", mid, store=store, check_rc=0)
    return {"branch": branch, "sandbox": sandbox, "applied": _digests(ws)}


def _digests(root: Path) -> dict[str, str]:
    return {path: hashlib.sha256(data).hexdigest()[:16] for path, data in files(root).items()}


# on LMDB alone: which files keel commits does not depend on the store; two 16 MiB runs are enough
def test_a_host_killed_mid_write_commits_no_temporary_file(tmp_path: Path) -> None:
    reference = tmp_path / "undisturbed"
    _workspace(reference)
    store = reference / "store"
    keel("run", str(write_mission(reference, UNITS)), store=store, timeout=180, check_rc=0)
    expected = _outcome(reference, store, read(store, m.list_missions)[0].id)
    assert set(expected["applied"]) == set(expected["sandbox"]) == {"README.md", "data/big.txt", "done.txt"}

    struck = tmp_path / "struck"
    _workspace(struck)
    store, marker = struck / "store", struck / "write-temp.mark"
    host = start_keel(
        "run", str(write_mission(struck, UNITS)), store=store, env={"KEEL_FAULT_WRITE_TEMP": f"{marker}:hold"}
    )
    mid = mission_id_of(host)
    wait_for(marker.exists, timeout=180)  # the host holds: big.txt's temporary file written, not renamed
    left = _temps(struck / "sandboxes")
    assert [p.name.startswith(".big.txt.") for p in left] == [True] and left[0].stat().st_size == len(LINE) * TIMES
    assert int(marker.read_text()) == host.pid
    os.kill(host.pid, signal.SIGKILL)
    host.communicate(timeout=30)
    marker.unlink()
    assert record(store, mid).state.value == "running"  # struck while it ran: no host recorded an end

    keel("resume", mid, store=store, timeout=180, check_rc=0)
    assert record(store, mid).state.value == "completed"
    assert _outcome(struck, store, mid) == expected
    assert _temps(struck / "sandboxes") == []  # the resuming host removed the leftover
