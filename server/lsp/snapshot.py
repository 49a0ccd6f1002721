"""What the server knows about a mission at one store transaction: `MissionView`, read in one short read.

The watcher, the requests and the features all read missions through `read_views`/`read_view`, so they
agree on what "a mission's state" is. Checkpoint manifests and task graphs are content-addressed and
immutable, so they are cached by digest and re-read only when HEAD moves. Depends on storage and the
engine's `host_alive` only; knows nothing of LSP.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import msgspec

from keel.protocol.records import CheckpointManifest, JournalEntry, MissionRecord, UnitMark
from keel.protocol.spec import UnitSpec
from keel.protocol.states import UnitState
from keel.server.engine.hostlock import host_alive
from keel.server.engine.unitview import unit_states
from keel.storage import DB, Store, Txn
from keel.storage import missions as m
from keel.storage.keys import mission_prefix


class UnitView(msgspec.Struct, frozen=True):
    id: str
    title: str
    state: UnitState
    after: tuple[str, ...] = ()
    attempts: int = 0
    error: str = ""


class ModelUsage(msgspec.Struct, frozen=True):
    """Tokens a mission's model calls used, per provider (from the journal), and the model that served
    the newest call ("provider/model")."""

    tokens: dict[str, tuple[int, int]] = {}  # provider -> (prompt, completion)
    served_model: str = ""
    calls: int = 0


class MissionView(msgspec.Struct, frozen=True):
    """A mission as of one read: its record, its units (from HEAD), and counters that change with it."""

    record: MissionRecord
    units: tuple[UnitView, ...]
    head: str = ""
    events_seq: int = 0
    points: int = 0
    host_alive: bool = False
    stranded: bool = False
    pending_answer: bool = False  # an answer is recorded that no host has applied yet
    head_reason: str = ""  # why HEAD was written: "restored to p3", "forked from ID p2", "unit succeeded: u1"
    usage: ModelUsage = ModelUsage()
    failovers: int = 0


class _Cache:
    """Immutable blobs by digest (manifests, graphs); bounded so a long-lived server does not grow."""

    def __init__(self, limit: int = 512) -> None:
        self._items: dict[str, Any] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, digest: str, load: Any) -> Any:
        with self._lock:
            if digest in self._items:
                return self._items[digest]
        value = load()
        with self._lock:
            if len(self._items) >= self._limit:
                self._items.clear()
            self._items[digest] = value
        return value


_cache = _Cache()


def read_views(store: Store) -> dict[str, MissionView]:
    """Every mission, in one read transaction (ordered by id, which sorts by creation time)."""
    return read_views_at(store)[1]


def read_views_at(store: Store) -> tuple[int, dict[str, MissionView]]:
    """`read_views` with the id of the committed transaction they are as new as (`Txn.snapshot_id`, asked
    first): a read can trail `Store.txn_id()` for a moment, so a watcher that took the store's id for what
    its read saw would answer from a picture that misses the newest commit."""

    def read(txn: Txn) -> tuple[int, dict[str, MissionView]]:
        seen = txn.snapshot_id()
        return seen, {r.id: _view(store, txn, r) for r in m.list_missions(txn)}

    seen, views = store.read(read)
    return seen, {mid: msgspec.structs.replace(v, host_alive=host_alive(v.record)) for mid, v in views.items()}


def read_view(store: Store, text: str) -> MissionView:
    """One mission by full id or unique prefix; NotFoundError names the id."""
    view = store.read(lambda txn: _view(store, txn, m.get_mission(txn, m.resolve_mission_id(txn, text))))
    return msgspec.structs.replace(view, host_alive=host_alive(view.record))


def resolve(store: Store, text: str) -> str:
    return store.read(lambda txn: m.resolve_mission_id(txn, text))


def _view(store: Store, txn: Txn, record: MissionRecord) -> MissionView:
    prefix = mission_prefix(record.id)
    digest = m.head(txn, record.id) or ""
    manifest: CheckpointManifest | None = _cache.get(digest, lambda: m.get_checkpoint(txn, digest)) if digest else None
    graph = list(record.spec.units)
    if manifest is not None and manifest.graph:
        graph = _cache.get(manifest.graph, lambda: txn.get_object(manifest.graph, list[UnitSpec])) or graph
    marks: dict[str, UnitMark] = manifest.units if manifest is not None else {}
    live = unit_states(txn, record.id)  # HEAD's marks, with units a live host started since shown running
    units = tuple(_unit(spec, marks.get(spec.id), live.get(spec.id)) for spec in graph)
    pending = any(c.action == "answer" for _, c in m.controls_after(txn, record.id, record.control_seen))
    return MissionView(
        record=record,
        units=units,
        head=digest,
        events_seq=txn.last_seq(DB.EVENTS, prefix),
        points=txn.last_seq(DB.POINTS, prefix),
        pending_answer=pending,
        head_reason=manifest.reason if manifest is not None else "",
        usage=_usages.read(store, txn, record.id),
        failovers=m.evidence_tally(txn, record.id).kinds.get("failover", 0),
    )


def _unit(spec: UnitSpec, mark: UnitMark | None, live: str | None) -> UnitView:
    state = UnitState(live) if live else mark.state if mark is not None else UnitState.PENDING
    if mark is None:
        return UnitView(id=spec.id, title=spec.title, state=state, after=spec.after)
    return UnitView(
        id=spec.id, title=spec.title, state=state, after=spec.after, attempts=mark.attempts, error=mark.error
    )


class _Tokens:
    """One mission's model calls counted so far: how far each lane has been read, and the sums."""

    def __init__(self) -> None:
        self.read: dict[str, int] = {}
        self.tokens: dict[str, tuple[int, int]] = {}
        self.newest, self.served, self.calls = -1.0, "", 0

    def add(self, entry: JournalEntry) -> None:
        if entry.kind != "model/complete" or entry.phase != "done" or not isinstance(entry.result, dict):
            return
        usage = entry.result.get("usage") or {}
        provider = str(entry.result.get("provider") or "")
        prompt, completion = self.tokens.get(provider, (0, 0))
        self.tokens[provider] = (
            prompt + int(usage.get("prompt_tokens", 0)),
            completion + int(usage.get("completion_tokens", 0)),
        )
        self.calls += 1
        if entry.at >= self.newest:
            self.newest, self.served = entry.at, f"{provider}/{entry.result.get('model', '')}".strip("/")


class _Usages:
    """Tokens of every journaled model call of each mission (each entry once, under the lane that recorded
    it: a restored lane's shared beginning is its old lane's), read incrementally: a view reads only the
    entries recorded since the last one, so watching a long mission costs what it adds. A model call is
    journaled once, done (never an intent that changes later). Per store, bounded."""

    def __init__(self, limit: int = 256) -> None:
        self._stores: weakref.WeakKeyDictionary[Store, dict[str, _Tokens]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._limit = limit

    def read(self, store: Store, txn: Txn, mission_id: str) -> ModelUsage:
        with self._lock:
            missions = self._stores.setdefault(store, {})
            if len(missions) >= self._limit and mission_id not in missions:
                missions.clear()
            tally = missions.setdefault(mission_id, _Tokens())
            for lane in m.journal_lanes(txn, mission_id):
                shared = m.lane_base(txn, mission_id, lane)
                for entry in m.own_entries(txn, mission_id, lane, after=tally.read.get(lane, 0)):
                    if shared is None or entry.seq > shared.upto:
                        tally.add(entry)
                    tally.read[lane] = entry.seq
            return ModelUsage(tokens=dict(tally.tokens), served_model=tally.served, calls=tally.calls)


_usages = _Usages()
