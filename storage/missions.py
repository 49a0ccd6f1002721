"""Mission-level records: the live mission row, control requests, journals, checkpoints, restore points.

Each public function takes a `Txn` so that callers compose several into one transaction (DBOS style:
the caller opens the transaction, these do the work). Checkpoints are content-addressed manifests; the
mission's HEAD and its restore point are written in the same transaction as the manifest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TypeVar

import msgspec

from keel.protocol.errors import NotFoundError
from keel.protocol.records import (
    LANE_BASE,
    CheckpointManifest,
    Control,
    Event,
    Evidence,
    JournalEntry,
    LaneBase,
    MissionRecord,
    RestorePoint,
)
from keel.protocol.states import MissionState, check_mission_transition
from keel.storage.errors import CorruptRecordError
from keel.storage.keys import DB, SEQ_BYTES, log_key, mission_prefix, unit_prefix
from keel.storage.txn import Txn, decode_value

T = TypeVar("T")


def get_mission(txn: Txn, mission_id: str) -> MissionRecord:
    record = txn.get(DB.MISSIONS, mission_id.encode(), MissionRecord)
    if record is None:
        raise NotFoundError(f"no mission {mission_id!r}")
    return record


def find_mission(txn: Txn, mission_id: str) -> MissionRecord | None:
    return txn.get(DB.MISSIONS, mission_id.encode(), MissionRecord)


def list_missions(txn: Txn) -> list[MissionRecord]:
    return [record for _, record in txn.scan(DB.MISSIONS, b"", MissionRecord)]


def resolve_mission_id(txn: Txn, text: str) -> str:
    """A full id, or a unique prefix of one (as `git` takes short hashes)."""
    if txn.exists(DB.MISSIONS, text.encode()):
        return text
    matches = [key.decode() for key, _ in txn.scan_raw(DB.MISSIONS, text.encode())]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise NotFoundError(f"no mission {text!r}")
    raise NotFoundError(f"mission id {text!r} is ambiguous: {', '.join(matches[:5])}")


def put_mission(txn: Txn, record: MissionRecord) -> None:
    txn.put(DB.MISSIONS, record.id.encode(), record)


def delete_mission_records(txn: Txn, mission_id: str) -> int:
    """Remove a mission's row, HEAD and every per-mission log (journal, events, evidence, controls,
    points, leases, the host lease); blobs stay for gc. Returns how many records went."""
    removed = int(txn.delete(DB.MISSIONS, mission_id.encode())) + int(txn.delete(DB.HEADS, mission_id.encode()))
    removed += int(txn.delete(DB.LEASES, mission_id.encode()))  # the host lease (storage/hostlease.py)
    removed += int(txn.delete(DB.META, tally_key(mission_id)))
    prefix = mission_prefix(mission_id)
    for db in (DB.JOURNAL, DB.EVENTS, DB.EVIDENCE, DB.CONTROL, DB.POINTS, DB.LEASES):
        keys = [key for key, _ in txn.scan_raw(db, prefix)]
        for key in keys:
            removed += int(txn.delete(db, key))
    return removed


def set_mission_state(txn: Txn, mission_id: str, state: MissionState, **changes: object) -> MissionRecord:
    """Move a mission through its transition table, log the event, return the new record."""
    old = get_mission(txn, mission_id)
    if old.state != state:
        check_mission_transition(old.state, state)
    new = msgspec.structs.replace(old, state=state, updated_at=time.time(), **changes)
    put_mission(txn, new)
    if old.state != state:
        txn.append(
            DB.EVENTS,
            mission_prefix(mission_id),
            Event(kind="state", at=new.updated_at, state=state.value, message=f"{old.state.value} -> {state.value}"),
        )
    return new


# -- control requests (pause, resume, cancel, answer) --------------------------------------------
def add_control(txn: Txn, mission_id: str, control: Control) -> int:
    get_mission(txn, mission_id)
    return txn.append(DB.CONTROL, mission_prefix(mission_id), control)


def controls_after(txn: Txn, mission_id: str, after: int) -> list[tuple[int, Control]]:
    return list(txn.read_log(DB.CONTROL, mission_prefix(mission_id), Control, after=after))


# -- events and evidence --------------------------------------------------------------------------
def add_event(txn: Txn, mission_id: str, event: Event) -> int:
    return txn.append(DB.EVENTS, mission_prefix(mission_id), event)


def events_after(txn: Txn, mission_id: str, after: int = 0) -> list[tuple[int, Event]]:
    return list(txn.read_log(DB.EVENTS, mission_prefix(mission_id), Event, after=after))


def add_evidence(txn: Txn, mission_id: str, evidence: Evidence) -> int:
    """Append to the evidence log, and count it in the mission's tally when the tally counts all before it."""
    seq = txn.append(DB.EVIDENCE, mission_prefix(mission_id), evidence)
    key = tally_key(mission_id)
    tally = txn.get(DB.META, key, EvidenceTally) or EvidenceTally()
    if tally.upto == seq - 1:
        txn.put(DB.META, key, tally.add(seq, evidence.kind))
    return seq


