"""A checkpoint names every blob it needs: an agent state saved by a `state/save` step is a blob that only the
next checkpoint names, so a `keel gc` in between removes it; the checkpoint stores it again from the unit's
journal, which holds the state itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import write_mission

from keel.protocol.records import JournalEntry, UnitMark
from keel.protocol.spec import UnitSpec
from keel.protocol.states import MissionState, UnitState
from keel.server.engine import checkpoint, control
from keel.storage import DB, Store, Txn
from keel.storage import missions as m
from keel.storage.verify import verify_all

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def test_a_checkpoint_stores_again_an_agent_state_a_collection_removed(
    tmp_path: Path, store_folder: Callable[[Path], Path]
) -> None:
    state = {"files_done": ["a.py", "b.py"], "cursor": 7}
    with Store.open(store_folder(tmp_path / "store")) as store:
        mid = control.create_mission(store, write_mission(tmp_path, [{"id": "a", "params": {"steps": []}}])).id

        def saved_then_collected(txn: Txn) -> str:
            entry = JournalEntry(seq=1, kind="state/save", fingerprint="fp", phase="done", result={"state": state})
            m.journal_put(txn, mid, "a", entry)
            digest = txn.put_object(state)  # what the step stores; no checkpoint names it yet
            txn.delete(DB.BLOBS, digest.encode())  # a collection planned after the step removed it
            return digest

        digest = store.write(saved_then_collected)
        mark = UnitMark(state=UnitState.RUNNING, journal_hwm=1, agent_state=digest)
        point = store.write(
            lambda t: checkpoint.commit(
                t,
                mid,
                reason="unit a saved its state",
                units=[UnitSpec(id="a")],
                marks={"a": mark},
                config={},
                state=MissionState.RUNNING,
            )
        )
        head = store.read(lambda t: m.get_checkpoint(t, point.checkpoint))
        assert head is not None and head.units["a"].agent_state == digest
        assert store.read(lambda t: t.get_object(digest, dict)) == state
        report = verify_all(store)
        assert report.ok, report.problems
