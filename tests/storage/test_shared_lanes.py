"""A journal lane that begins as another (a restore's): every read of storage/missions sees it as the copy it
stands for, its own entries in the place of the shared ones, through a chain of two; and the tally of a
mission's evidence counts what its log holds, also one an older keel wrote without a tally."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from keel.protocol.records import Evidence, JournalEntry, LaneBase
from keel.storage import DB, Store, Txn
from keel.storage import missions as m
from keel.storage.errors import CorruptRecordError
from keel.storage.keys import mission_prefix, unit_prefix

MID = "m1"


def entry(seq: int, kind: str = "tool/run", phase: str = "done", note: str = "") -> JournalEntry:
    return JournalEntry(seq=seq, kind=kind, fingerprint=f"f{seq}", phase=phase, at=float(seq), summary=note)  # type: ignore[arg-type]


def lane_of(txn: Txn, lane: str, seqs: range, **changed: JournalEntry) -> None:
    for seq in seqs:
        m.journal_put(txn, MID, lane, changed.get(str(seq), entry(seq, "state/save" if seq % 7 == 0 else "tool/run")))


def views(txn: Txn, lane: str) -> tuple[object, ...]:
    """Every way storage/missions reads a lane."""
    return (
        m.journal_entries(txn, MID, lane),
        m.journal_entries(txn, MID, lane, after=3, upto=9),
        m.journal_entries(txn, MID, lane, upto=0),
        list(m.journal_scan(txn, MID, lane)),
        list(m.journal_kinds(txn, MID, lane, 11)),
        [m.journal_get(txn, MID, lane, seq) for seq in range(0, 16)],
        m.journal_last_done(txn, MID, lane, "state/save"),
        m.journal_last_done(txn, MID, lane, "tool/run"),
        txn.last_seq(DB.JOURNAL, unit_prefix(MID, lane)),
    )


def test_a_shared_lane_reads_as_the_copy_it_stands_for(tmp_path: Path) -> None:
    settled = entry(4, phase="done", note="settled later")
    with Store.open(tmp_path / "store", create=True) as store:

        def write(txn: Txn) -> None:
            lane_of(txn, "u", range(1, 16))  # the old lane went on past the point (entry 10)
            m.share_lane(txn, MID, "u#1", LaneBase(lane="u", upto=10))
            m.journal_put(txn, MID, "u#1", settled)  # its own entry in the place of a shared one
            lane_of(txn, "u#1", range(11, 13))
            m.share_lane(txn, MID, "u#2", LaneBase(lane="u#1", upto=12))  # a restore of the restore
            lane_of(txn, "u#2", range(13, 14))
            # the copies a restore used to write, for comparison
            lane_of(txn, "c1", range(1, 11), **{"4": settled})
            lane_of(txn, "c1", range(11, 13))
            lane_of(txn, "c2", range(1, 11), **{"4": settled})
            lane_of(txn, "c2", range(11, 14))

        store.write(write)
        assert store.read(lambda t: views(t, "u#1")) == store.read(lambda t: views(t, "c1"))
        assert store.read(lambda t: views(t, "u#2")) == store.read(lambda t: views(t, "c2"))
        assert store.read(lambda t: [e.seq for e in m.own_entries(t, MID, "u#1")]) == [4, 10, 11, 12]
        assert store.read(lambda t: m.journal_lanes(t, MID)) == ["c1", "c2", "u", "u#1", "u#2"]


def test_a_lane_cannot_share_an_entry_that_is_missing(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store", create=True) as store:
        store.write(lambda t: lane_of(t, "u", range(1, 4)))
        with pytest.raises(CorruptRecordError, match="lane u#1 cannot begin as lane u up to entry 5"):
            store.write(lambda t: m.share_lane(t, MID, "u#1", LaneBase(lane="u", upto=5)))


def test_the_evidence_tally_counts_what_the_log_holds(tmp_path: Path) -> None:
    kinds = ["tool", "diff", "failover", "tool", "verification"] * 5
    with Store.open(tmp_path / "store", create=True) as store:

        def older_keel(txn: Txn) -> None:  # evidence appended without a tally, as an older keel did
            for n, kind in enumerate(kinds[:7]):
                txn.append(DB.EVIDENCE, mission_prefix(MID), Evidence(kind=kind, at=float(n)))

        store.write(older_keel)
        store.write(lambda t: [m.add_evidence(t, MID, Evidence(kind=k, at=9.0)) for k in kinds[7:]])
        tally = store.read(lambda t: m.evidence_tally(t, MID))
        counted = {k: kinds.count(k) for k in set(kinds)}
        assert (tally.upto, tally.kinds) == (len(kinds), counted)
        assert tally.recent["failover"] == tuple(range(3, len(kinds) + 1, 5))[-m.RECENT :]
        store.write(lambda t: m.delete_mission_records(t, MID))
        fresh = Evidence(kind="note", at=1.0)
        store.write(lambda t: m.add_evidence(t, MID, fresh))  # a tally from the first entry is kept as it goes
        stored = store.read(lambda t: t.get(DB.META, m.tally_key(MID), m.EvidenceTally))
        assert stored == m.EvidenceTally(upto=1, kinds={"note": 1}, recent={"note": (1,)})
        assert msgspec.structs.asdict(store.read(lambda t: m.evidence_tally(t, MID))) == msgspec.structs.asdict(stored)