class EvidenceTally(msgspec.Struct, frozen=True, omit_defaults=True):
    """A mission's evidence counted by kind up to entry `upto` of its log, and the newest RECENT entries of
    each kind: what a view of the mission shows without reading its whole evidence log. Stored in `meta`
    (`tally_key`) and kept by `add_evidence`; a tally that stopped counting (a mission an older keel wrote
    to, or imported from a bundle) is completed by reading the log after `upto` (`evidence_tally`)."""

    upto: int = 0
    kinds: dict[str, int] = {}
    recent: dict[str, tuple[int, ...]] = {}

    def add(self, seq: int, kind: str) -> EvidenceTally:
        kinds = {**self.kinds, kind: self.kinds.get(kind, 0) + 1}
        recent = {**self.recent, kind: (*self.recent.get(kind, ())[-(RECENT - 1) :], seq)}
        return EvidenceTally(upto=seq, kinds=kinds, recent=recent)


RECENT = 10


def tally_key(mission_id: str) -> bytes:
    return b"evidence-tally\x00" + mission_id.encode()


def evidence_tally(txn: Txn, mission_id: str) -> EvidenceTally:
    """The mission's evidence counted by kind, up to its newest entry."""
    tally = txn.get(DB.META, tally_key(mission_id), EvidenceTally) or EvidenceTally()
    for seq, item in evidence_after(txn, mission_id, tally.upto):
        tally = tally.add(seq, item.kind)
    return tally


def evidence_after(
    txn: Txn, mission_id: str, after: int = 0, upto: int | None = None
) -> Iterator[tuple[int, Evidence]]:
    return txn.read_log(DB.EVIDENCE, mission_prefix(mission_id), Evidence, after=after, upto=upto)


# -- journal ----------------------------------------------------------------------------------------
# A lane may begin as another lane of the mission (a restore's: `LaneBase` in its entry 0): its entries
# 1..upto are the other lane's, except those it holds itself. Every read below resolves that, so a lane reads
# the same whether it shares its beginning or holds a copy.


def journal_get(txn: Txn, mission_id: str, unit_id: str, seq: int) -> JournalEntry | None:
    if seq < 1:  # entries are numbered from 1; a lane's entry 0 only says what it shares (`lane_base`)
        return None
    entry = txn.get(DB.JOURNAL, log_key(unit_prefix(mission_id, unit_id), seq), JournalEntry)
    if entry is None:
        base = lane_base(txn, mission_id, unit_id)
        if base is not None and seq <= base.upto:
            return journal_get(txn, mission_id, base.lane, seq)
    return entry


def journal_put(txn: Txn, mission_id: str, unit_id: str, entry: JournalEntry) -> None:
    txn.put(DB.JOURNAL, log_key(unit_prefix(mission_id, unit_id), entry.seq), entry)


def lane_base(txn: Txn, mission_id: str, unit_id: str) -> LaneBase | None:
    """The lane this one begins as, and up to which entry (None: it holds all its entries itself)."""
    head = txn.get(DB.JOURNAL, log_key(unit_prefix(mission_id, unit_id), 0), JournalEntry)
    return head.base if head is not None else None


def share_lane(txn: Txn, mission_id: str, unit_id: str, base: LaneBase) -> None:
    """Begin lane `unit_id` as `base.lane` up to `base.upto`, sharing those entries instead of copying them.
    Entry `upto` is written to the lane too, so that its last entry is its own (`Txn.last_seq` finds it)."""
    if base.upto <= 0:
        return
    last = journal_get(txn, mission_id, base.lane, base.upto)
    if last is None:
        raise CorruptRecordError(
            DB.JOURNAL.value,
            log_key(unit_prefix(mission_id, base.lane), base.upto),
            f"lane {unit_id} cannot begin as lane {base.lane} up to entry {base.upto}: that entry is missing",
        )
    journal_put(txn, mission_id, unit_id, JournalEntry(seq=0, kind=LANE_BASE, fingerprint="", base=base))
    journal_put(txn, mission_id, unit_id, last)


