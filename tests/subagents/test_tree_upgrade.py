"""A lease tree digest recorded by the keel before folder trees, compared after an upgrade.

The host compares a unit sandbox with the digest recorded with its lane's last change when it takes the
unit up again (placement.problem). Leases written before the upgrade hold the old 32-hex digest;
an intact sandbox must not look tampered because of it, and a changed one must still be noticed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import keel, kill, mission_id_of, read, record, start_keel, wait_for, write_mission
from subagent_helpers import lease, wait_gone

from keel.protocol.states import MissionState
from keel.storage import Store, leases
from keel.storage import missions as m
from tests.bundles.kit import git_workspace
from tests.rewind.test_tree_digest import digest_recorded_by_the_previous_keel

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


@pytest.mark.parametrize("tampered", [False, True])
def test_a_lease_digest_from_before_the_upgrade(tmp_path: Path, tampered: bool) -> None:
    side = tmp_path / "side.log"
    units = [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "A\n"}},
                    {"tool": "run", "args": {"cmd": f"echo ran >> {side}"}},
                    {"sleep": 1.5},
                    {"tool": "read_file", "args": {"path": "a.txt"}},
                ]
            },
        }
    ]
    store = tmp_path / "store"
    git_workspace(tmp_path / "ws")
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: (e := read(store, lambda t: m.journal_get(t, mid, "a", 2))) is not None and e.phase == "done")
    held = lease(store, mid, "a")
    assert held is not None and len(held.place.tree) == 64
    kill(host)
    wait_gone(held.pid, timeout=2.0)
    sandbox = Path(held.place.sandbox)
    assert (sandbox / ".git").is_file()  # a worktree: the old digest counted this file
    old = digest_recorded_by_the_previous_keel(sandbox)
    with Store.open(store) as s:
        s.write(lambda t: leases.recorded(t, mid, "a", held.epoch, mark=held.place.last_checkpoint, tree=old))
    if tampered:
        (sandbox / "a.txt").write_text("edited by someone else\n")
        keel("resume", mid, store=store, check_rc=3)
        question = record(store, mid).question
        assert question is not None and question.kind == "reexecute", question
        assert f"recorded {old[:12]}" in question.text
    else:
        keel("resume", mid, store=store, check_rc=0)
        assert record(store, mid).state == MissionState.COMPLETED and record(store, mid).question is None
    assert side.read_text().split() == ["ran"]
