"""What the server knows about a mission at one store transaction: `MissionView`, read in one short read.

The watcher, the requests and the features all read missions through `read_views`/`read_view`, so they
agree on what "a mission's state" is. Checkpoint manifests and task graphs are content-addressed and
immutable, so they are cached by digest and re-read only when HEAD moves. Depends on storage and the
engine's `host_alive` only; knows nothing of LSP.
"""

from __future__ import annotations

import threading
from typing import Any

import msgspec

from keel.protocol.records import CheckpointManifest, JournalEntry, MissionRecord, UnitMark
from keel.protocol.spec import UnitSpec
from keel.protocol.states import UnitState
from keel.server.engine.control import unit_states
from keel.server.engine.hostlock import host_alive
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
    views = store.read(lambda txn: {r.id: _view(txn, r) for r in m.list_missions(txn)})
    return {mid: msgspec.structs.replace(v, host_alive=host_alive(v.record)) for mid, v in views.items()}


def read_view(store: Store, text: str) -> MissionView:
    """One mission by full id or unique prefix; NotFoundError names the id."""
    view = store.read(lambda txn: _view(txn, m.get_mission(txn, m.resolve_mission_id(txn, text))))
    return msgspec.structs.replace(view, host_alive=host_alive(view.record))


def resolve(store: Store, text: str) -> str:
    return store.read(lambda txn: m.resolve_mission_id(txn, text))


def _view(txn: Txn, record: MissionRecord) -> MissionView:
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
        usage=_usage(txn, record.id),
        failovers=sum(1 for _, e in m.evidence_after(txn, record.id) if e.kind == "failover"),
    )


def _unit(spec: UnitSpec, mark: UnitMark | None, live: str | None) -> UnitView:
    state = UnitState(live) if live else mark.state if mark is not None else UnitState.PENDING
    if mark is None:
        return UnitView(id=spec.id, title=spec.title, state=state, after=spec.after)
    return UnitView(
        id=spec.id, title=spec.title, state=state, after=spec.after, attempts=mark.attempts, error=mark.error
    )


def _usage(txn: Txn, mission_id: str) -> ModelUsage:
    """Tokens of every journaled model call of the mission (all lanes), and the newest call's model."""
    tokens: dict[str, tuple[int, int]] = {}
    newest, served, calls = -1.0, "", 0
    for _, entry in txn.scan(DB.JOURNAL, mission_prefix(mission_id), JournalEntry):
        if entry.kind != "model/complete" or entry.phase != "done" or not isinstance(entry.result, dict):
            continue
        usage = entry.result.get("usage") or {}
        provider = str(entry.result.get("provider") or "")
        prompt, completion = tokens.get(provider, (0, 0))
        tokens[provider] = (
            prompt + int(usage.get("prompt_tokens", 0)),
            completion + int(usage.get("completion_tokens", 0)),
        )
        calls += 1
        if entry.at >= newest:
            newest, served = entry.at, f"{provider}/{entry.result.get('model', '')}".strip("/")
    return ModelUsage(tokens=tokens, served_model=served, calls=calls)
