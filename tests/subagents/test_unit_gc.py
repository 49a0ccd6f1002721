"""`keel gc` and unit sandboxes, through real `keel run`, `keel pause` and `keel gc` processes on a real git
workspace: the worktrees and `keel/<id>-units/*` branches of finished, merged units go (a dry run only
lists them); the mission branch, its result and the person's checkout stay; a mission whose host runs is
left alone; an unfinished unit of a paused mission keeps its sandbox and branch, and the mission still
completes after gc."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import files, keel, kill, mission_id_of, read, record, start_keel, wait_for, write_mission
from subagent_helpers import all_leases, checkout_fingerprint, git, lease

from keel.protocol.states import MissionState, UnitState
from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    (ws / "base.txt").write_text("base\n")
    git(ws, "add", "base.txt")
    git(ws, "commit", "-q", "-m", "base")
    git(ws, "branch", "topic")  # the person's own branch: never touched
    return ws


def _writes(uid: str) -> dict[str, Any]:
    return {"tool": "write_file", "args": {"path": f"{uid}.txt", "content": f"{uid}\n"}}


def _unit_branches(ws: Path) -> list[str]:
    return git(ws, "branch", "--list", "keel/*-units/*", "--format=%(refname:short)").split()


def _gc(store: Path, *flags: str) -> dict[str, Any]:
    out = keel("gc", *flags, "--json", store=store, check_rc=0).stdout
    return json.loads(out)["units"]  # type: ignore[no-any-return]


def test_gc_removes_finished_unit_sandboxes_and_branches_and_keeps_the_result(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    units = [
        {"id": "a", "params": {"steps": [_writes("a")]}},
        {"id": "b", "params": {"steps": [_writes("b")]}},
        {"id": "c", "after": ["a", "b"], "params": {"steps": [_writes("c")]}},
    ]
    store = tmp_path / "store"
    keel("run", str(write_mission(tmp_path, units)), store=store, check_rc=0)
    mid = read(store, m.list_missions)[0].id
    sandbox = Path(record(store, mid).sandbox)
    sandboxes = sorted(Path(x.place.sandbox) for x in all_leases(store, mid))
    assert len(sandboxes) == 3 and all(p.is_dir() for p in sandboxes)
    assert len(_unit_branches(ws)) == 3
    result, mission_tree = files(sandbox), git(ws, "rev-parse", f"keel/{mid}^{{tree}}")
    before = checkout_fingerprint(ws)

    dry = _gc(store, "--dry-run")
    assert sorted(x["name"] for x in dry["removed"] if x["kind"] == "sandbox") == [str(p) for p in sandboxes]
    assert sorted(x["name"] for x in dry["removed"] if x["kind"] == "branch") == _unit_branches(ws)
    assert dry["bytes_freed"] > 0 and dry["kept"] == [] and dry["dry_run"]
    assert all(p.is_dir() for p in sandboxes) and len(_unit_branches(ws)) == 3  # a dry run removes nothing

    text = keel("gc", store=store, check_rc=0).stdout
    assert text.count("removed unit sandbox") == 3 and text.count("removed unit branch") == 3, text
    assert f"({dry['bytes_freed']} bytes freed)" in text, text
    assert _unit_branches(ws) == [] and not any(p.exists() for p in sandboxes)
    assert not (sandboxes[0].parent).exists()  # the mission's units folder, now empty
    assert git(ws, "worktree", "list", "--porcelain").count("worktree ") == 2  # the checkout and the mission's
    assert files(sandbox) == result and git(ws, "rev-parse", f"keel/{mid}^{{tree}}") == mission_tree
    assert checkout_fingerprint(ws) == before  # checkout, index, HEAD, .git/config, the person's branches
    assert _gc(store)["removed"] == []  # nothing left to collect
    keel("verify", store=store, check_rc=0)
    keel("apply", mid, store=store, check_rc=0)
    assert {p: (ws / p).read_text() for p in ("a.txt", "b.txt", "c.txt")} == {
        "a.txt": "a\n",
        "b.txt": "b\n",
        "c.txt": "c\n",
    }


def test_a_paused_missions_unfinished_unit_keeps_its_sandbox(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    units = [
        {"id": "a", "params": {"steps": [_writes("a")]}},
        {"id": "b", "params": {"steps": [_writes("b"), {"sleep": 8.0}]}},
    ]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    try:
        mid = mission_id_of(host)
        wait_for(
            lambda: (
                (a := lease(store, mid, "a")) is not None
                and a.place.merged
                and (b := lease(store, mid, "b")) is not None
                and b.place.last_checkpoint >= 1
            ),
            timeout=30,
        )
        running = _gc(store)  # its host is alive: not even the finished unit's sandbox is touched
        assert running["removed"] == [] and running["running"] == [mid], running
        assert Path(lease(store, mid, "a").place.sandbox).is_dir() and len(_unit_branches(ws)) == 2  # type: ignore[union-attr]
        keel("pause", mid, store=store, check_rc=0)
        assert host.wait(timeout=30) == 3
    finally:
        kill(host)
    assert record(store, mid).state == MissionState.PAUSED
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    assert head.units["a"].state == UnitState.SUCCEEDED and head.units["b"].state != UnitState.SUCCEEDED
    a, b = lease(store, mid, "a"), lease(store, mid, "b")
    assert a is not None and b is not None

    report = _gc(store)
    assert sorted((x["unit"], x["kind"]) for x in report["removed"]) == [("a", "branch"), ("a", "sandbox")]
    assert sorted((x["unit"], x["kind"]) for x in report["kept"]) == [("b", "branch"), ("b", "sandbox")]
    assert not Path(a.place.sandbox).exists() and _unit_branches(ws) == [b.place.branch]
    assert (Path(b.place.sandbox) / "b.txt").read_text() == "b\n"

    keel("resume", mid, store=store, check_rc=0)  # b resumes in its own sandbox, from its journal
    assert record(store, mid).state == MissionState.COMPLETED
    assert files(Path(record(store, mid).sandbox)) == {"base.txt": b"base\n", "a.txt": b"a\n", "b.txt": b"b\n"}
    assert [x["unit"] for x in _gc(store)["removed"]] == ["b", "b"]
    assert _unit_branches(ws) == []
    keel("verify", store=store, check_rc=0)


def test_gc_removes_a_finished_units_copy_in_a_plain_folder(tmp_path: Path) -> None:
    store = tmp_path / "store"
    keel(
        "run", str(write_mission(tmp_path, [{"id": "a", "params": {"steps": [_writes("a")]}}])), store=store, check_rc=0
    )
    mid = read(store, m.list_missions)[0].id
    held = lease(store, mid, "a")
    assert (
        held is not None and (Path(held.place.sandbox) / ".git").exists() is False and Path(held.place.sandbox).is_dir()
    )
    report = _gc(store)
    assert [(x["kind"], x["name"]) for x in report["removed"]] == [
        ("sandbox", held.place.sandbox),
        ("base record", held.place.sandbox + ".base.json"),  # the digests the copy started from: listed as it goes
    ]
    assert not Path(held.place.sandbox).parent.exists()  # the copy and its record of digests are gone
    assert files(Path(record(store, mid).sandbox)) == {"a.txt": b"a\n"}
