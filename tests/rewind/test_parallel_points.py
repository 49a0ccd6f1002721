"""Restore points of a mission whose units run in parallel agree with each unit's journal.

Two independent units run at the same time, each writing files and running commands that change files,
with a snapshot checkpoint after every step: checkpoints are taken while the other unit's command is
running. A restore with files to every point gives the mission sandbox the files of the units finished
at that point, and each unfinished unit exactly the files its journal up to the point's mark says it
made (its sandbox as the resuming host makes it from what the restore left: `placement.make_here`,
which `registry.recover` calls): a unit's mark is from a moment when none of its changes was half-made,
whatever the other unit was doing then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keel.protocol.states import UnitState
from keel.server.engine.units import placement
from keel.storage import Store, leases
from keel.storage import missions as m
from tests.bundles.kit import BINARY, files, git_workspace, keel, ok, read, record
from tests.rewind.kit import mission_toml, points

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

BASE = {"README.md": b"hello\n", "data.bin": BINARY, "old.txt": b"to be deleted\n"}
UNITS = {"a": 0.4, "b": 0.25}  # each unit's command time: their steps interleave unevenly
ROUNDS = 3  # each round: a write_file, then a command that appends to a file


def _steps(uid: str, command_s: float) -> list[dict[str, object]]:
    steps: list[dict[str, object]] = []
    for i in range(ROUNDS):
        steps.append({"tool": "write_file", "args": {"path": f"{uid}/w{i}.txt", "content": f"{uid} {i}\n"}})
        steps.append({"tool": "run", "args": {"cmd": f"sleep {command_s} && echo {i} >> {uid}/r.txt"}})
    return steps


def _own_files(uid: str, hwm: int) -> dict[str, bytes]:
    """The unit's own files after its first `hwm` steps (entry n is step n)."""
    out: dict[str, bytes] = {}
    for i in range(ROUNDS):
        if hwm >= 2 * i + 1:
            out[f"{uid}/w{i}.txt"] = f"{uid} {i}\n".encode()
        if hwm >= 2 * i + 2:
            out[f"{uid}/r.txt"] = "".join(f"{k}\n" for k in range(i + 1)).encode()
    return out


def test_a_restore_to_every_point_gives_each_unit_its_files_at_its_mark(tmp_path: Path) -> None:
    git_workspace(tmp_path / "ws")
    units = [{"id": uid, "params": {"steps": _steps(uid, s)}} for uid, s in UNITS.items()]
    settings = 'max_parallel = 2\n\n[checkpoint]\npolicy = "every-step"\n\n[[units]]'
    text = mission_toml(units).replace("[[units]]", settings, 1)
    (tmp_path / "mission.toml").write_text(text)
    store = tmp_path / "store"
    ok(keel("run", str(tmp_path / "mission.toml"), "--plain", store=store, timeout=120))
    mid = json.loads(ok(keel("missions", "--json", store=store)).stdout)[0]["id"]
    sandbox = Path(record(store, mid).sandbox)
    assert files(sandbox) == {**BASE, **_own_files("a", 2 * ROUNDS), **_own_files("b", 2 * ROUNDS)}
    both_midway = 0
    for point in points(store, mid):
        manifest = read(store, lambda t, p=point["id"]: m.get_checkpoint(t, m.get_point(t, mid, p).checkpoint))
        ok(keel("restore", mid, point["id"], "--files", store=store))
        finished = {uid for uid, mark in manifest.units.items() if mark.state == UnitState.SUCCEEDED}
        expected = dict(BASE)
        for uid in finished:
            expected |= _own_files(uid, 2 * ROUNDS)
        assert files(sandbox) == expected, f"the mission sandbox at {point}"
        midway = [uid for uid, mark in manifest.units.items() if uid not in finished and mark.journal_hwm > 0]
        both_midway += len(midway) == len(UNITS)
        for uid in midway:
            mark = manifest.units[uid]
            held = read(store, lambda t, u=uid: leases.get(t, mid, u))
            assert held is not None and held.place.tree and held.place.last_checkpoint == mark.journal_hwm, (
                point,
                held,
            )
            made = tmp_path / "made" / f"{point['id']}-{uid}"
            with Store.open(store, create=False) as s:
                placement.make_here(s, store, mid, held, made)
            assert files(made) == {**BASE, **_own_files(uid, mark.journal_hwm)}, f"unit {uid} at {point}"
    assert both_midway, "no point was taken while both units were half-way: they did not run side by side"
