"""Reading a mission's activity in order, a page at a time, in one short read transaction per page.

Sources: every journal lane of the mission (one per unit, and `unit#epoch` after a restore), the
evidence, event and control logs. Each is read past its own position and the sources are merged by time
(each keeps its own order), so the cursor — every source's position, plus the intents still waiting for
their result — always marks a prefix of what was read. An intent is shown as soon as it is recorded and
again (same id) when its result is. A lane's entries are shown once, under the lane that recorded them: a
restored lane's shared beginning (or, from an older keel, its copies) is not shown again. Each page reads
from each source only a little more than it shows.
Depends on storage and protocol only.
"""

from __future__ import annotations

import base64
import heapq
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from keel.protocol.errors import KeelError, NotFoundError
from keel.protocol.records import Event, Evidence, JournalEntry, MissionRecord
from keel.protocol.states import MissionState
from keel.server.activity.items import (
    KINDS,
    ActivityItem,
    Prices,
    control_item,
    event_item,
    evidence_item,
    journal_item,
    unit_of,
)
from keel.server.activity.starts import Why, why_started
from keel.storage import DB, Store, Txn
from keel.storage import missions as m
from keel.storage.keys import SEQ_BYTES, mission_prefix, unit_prefix
from keel.storage.txn import decode_value

T = TypeVar("T")
DEFAULT_LIMIT = 200
MAX_LIMIT = 2000


class ActivityError(KeelError):
    """A bad activity request (cursor, kind, limit), named plainly."""