def journal_entries(
    txn: Txn, mission_id: str, unit_id: str, upto: int | None = None, after: int = 0
) -> list[JournalEntry]:
    own = txn.log_values(DB.JOURNAL, unit_prefix(mission_id, unit_id), JournalEntry, after=after, upto=upto)
    base = lane_base(txn, mission_id, unit_id)
    if base is None or after >= base.upto:
        return own
    shared = journal_entries(
        txn, mission_id, base.lane, upto=base.upto if upto is None else min(base.upto, upto), after=after
    )
    mine = {e.seq: e for e in own if e.seq <= base.upto}
    return [mine.get(e.seq, e) for e in shared] + [e for e in own if e.seq > base.upto]


def own_entries(txn: Txn, mission_id: str, unit_id: str, after: int = 0) -> Iterator[JournalEntry]:
    """The entries a lane holds itself (not those it shares with the lane it begins as), one at a time."""
    for _, entry in txn.read_log(DB.JOURNAL, unit_prefix(mission_id, unit_id), JournalEntry, after=after):
        yield entry


def journal_scan(txn: Txn, mission_id: str, unit_id: str) -> Iterator[JournalEntry]:
    """A lane's entries one at a time, for a question about the whole lane that need not hold it."""
    for _, entry in _scan(txn, mission_id, unit_id, JournalEntry):
        yield entry


class EntryKind(msgspec.Struct, frozen=True, gc=False):
    """What an entry is, without its result: read at a fraction of a whole entry's cost."""

    kind: str
    tool_class: str | None = None


def journal_kinds(txn: Txn, mission_id: str, unit_id: str, upto: int) -> Iterator[EntryKind]:
    """What each of a lane's entries up to `upto` is (a restore asks whether any changed files)."""
    for seq, entry in _scan(txn, mission_id, unit_id, EntryKind):
        if seq > upto:
            return
        yield entry


def _scan(txn: Txn, mission_id: str, unit_id: str, type_: type[T]) -> Iterator[tuple[int, T]]:
    base = lane_base(txn, mission_id, unit_id)
    prefix = unit_prefix(mission_id, unit_id)
    if base is None:
        yield from txn.read_log(DB.JOURNAL, prefix, type_)
        return
    mine = dict(txn.read_log(DB.JOURNAL, prefix, type_, upto=base.upto))
    for seq, entry in _scan(txn, mission_id, base.lane, type_):
        if seq > base.upto:
            break
        yield seq, mine.get(seq, entry)
    yield from txn.read_log(DB.JOURNAL, prefix, type_, after=base.upto)


def journal_last_done(txn: Txn, mission_id: str, unit_id: str, kind: str) -> JournalEntry | None:
    """The newest entry of the lane of this kind whose result is recorded, read from the end backwards."""
    return next((e for e in _newest_first(txn, mission_id, unit_id) if e.kind == kind and e.phase == "done"), None)


def _newest_first(txn: Txn, mission_id: str, unit_id: str, upto: int | None = None) -> Iterator[JournalEntry]:
    """A lane's entries (up to `upto`) from its last backwards, what it shares read in the same order."""
    base = lane_base(txn, mission_id, unit_id)
    shared = base.upto if base is not None else 0
    prefix = unit_prefix(mission_id, unit_id)
    mine: dict[int, JournalEntry] = {}
    for key, raw in txn.scan_raw(DB.JOURNAL, prefix, reverse=True):
        seq = int.from_bytes(key[len(prefix) :], "big")
        if seq == 0:
            break
        if upto is not None and seq > upto:
            continue
        entry = decode_value(DB.JOURNAL.value, key, raw, JournalEntry)
        if seq > shared:
            yield entry
        else:
            mine[seq] = entry
    if base is not None:
        for entry in _newest_first(txn, mission_id, base.lane, min(shared, upto if upto is not None else shared)):
            yield mine.pop(entry.seq, entry)


def journal_lanes(txn: Txn, mission_id: str) -> list[str]:
    """Every journal lane of the mission, jumping from one lane's keys to the next."""
    prefix = mission_prefix(mission_id)
    found: list[str] = []
    start: bytes | None = None
    while True:
        key = next((k for k, _ in txn.scan_raw(DB.JOURNAL, prefix, start=start)), None)
        if key is None or len(key) < len(prefix) + SEQ_BYTES + 1:
            return found
        name = key[len(prefix) : -(SEQ_BYTES + 1)]
        found.append(name.decode())
        start = prefix + name + b"\x01"  # past every key of this lane (`name NUL seq`)


