"""File snapshots survive `keel gc` and travel in bundles: every point kept still restores with files,
in the store it was made in and in another one it was imported into. Without git, the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from keel.storage import DB
from tests.bundles.kit import keel, ok, read, record
from tests.rewind.kit import (
    AFTER_U1,
    AFTER_U2,
    UNITS,
    imported_into_a_clone,
    mission,
    mission_toml,
    points,
    sandbox_files,
)


def _file_blobs(store: Path) -> int:
    return read(store, lambda t: sum(1 for _ in t.scan_raw(DB.BLOBS, b"")))  # type: ignore[no-any-return]


def test_every_point_kept_by_gc_still_restores_with_files(tmp_path: Path) -> None:
    _, store, mid = mission(tmp_path)
    sandbox = Path(record(store, mid).sandbox)
    ok(keel("restore", mid, "p2", "--files", store=store))  # history grows; nothing is rewritten
    blobs = _file_blobs(store)
    report = json.loads(ok(keel("gc", "--keep-last", "2", "--json", store=store)).stdout)
    assert report["points_dropped"]  # the policy really dropped points
    assert _file_blobs(store) == blobs - report["blobs_removed"]
    assert ok(keel("verify", store=store)).returncode == 0
    kept = points(store, mid)
    assert [p["reason"] for p in kept] == ["completed", "restored to p2"]
    for point, files in zip(kept, (AFTER_U2, AFTER_U1), strict=True):
        ok(keel("restore", mid, point["id"], "--files", store=store))
        assert sandbox_files(sandbox) == files


def test_bundle_carries_the_snapshots_and_points_restore_after_import(tmp_path: Path) -> None:
    ws, store, mid = mission(tmp_path)
    other = imported_into_a_clone(tmp_path, ws, store, mid)
    p_u1 = next(p["id"] for p in points(other, mid) if p["reason"] == "unit succeeded: u1")
    ok(keel("restore", mid, p_u1, "--files", store=other))
    assert sandbox_files(Path(record(other, mid).sandbox)) == AFTER_U1
    text = ok(keel("diff", mid, p_u1, store=other)).stdout
    assert "+++ sandbox/b.txt" not in text and text == ""


def test_without_git_restore_fork_and_apply_use_the_snapshots(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("hello\n")
    (ws / "old.txt").write_text("to be deleted\n")
    (ws / "data.bin").write_bytes(AFTER_U1["data.bin"])
    (tmp_path / "mission.toml").write_text(mission_toml(UNITS))
    store = tmp_path / "store"
    ok(keel("run", str(tmp_path / "mission.toml"), "--plain", store=store))
    mid = json.loads(ok(keel("missions", "--json", store=store)).stdout)[0]["id"]
    sandbox = Path(record(store, mid).sandbox)
    assert sandbox_files(sandbox) == AFTER_U2
    ok(keel("restore", mid, "p2", "--files", store=store))
    assert sandbox_files(sandbox) == AFTER_U1
    fork = json.loads(ok(keel("fork", mid, "p3", "--json", store=store)).stdout)
    assert sandbox_files(Path(fork["sandbox"])) == AFTER_U2
    ok(keel("apply", fork["mission"], store=store))
    assert {p: (ws / p).read_bytes() for p in AFTER_U2} == AFTER_U2 and not (ws / "old.txt").exists()
    shutil.rmtree(sandbox)  # a lost sandbox is rebuilt from the snapshot
    ok(keel("restore", mid, "p3", "--files", store=store))
    assert sandbox_files(sandbox) == AFTER_U2