@dataclass
class Cursor:
    lanes: dict[str, int] = field(default_factory=dict)
    open: set[tuple[str, int]] = field(default_factory=set)  # intents shown, results not yet
    evidence: int = 0
    events: int = 0
    control: int = 0

    def encode(self) -> str:
        data = {
            "j": self.lanes,
            "o": sorted(self.open),
            "v": self.evidence,
            "e": self.events,
            "c": self.control,
        }
        return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        if not text:
            return cls()
        try:
            data = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            return cls(
                lanes={str(k): int(v) for k, v in data["j"].items()},
                open={(str(lane), int(seq)) for lane, seq in data["o"]},
                evidence=int(data["v"]),
                events=int(data["e"]),
                control=int(data["c"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ActivityError(f"activity cursor {text[:40]!r} is not one keel gave out") from None


@dataclass(frozen=True)
class Filter:
    unit: str = ""
    kinds: frozenset[str] = frozenset()
    failures_only: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(self.kinds - set(KINDS))
        if unknown:
            raise ActivityError(f"unknown activity kind {', '.join(unknown)} (known: {', '.join(KINDS)})")

    def accepts(self, item: ActivityItem) -> bool:
        return (
            (not self.unit or item.unit == self.unit)
            and (not self.kinds or item.kind in self.kinds)
            and (item.failed or not self.failures_only)
        )


class ActivityPage(msgspec.Struct, frozen=True, rename="camel"):
    mission: str
    state: MissionState
    items: tuple[ActivityItem, ...]
    cursor: str  # pass it back to get what comes after
    more: bool  # more items are recorded already (ask again at once)


def read_page(
    store: Store,
    mission: str,
    *,
    cursor: str = "",
    limit: int = DEFAULT_LIMIT,
    filter: Filter = Filter(),
    prices: Prices | None = None,
) -> ActivityPage:
    if not isinstance(limit, int) or not 0 < limit <= MAX_LIMIT:
        raise ActivityError(f"activity limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}")
    start = Cursor.decode(cursor)
    return store.read(lambda txn: page_txn(txn, mission, start, limit, filter, prices))


def page_txn(txn: Txn, mission: str, cur: Cursor, limit: int, filter: Filter, prices: Prices | None) -> ActivityPage:
    mid = m.resolve_mission_id(txn, mission)
    record = m.get_mission(txn, mid)
    if filter.unit and not _unit_known(txn, record, filter.unit):
        raise NotFoundError(f"mission {mid} has no unit {filter.unit!r}")
    items: list[ActivityItem] = []
    more = False
    for _, _, source, position, item in _merged(txn, record, cur, prices, window_for(limit)):
        if source == STOP:
            more = True
            break
        if item is not None and filter.accepts(item):
            if len(items) >= limit:
                more = True
                break
            items.append(item)
        _advance(cur, source, position, item)
    return ActivityPage(mission=mid, state=record.state, items=tuple(items), cursor=cur.encode(), more=more)


def end_cursor(store: Store, mission: str) -> str:
    """A cursor past everything recorded so far (a follower that wants only what comes next)."""

    def read(txn: Txn) -> str:
        mid = m.resolve_mission_id(txn, mission)
        prefix = mission_prefix(mid)
        cur = Cursor(
            evidence=txn.last_seq(DB.EVIDENCE, prefix),
            events=txn.last_seq(DB.EVENTS, prefix),
            control=txn.last_seq(DB.CONTROL, prefix),
        )
        for lane in m.journal_lanes(txn, mid):
            last = txn.last_seq(DB.JOURNAL, unit_prefix(mid, lane))
            cur.lanes[lane] = last
            entry = m.journal_get(txn, mid, lane, last)
            if entry is not None and entry.phase == "intent":
                cur.open.add((lane, last))
        return cur.encode()

    return store.read(read)


# -- merging the sources --------------------------------------------------------------------------------
Row = tuple[float, int, str, int, "ActivityItem | None"]  # (at, tie, source, position, item)
STOP = "stop"  # a row past the last one read of a source that has more: the page ends there
MARGIN = 16  # records read per source and page past the limit: a page costs what it shows, not what follows


def window_for(limit: int) -> int:
    return limit + MARGIN


def _merged(txn: Txn, record: MissionRecord, cur: Cursor, prices: Prices | None, window: int) -> Iterator[Row]:
    """Every source's next `window` records, merged by time. A source that has more than that ends in a
    STOP row after its last record read: what comes after it cannot be ordered before reading further."""
    mid = record.id
    all_lanes = m.journal_lanes(txn, mid)
    fresh = {lane: _first(m.own_entries(txn, mid, lane, cur.lanes.get(lane, 0)), window) for lane in all_lanes}
    evidence = _first(m.evidence_after(txn, mid, cur.evidence), window)
    linked: dict[tuple[str, int], list[Evidence]] = {}
    for _, item in evidence[0]:
        if item.lane:
            linked.setdefault((item.lane, item.seq), []).append(item)
    sources: list[list[Row]] = []
    for n, lane in enumerate(all_lanes):
        entries, more = fresh[lane]
        rows = [_journal_row(txn, record, lane, e, linked, prices, n) for e in entries]
        sources.append(_stopped(rows, more))
    sources.append(_reopened(txn, record, cur, linked, prices))
    entry_at = {(lane, e.seq): e.at for lane in all_lanes for e in fresh[lane][0]}
    rows = [  # evidence of a journal entry right after it (it is recorded with it)
        (_evidence_at(txn, mid, ev, entry_at), 1_000_000, "v", seq, None if _folded(ev) else evidence_item(seq, ev))
        for seq, ev in evidence[0]
    ]
    sources.append(_stopped(rows, evidence[1]))
    events = _first(m.events_after(txn, mid, cur.events), window)
    sources.append(_stopped(list(_events(txn, record, events[0])), events[1]))
    controls = _first(m.controls_after(txn, mid, cur.control), window)
    rows = [(c.at, 1_000_002, "c", seq, control_item(seq, c)) for seq, c in controls[0]]
    sources.append(_stopped(rows, controls[1]))
    return heapq.merge(*sources, key=lambda row: (row[0], row[1]))


def _first(items: Iterable[T], count: int) -> tuple[list[T], bool]:
    """The first `count` of `items`, and whether there are more."""
    it = iter(items)
    taken = list(itertools.islice(it, count))
    return taken, next(it, None) is not None


def _stopped(rows: list[Row], more: bool) -> list[Row]:
    if more and rows:
        rows.append((max(row[0] for row in rows), sys.maxsize, STOP, 0, None))
    return rows


def _evidence_at(txn: Txn, mid: str, item: Evidence, entry_at: dict[tuple[str, int], float]) -> float:
    """Evidence is shown at its journal entry's time (it is recorded with it)."""
    if not item.lane:
        return item.at
    at = entry_at.get((item.lane, item.seq))
    if at is None:
        entry = m.journal_get(txn, mid, item.lane, item.seq)
        at = entry.at if entry is not None else item.at
    return at


def _folded(item: Evidence) -> bool:
    """Evidence shown as part of its journal entry's item."""
    return (
        bool(item.lane)
        and item.kind not in ("verification", "failover", "reexecuted", "merge-conflict")
        and not (item.kind == "answer" and isinstance(item.data, dict) and item.data.get("kind") != "human/ask")
    )


def _journal_row(
    txn: Txn,
    record: MissionRecord,
    lane: str,
    entry: JournalEntry,
    linked: dict[tuple[str, int], list[Evidence]],
    prices: Prices | None,
    tie: int,
) -> Row:
    source = f"j:{lane}"
    if _copy_of_earlier_lane(txn, record.id, lane, entry):
        return entry.at, tie, source, entry.seq, None
    copied = bool(record.forked_from) and entry.at < record.created_at
    item = journal_item(entry, lane, linked.get((lane, entry.seq), []), copied=copied, prices=prices)
    return entry.at, tie, source, entry.seq, item


def _copy_of_earlier_lane(txn: Txn, mid: str, lane: str, entry: JournalEntry) -> bool:
    """A restore gives an unfinished unit a new lane holding copies of its entries up to the point."""
    unit, _, epoch = lane.partition("#")
    if not epoch.isdigit():
        return False
    for earlier in [unit] + [f"{unit}#{e}" for e in range(1, int(epoch))]:
        if m.journal_get(txn, mid, earlier, entry.seq) == entry:
            return True
    return False


def _reopened(
    txn: Txn, record: MissionRecord, cur: Cursor, linked: dict[tuple[str, int], list[Evidence]], prices: Prices | None
) -> list[Row]:
    """Intents shown earlier whose result is recorded now: shown again, with the same id."""
    rows: list[Row] = []
    for lane, seq in sorted(cur.open):
        entry = m.journal_get(txn, record.id, lane, seq)
        if entry is None or entry.phase == "intent":
            continue
        item = journal_item(entry, lane, linked.get((lane, seq), []), copied=False, prices=prices)
        rows.append((entry.at, 999_999, f"o:{lane}:{seq}", seq, item))
    rows.sort(key=lambda row: row[0])
    return rows


def _events(txn: Txn, record: MissionRecord, events: list[tuple[int, Event]]) -> Iterator[Row]:
    last_wait = _last_wait(txn, record.id) if record.question is not None else 0
    for seq, event in events:
        question = record.question.text if record.question is not None and seq == last_wait else ""
        replayed, why, again = 0, "first", 0
        if event.kind == "unit" and event.state == "running" and event.unit:
            replayed = _steps_before(txn, record.id, event.unit, event.at)
            why = _why_started(txn, record.id, seq, event.unit) if replayed else "first"
            again = _in_doubt_before(txn, record.id, event.unit, event.at) if why == "host-lost" else 0
        item = event_item(seq, event, question=question, replayed=replayed, why=why, run_again=again)
        yield event.at, 1_000_001, "e", seq, item


ANSWER_SKEW_S = 300.0  # evidence is logged in time order up to clocks this far apart (machines sharing a store)


def _why_started(txn: Txn, mid: str, seq: int, unit: str) -> Why:
    """Why the unit starts at event `seq` (see starts.why_started). Reads back from this start to the unit's
    previous one only, and the answers logged since then: what it shows, not the mission's history."""
    since: list[Event] = []
    for event in _newest_first(txn, DB.EVENTS, mid, Event, before=seq):
        since.append(event)
        if event.kind == "unit" and event.unit == unit and event.state == "running":
            break  # the unit's previous start: nothing before it changes the answer
    since.reverse()
    answers: list[float] = []
    if since and since[0].kind == "unit" and since[0].unit == unit:
        for item in _newest_first(txn, DB.EVIDENCE, mid, Evidence):
            if item.at < since[0].at - ANSWER_SKEW_S:
                break
            if item.kind == "answer" and item.unit == unit:
                answers.append(item.at)
    return why_started(since, unit, answers)


def _newest_first(txn: Txn, db: DB, mid: str, type_: type[T], before: int | None = None) -> Iterator[T]:
    """A mission log's records from its newest back (those numbered below `before`, when given), each decoded
    only when reached."""
    prefix = mission_prefix(mid)
    for key, raw in txn.scan_raw(db, prefix, reverse=True):
        if len(key) - len(prefix) != SEQ_BYTES:
            continue
        if before is not None and int.from_bytes(key[-SEQ_BYTES:], "big") >= before:
            continue
        yield decode_value(db.value, key, raw, type_)


def _last_wait(txn: Txn, mid: str) -> int:
    """The newest event that says the mission waits for a person (its question is the record's)."""
    for key, event in txn.scan(DB.EVENTS, mission_prefix(mid), Event, reverse=True):
        if event.kind == "state" and event.state == "waiting_input":
            return int.from_bytes(key[-SEQ_BYTES:], "big")
    return 0


def _in_doubt_before(txn: Txn, mid: str, unit: str, at: float) -> int:
    """Effects the unit's newest lane started before `at` without a recorded result: run again (or
    reconciled) by the new host, since the journal cannot answer them."""
    return sum(1 for e in _recorded_before(txn, mid, unit, at) if e.phase == "intent")


def _steps_before(txn: Txn, mid: str, unit: str, at: float) -> int:
    """How many entries the unit's newest lane holds from before `at`: what a start at `at` replays."""
    return sum(1 for e in _recorded_before(txn, mid, unit, at) if e.phase == "done")


def _recorded_before(txn: Txn, mid: str, unit: str, at: float) -> Iterator[JournalEntry]:
    """The unit's newest lane's entries up to the first one recorded at `at` or later (a lane is written in
    time order): what a start at `at` found, read no further than that."""
    newest = _newest_lane(txn, mid, unit)
    if newest is None:
        return
    for entry in m.journal_scan(txn, mid, newest):
        if entry.at >= at:
            return
        yield entry


def _newest_lane(txn: Txn, mid: str, unit: str) -> str | None:
    names = [lane for lane in m.journal_lanes(txn, mid) if unit_of(lane) == unit]
    return max(names, key=lambda lane: int(lane.partition("#")[2] or 0)) if names else None


def _advance(cur: Cursor, source: str, position: int, item: ActivityItem | None) -> None:
    if source.startswith("j:"):
        lane = source[2:]
        cur.lanes[lane] = position
        if item is not None and item.effect == "intent only":
            cur.open.add((lane, position))
    elif source.startswith("o:"):
        lane, _, seq = source[2:].rpartition(":")
        cur.open.discard((lane, int(seq)))
    elif source == "v":
        cur.evidence = position
    elif source == "e":
        cur.events = position
    elif source == "c":
        cur.control = position


def _unit_known(txn: Txn, record: MissionRecord, unit: str) -> bool:
    if any(u.id == unit for u in record.spec.units):
        return True
    manifest = m.head_checkpoint(txn, record.id)
    return manifest is not None and unit in manifest.units