def journal_truncate(txn: Txn, mission_id: str, unit_id: str, after: int) -> int:
    """Drop a unit's entries past `after` (used when a restore rewinds a unit); returns how many."""
    prefix = unit_prefix(mission_id, unit_id)
    keys = [k for k, _ in txn.scan_raw(DB.JOURNAL, prefix, start=log_key(prefix, after + 1))]
    for key in keys:
        txn.delete(DB.JOURNAL, key)
    return len(keys)


# -- checkpoints and restore points -----------------------------------------------------------------
def head(txn: Txn, mission_id: str) -> str | None:
    digest = txn.get(DB.HEADS, mission_id.encode(), str)
    return digest or None


def get_checkpoint(txn: Txn, digest: str) -> CheckpointManifest:
    manifest = txn.get_object(digest, CheckpointManifest)
    if manifest is None:
        raise CorruptRecordError(DB.BLOBS.value, digest.encode(), "checkpoint manifest is missing")
    return manifest


def parent_checkpoint(txn: Txn, manifest: CheckpointManifest) -> CheckpointManifest | None:
    """The checkpoint before `manifest`, or None where its chain starts: it has no parent, or retention
    removed it (its mission's `retired`). Any other missing parent is a CorruptRecordError."""
    if not manifest.parent:
        return None
    found = txn.get_object(manifest.parent, CheckpointManifest)
    if found is None and manifest.parent in retired(txn, manifest.mission_id):
        return None
    if found is None:
        raise CorruptRecordError(DB.BLOBS.value, manifest.parent.encode(), "checkpoint manifest is missing")
    return found


def retired(txn: Txn, mission_id: str) -> frozenset[str]:
    """The checkpoints of the mission that retention removed and kept ones name as their parent."""
    record = txn.get(DB.MISSIONS, mission_id.encode(), MissionRecord)
    return frozenset(record.retired) if record is not None else frozenset()


def head_checkpoint(txn: Txn, mission_id: str) -> CheckpointManifest | None:
    digest = head(txn, mission_id)
    return None if digest is None else get_checkpoint(txn, digest)


def commit_checkpoint(txn: Txn, manifest: CheckpointManifest, *, label: str = "") -> RestorePoint:
    """Store the manifest, move HEAD to it and record a restore point — one transaction."""
    digest = txn.put_object(manifest)
    txn.put(DB.HEADS, manifest.mission_id.encode(), digest)
    prefix = mission_prefix(manifest.mission_id)
    number = txn.last_seq(DB.POINTS, prefix) + 1
    point = RestorePoint(
        id=f"p{number}",
        mission_id=manifest.mission_id,
        checkpoint=digest,
        reason=manifest.reason,
        created_at=manifest.created_at,
        label=label,
    )
    txn.put(DB.POINTS, log_key(prefix, number), point, overwrite=False)
    return point


def restore_points(txn: Txn, mission_id: str) -> list[RestorePoint]:
    return txn.log_values(DB.POINTS, mission_prefix(mission_id), RestorePoint)


def get_point(txn: Txn, mission_id: str, point_id: str) -> RestorePoint:
    number = point_id.removeprefix("p")
    if number.isdigit():
        point = txn.get(DB.POINTS, log_key(mission_prefix(mission_id), int(number)), RestorePoint)
        if point is not None:
            return point
    raise NotFoundError(f"mission {mission_id} has no restore point {point_id!r}")


# What a change of a mission's records is named by, where a store says which missions a commit changed
# (PostgreSQL's NOTIFY payload): `kind/mission`. A subscriber names the kinds it waits for.
CONTROL_CHANGES = DB.CONTROL.value  # a pause, an answer, a cancel
LEASE_CHANGES = DB.LEASES.value  # a unit's lease: an offer claimed, a heartbeat, a completion
HOST_LEASE_CHANGES = "hostlease"  # the mission's host lease (stored in DB.LEASES under the mission id alone)
_OF_NO_MISSION = frozenset({DB.META, DB.BLOBS, DB.PROVIDERS})


def change_token(db: DB, key: bytes) -> str | None:
    """What a write of `key` in `db` changed: `kind/mission`; None for records of no mission."""
    if db in _OF_NO_MISSION:
        return None
    mission, sep, _ = key.partition(b"\x00")
    kind = HOST_LEASE_CHANGES if db is DB.LEASES and not sep else db.value
    return f"{kind}/{mission.decode(errors='replace')}"
