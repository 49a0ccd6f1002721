"""A restore point taken while a unit was half-way (the point of a pause, the unit then resumed and
finished): restoring to it, or forking from it, makes the unit's own sandbox as it was at the point from
the point's snapshot of it, so the unit's recorded steps before the point are answered from the journal
(their effects not made again) and their files are still there. The result equals an undisturbed run's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from keel.storage import Store, Txn
from keel.storage import missions as m
from tests.bundles.kit import BINARY, files, git, git_workspace, keel, ok, read, record, wait_for
from tests.rewind.kit import mission_toml, points

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def _units(side: Path, gate: Path) -> list[dict[str, object]]:
    return [
        {
            "id": "u1",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "made before the point\n"}},
                    {"tool": "run", "args": {"cmd": f"echo u1-1 >> {side} && echo shell > s.txt"}},
                    {"wait_file": str(gate)},  # the pause comes here; later runs find the gate open
                    {"tool": "write_file", "args": {"path": "b.txt", "content": "made after the point\n"}},
                    {"tool": "run", "args": {"cmd": f"echo u1-2 >> {side}"}},
                ]
            },
        },
        {"id": "u2", "after": ["u1"], "params": {"steps": [{"tool": "run", "args": {"cmd": "cat *.txt > all"}}]}},
    ]


RESULT = {
    "README.md": b"hello\n",
    "data.bin": BINARY,
    "old.txt": b"to be deleted\n",
    "a.txt": b"made before the point\n",
    "s.txt": b"shell\n",
    "b.txt": b"made after the point\n",
    "all": b"made before the point\nmade after the point\nto be deleted\nshell\n",  # cat a b old s
}


def _mission_paused_mid_unit(tmp: Path) -> tuple[Path, str, str, Path]:
    """(store, mission id, the pause's point, side log): u1 paused after its first two steps, then resumed
    to the end."""
    ws, side, store = tmp / "ws", tmp / "side.log", tmp / "store"
    git_workspace(ws)
    gate = tmp / "gate"
    (tmp / "mission.toml").write_text(mission_toml(_units(side, gate)))
    host = subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", "run", str(tmp / "mission.toml"), "--plain", "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: store.exists() and bool(json.loads(keel("missions", "--json", store=store).stdout or "[]")))
        mid = json.loads(keel("missions", "--json", store=store).stdout)[0]["id"]

        def step_two_done() -> bool:
            entry = read(store, lambda t: m.journal_get(t, mid, "u1", 2))
            return entry is not None and entry.phase == "done"

        wait_for(step_two_done, timeout=60)
        ok(keel("pause", mid, store=store))
        out, _ = host.communicate(timeout=60)
    finally:
        host.kill()
    assert record(store, mid).state.value == "paused", out
    gate.write_text("open\n")
    point = points(store, mid)[-1]
    manifest = read(store, lambda t: m.get_checkpoint(t, m.get_point(t, mid, point["id"]).checkpoint))
    mark = manifest.units["u1"]
    assert mark.state.value != "succeeded" and mark.journal_hwm >= 2 and mark.tree, mark  # really half-way
    ok(keel("resume", mid, "--plain", store=store, timeout=120))
    assert files(Path(record(store, mid).sandbox)) == RESULT
    assert side.read_text().split() == ["u1-1", "u1-2"]
    return store, mid, point["id"], side


@pytest.mark.parametrize("how", ["restore", "fork", "export"])
def test_a_point_inside_a_unit_gives_back_the_units_files(tmp_path: Path, how: str) -> None:
    """`export`: restored, then exported before any host made the unit's sandbox again; the bundle carries
    the unit's files at the point (from the point's snapshot), and the mission finishes on another store."""
    store, mid, point, side = _mission_paused_mid_unit(tmp_path)
    target = mid
    if how == "fork":
        target = json.loads(ok(keel("fork", mid, point, "--json", store=store)).stdout)["mission"]
    else:
        ok(keel("restore", mid, point, "--files", store=store))
    if how == "export":
        bundle, elsewhere = tmp_path / "m.keelbundle", tmp_path / "b"
        ok(keel("export", mid, "-o", str(bundle), store=store))
        elsewhere.mkdir()
        git(elsewhere, "clone", "-q", str(tmp_path / "ws"), "ws")
        store = elsewhere / "store"
        ok(keel("import", str(bundle), "--workspace", str(elsewhere / "ws"), "--allow-unsigned", store=store))
    ok(keel("resume", target, "--plain", store=store, timeout=120))
    assert record(store, target).state.value == "completed"
    # u1's steps before the point ran once; the ones after it run again from the point, as they should
    assert side.read_text().split() == ["u1-1", "u1-2", "u1-2"]
    assert files(Path(record(store, target).sandbox)) == RESULT
    ok(keel("verify", store=store))


def test_a_point_without_the_units_snapshot_asks_before_running_its_effects_again(tmp_path: Path) -> None:
    """A point that names no snapshot of the unit's own sandbox (written by an older keel; an outside
    agent's unit has none either): the restored unit has no sandbox to go on in, and its journal up to
    the point holds effects, so the person is asked ("rerun" or "fail") instead of a replay into a sandbox
    without their files. "rerun" runs it from scratch, effects and all, and the result is right."""
    store, mid, point, side = _mission_paused_mid_unit(tmp_path)

    def older(txn: Txn) -> str:
        head = m.head_checkpoint(txn, mid)
        paused = m.get_checkpoint(txn, m.get_point(txn, mid, point).checkpoint)
        assert head is not None
        marks = {uid: msgspec.structs.replace(mk, tree="", base_tree="") for uid, mk in paused.units.items()}
        copy = msgspec.structs.replace(
            paused, number=head.number + 1, parent=m.head(txn, mid) or "", units=marks, created_at=time.time()
        )
        return m.commit_checkpoint(txn, copy, label="as an older keel wrote it").id

    with Store.open(store, create=False) as s:
        old_point = s.write(older)
    ok(keel("restore", mid, old_point, "--files", store=store))
    asked = keel("resume", mid, "--plain", store=store, timeout=120)
    assert asked.returncode == 3, asked.stdout + asked.stderr
    question = record(store, mid).question
    assert question is not None and question.kind == "reexecute" and question.unit == "u1", question
    assert f"restore point {old_point} holds no snapshot of its sandbox" in question.text, question.text
    assert question.choices == ("rerun", "fail") and side.read_text().split() == ["u1-1", "u1-2"]
    ok(keel("answer", mid, "rerun", "--no-resume", store=store))
    ok(keel("resume", mid, "--plain", store=store, timeout=120))
    assert record(store, mid).state.value == "completed"
    assert side.read_text().split() == ["u1-1", "u1-2", "u1-1", "u1-2"]  # the person chose to run it again
    assert files(Path(record(store, mid).sandbox)) == RESULT
