"""File snapshots survive `keel gc` and travel in bundles: every point kept still restores with files,
in the store it was made in and in another one it was imported into. Without git, the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from keel.protocol.records import CheckpointManifest
from keel.storage import DB, Txn
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

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


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


def _checkpoints(store: Path, mid: str) -> dict[int, str]:
    """number -> digest of every checkpoint of HEAD's chain still in the store."""
    from keel.storage import missions as m

    def chain(t: Txn) -> dict[int, str]:
        found, digest = {}, m.head(t, mid)
        manifest = m.get_checkpoint(t, digest) if digest else None
        while manifest is not None:
            found[manifest.number] = digest
            digest, manifest = manifest.parent, m.parent_checkpoint(t, manifest)
        return found

    return read(store, chain)  # type: ignore[no-any-return]


def test_keep_last_frees_what_only_the_dropped_points_needed(tmp_path: Path) -> None:
    """On a linear history, dropping the older points frees their checkpoints and the snapshots only they
    named; the kept points restore with files, `keel apply` still compares with what the mission started
    from, a bundle still carries the mission, and a second collection frees nothing more."""
    units = [
        {"id": f"u{i}", "after": [f"u{i - 1}"] if i else [], "params": {"steps": [
            {"tool": "write_file", "args": {"path": f"f{i}.txt", "content": f"{i}\n" * 2000}},
            {"tool": "run", "args": {"cmd": f"echo {i} >> log.txt"}},
        ]}}
        for i in range(6)
    ]  # fmt: skip
    ws, store, mid = mission(tmp_path, units)
    sandbox = Path(record(store, mid).sandbox)
    final = sandbox_files(sandbox)
    before = _checkpoints(store, mid)
    blobs = _file_blobs(store)
    report = json.loads(ok(keel("gc", "--keep-last", "2", "--json", store=store)).stdout)
    kept = points(store, mid)
    assert len(kept) == 2 and report["points_dropped"]
    oldest = min(read(store, lambda t, p=p: t.get_object(p["checkpoint"], CheckpointManifest)).number for p in kept)
    after = _checkpoints(store, mid)
    assert sorted(after) == [n for n in sorted(before) if n >= oldest], "checkpoints older than the kept points stay"
    assert report["blobs_removed"] >= len(before) - len(after) > 0 and report["bytes_freed"] > 0
    assert _file_blobs(store) == blobs - report["blobs_removed"]
    assert ok(keel("verify", store=store)).returncode == 0
    again = json.loads(ok(keel("gc", "--keep-last", "2", "--json", store=store)).stdout)
    assert again["blobs_removed"] == 0 and again["points_dropped"] == []
    other = imported_into_a_clone(tmp_path, ws, store, mid)  # the bundle's chain ends where the store's does
    for point in kept:  # each kept point still restores with its files, here and after import
        for where in (store, other):
            ok(keel("restore", mid, point["id"], "--files", store=where))
            done = int(point["reason"].removeprefix("unit succeeded: u")) if point["reason"] != "completed" else 5
            expected = {k: v for k, v in final.items() if not k.startswith("f") or int(k[1:-4]) <= done}
            expected["log.txt"] = "".join(f"{i}\n" for i in range(done + 1)).encode()
            assert sandbox_files(Path(record(where, mid).sandbox)) == expected, point
    ok(keel("restore", mid, kept[-1]["id"], "--files", store=store))
    assert sandbox_files(sandbox) == final
    ok(keel("apply", mid, store=store))  # against the first snapshot, which gc kept
    assert {p: (ws / p).read_bytes() for p in final} == final
