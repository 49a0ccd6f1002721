"""The point `keel export` adds when it carried a paused unit's work into the mission sandbox restores like
any other: restored with files after the mission completed, the unit is made again in its own sandbox from
the point's snapshots of it, its steps before the point are answered from the journal, and its later work
merges onto the work the export carried, without a question. The files equal an undisturbed run's, and the
effect made before the point is in the side log once. In a workspace without git (copy sandboxes, merged
file by file) the unit's own final merge after the export does not conflict with what was carried either."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keel.storage import missions as m
from tests.bundles.kit import BINARY, files, git_workspace, keel, ok, read, record, wait_for
from tests.rewind.kit import mission_toml, point_after

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

RESULT = {
    "README.md": b"hello\n",
    "data.bin": BINARY,
    "old.txt": b"to be deleted\n",
    "out.txt": b"v2\n",
    "all": b"v2\n",
}


def _units(side: Path, gate: Path) -> list[dict[str, object]]:
    return [
        {
            "id": "u1",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "out.txt", "content": "v1\n"}},
                    {"tool": "run", "args": {"cmd": f"echo effect >> {side}"}},
                    {"wait_file": str(gate)},  # the pause comes here
                    {"tool": "write_file", "args": {"path": "out.txt", "content": "v2\n"}},
                ]
            },
        },
        {"id": "u2", "after": ["u1"], "params": {"steps": [{"tool": "run", "args": {"cmd": "cat out.txt > all"}}]}},
    ]


def _paused_mid_unit(tmp: Path, workspace: str) -> tuple[Path, str, Path]:
    """(store, mission id, side log): u1 paused after its effect, before its second write."""
    ws, side, store, gate = tmp / "ws", tmp / "side.log", tmp / "store", tmp / "gate"
    git_workspace(ws)
    if workspace == "folder":
        shutil.rmtree(ws / ".git")
    (tmp / "mission.toml").write_text(mission_toml(_units(side, gate)))
    cmd = [sys.executable, "-m", "keel.server.cli", "run", str(tmp / "mission.toml"), "--plain", "--store", str(store)]
    host = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: side.exists() and "effect" in side.read_text(), timeout=120)
        mid = json.loads(ok(keel("missions", "--json", store=store)).stdout)[0]["id"]
        ok(keel("pause", mid, "--wait", "60", store=store))
        out, _ = host.communicate(timeout=60)
    finally:
        host.kill()
        host.communicate(timeout=10)
    assert record(store, mid).state.value == "paused", out
    gate.touch()
    return store, mid, side


@pytest.mark.parametrize(
    "workspace",
    ["git", pytest.param("folder", marks=pytest.mark.lmdb_only("copy sandboxes merge the same on either backend"))],
)
def test_the_export_point_restores_with_files_to_the_undisturbed_result(tmp_path: Path, workspace: str) -> None:
    store, mid, side = _paused_mid_unit(tmp_path, workspace)
    carried = ok(keel("export", mid, "-o", str(tmp_path / "m.keelbundle"), store=store))
    assert "merged the unfinished work of unit(s) u1" in carried.stderr, carried.stderr
    point = point_after(store, mid, "export: carried the work of unit(s) u1")
    manifest = read(store, lambda t: m.get_checkpoint(t, m.get_point(t, mid, point).checkpoint))
    assert manifest.units["u1"].state.value != "succeeded" and manifest.units["u1"].tree  # inside the unit
    ok(keel("resume", mid, "--plain", store=store, timeout=120))
    assert record(store, mid).state.value == "completed", record(store, mid).question
    assert files(Path(record(store, mid).sandbox)) == RESULT

    ok(keel("restore", mid, point, "--files", store=store))
    resumed = keel("resume", mid, "--plain", store=store, timeout=120)
    assert record(store, mid).question is None, record(store, mid).question
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert record(store, mid).state.value == "completed"
    assert files(Path(record(store, mid).sandbox)) == RESULT
    assert side.read_text().split() == ["effect"]  # made before the point: answered from the journal
    ok(keel("verify", store=store))


@pytest.mark.parametrize(
    "workspace",
    ["git", pytest.param("folder", marks=pytest.mark.lmdb_only("copy sandboxes merge the same on either backend"))],
)
def test_the_point_before_an_export_restores_with_files_to_the_undisturbed_result(
    tmp_path: Path, workspace: str
) -> None:
    """Right after the export, back to the pause before it: the mission files lose the carried work, and the
    unit, unchanged since the pause but now based on what was carried, is made again from the pause's
    snapshots of its sandbox, so its work merges onto the files it had at the pause."""
    store, mid, side = _paused_mid_unit(tmp_path, workspace)
    paused = point_after(store, mid, "paused")
    ok(keel("export", mid, "-o", str(tmp_path / "m.keelbundle"), store=store))
    ok(keel("restore", mid, paused, "--files", store=store))
    assert "out.txt" not in files(Path(record(store, mid).sandbox))
    resumed = keel("resume", mid, "--plain", store=store, timeout=120)
    assert record(store, mid).question is None, record(store, mid).question
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert files(Path(record(store, mid).sandbox)) == RESULT
    assert side.read_text().split() == ["effect"]
