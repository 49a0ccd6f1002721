"""verify_all: every problem of a store in one report, each naming its database and key."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from keel.protocol.records import CheckpointManifest, JournalEntry, MissionRecord, UnitMark
from keel.protocol.spec import MissionSpec, UnitSpec
from keel.protocol.states import MissionState, UnitState
from keel.storage import DB, Store
from keel.storage import missions as m
from keel.storage.keys import log_key, unit_prefix
from keel.storage.verify import verify_all
from tests.storage.raw import flip_byte


def make_mission(store: Store, mission_id: str, checkpoints: int = 2) -> list[str]:
    """A mission with journal entries, events and `checkpoints` checkpoints; returns the manifests' digests."""
    spec = MissionSpec(name=mission_id, agent=("agent",), units=(UnitSpec(id="u1"),))
    now = time.time()

    def build(t: object) -> list[str]:
        txn = t  # type: ignore[assignment]
        m.put_mission(
            txn,
            MissionRecord(
                id=mission_id, spec=spec, state=MissionState.CREATED, created_at=now, updated_at=now, workspace="/w"
            ),
        )
        m.set_mission_state(txn, mission_id, MissionState.RUNNING)
        digests, parent = [], ""
        for n in range(1, checkpoints + 1):
            m.journal_put(txn, mission_id, "u1", JournalEntry(seq=n, kind="now", fingerprint=f"f{n}", result=n))
            manifest = CheckpointManifest(
                mission_id=mission_id,
                number=n,
                reason="unit",
                created_at=now,
                parent=parent,
                graph=txn.put_object(spec.units),
                config=txn.put_blob(b"config"),
                units={
                    "u1": UnitMark(
                        state=UnitState.RUNNING,
                        journal_hwm=n,
                        agent_state=txn.put_blob(f"{mission_id} state {n}".encode()),
                    )
                },
            )
            point = m.commit_checkpoint(txn, manifest)
            digests.append(point.checkpoint)
            parent = point.checkpoint
        return digests

    return store.write(build)  # type: ignore[arg-type]


def test_healthy_store_verifies(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    path = store_folder(tmp_path / "s")
    with Store.open(path) as store:
        make_mission(store, "m1")
        report = verify_all(store)
    assert report.ok and report.problems == []
    # meta, mission, 2 events? (one state change), 2 journal entries, 2 points, 1 head, blobs
    assert report.records >= 1 + 1 + 1 + 2 + 2 + 1 + 6


def test_every_problem_is_reported_in_one_run(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    path = store_folder(tmp_path / "s")
    with Store.open(path) as store:
        m1 = make_mission(store, "m1")  # journal entry 2 gets a flipped byte
        m2 = make_mission(store, "m2")  # HEAD's manifest goes missing
        m3 = make_mission(store, "m3")  # the newest manifest refers to a missing agent-state blob
        m4 = make_mission(store, "m4", checkpoints=1)  # restore point p1's checkpoint goes missing
        m5 = make_mission(store, "m5")  # untouched
        manifest3 = store.read(lambda t: m.get_checkpoint(t, m3[-1]))

        def damage(t: object) -> None:
            txn = t  # type: ignore[assignment]
            txn.delete(DB.BLOBS, m2[-1].encode())
            txn.delete(DB.BLOBS, manifest3.units["u1"].agent_state.encode())
            txn.delete(DB.BLOBS, m4[0].encode())
            txn.put(DB.HEADS, b"m4", m5[-1])  # keep m4's HEAD valid: only its restore point is broken

        store.write(damage)  # type: ignore[arg-type]
    flip_byte(path, DB.JOURNAL, log_key(unit_prefix("m1", "u1"), 2), 50)
    with Store.open(path) as store:
        report = verify_all(store)
        assert store.read(lambda t: m.journal_get(t, "m5", "u1", 2)) is not None
    found = {(p.db, p.key, p.message) for p in report.problems}
    assert found == {
        ("journal", "m1/u1/2", "digest mismatch (BLAKE2b-256)"),
        ("heads", "m2", f"checkpoint {m2[-1][:16]} is missing"),
        ("blobs", m3[-1], f"checkpoint 2 refers to missing blob {manifest3.units['u1'].agent_state[:16]}"),
        ("points", "m4/1", f"restore point p1 refers to missing checkpoint {m4[0][:16]}"),
        ("points", "m2/2", f"restore point p2 refers to missing checkpoint {m2[-1][:16]}"),
    }, report.problems
    assert not report.ok and m1 and m5


def test_corrupt_manifest_and_undecodable_records_are_reported(
    tmp_path: Path, store_folder: Callable[[Path], Path]
) -> None:
    path = store_folder(tmp_path / "s")
    with Store.open(path) as store:
        digests = make_mission(store, "m1")
        store.write(lambda t: t.put(DB.EVENTS, b"m1\x00junk", JournalEntry(seq=1, kind="x", fingerprint="")))
    flip_byte(path, DB.BLOBS, digests[0].encode(), 60)  # the parent manifest, reached through HEAD
    with Store.open(path) as store:
        report = verify_all(store)
    problems = {(p.db, p.key): p.message for p in report.problems}
    assert problems[("blobs", digests[0])] == "digest mismatch (BLAKE2b-256)"
    assert problems[("events", "m1/junk")].startswith("does not decode as Event")
    assert len(report.problems) == 2, report.problems
