"""LSP payloads, built from keel's msgspec records in this one place (docs/lsp.md is the contract).

Payload types are msgspec Structs with camelCase field names; `to_json` turns them into the plain
values pygls sends. Nothing here reads the store or talks to a client.
"""

from __future__ import annotations

from typing import Any

import msgspec

from keel.protocol.records import Event, RestorePoint, UnitLease
from keel.protocol.states import LeaseState, MissionState, UnitState
from keel.server.lsp.snapshot import MissionView
from keel.server.providers.health import HealthState

_DONE = frozenset({UnitState.SUCCEEDED})


class QuestionPayload(msgspec.Struct, frozen=True, rename="camel"):
    unit: str
    seq: int
    text: str
    choices: tuple[str, ...]
    kind: str


class UnitCounts(msgspec.Struct, frozen=True, rename="camel"):
    total: int
    done: int
    running: int
    failed: int
    pending: int


class HostPayload(msgspec.Struct, frozen=True, rename="camel"):
    host_id: str
    pid: int
    hostname: str
    alive: bool


class ForkOrigin(msgspec.Struct, frozen=True, rename="camel"):
    mission: str
    point: str


class UsagePayload(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """A mission's model use: tokens journaled, their price where the provider has one configured
    (`cost` in `currency` units; None when no price is known; `currency` lists the currencies when the
    priced providers differ), the model that served the newest call and how many failovers the hosts
    recorded."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    served_model: str = ""
    failovers: int = 0
    cost: float | None = None
    currency: str = ""


Prices = dict[str, tuple[float, float]]  # provider -> (input, output) per million tokens
Currencies = dict[str, str]  # priced provider -> currency


class MissionSummary(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    id: str
    name: str
    state: MissionState
    units: UnitCounts
    percentage: int
    stranded: bool
    mission_file: str
    workspace: str
    restore_points: int
    created_at: float
    updated_at: float
    pause_reason: str | None = None
    question: QuestionPayload | None = None
    error: str | None = None
    current_unit: str | None = None
    current_unit_title: str | None = None
    host: HostPayload | None = None
    head: str | None = None
    forked_from: ForkOrigin | None = None
    pause_note: str | None = None  # why a mission is paused when nobody paused it: "restored to p3", "forked at p2"
    usage: UsagePayload | None = None


class UnitPayload(msgspec.Struct, frozen=True, rename="camel"):
    id: str
    title: str
    state: UnitState
    after: tuple[str, ...]
    attempts: int
    error: str


class EventPayload(msgspec.Struct, frozen=True, rename="camel"):
    seq: int
    kind: str
    at: float
    unit: str
    state: str
    message: str


class MissionDetail(msgspec.Struct, frozen=True, rename="camel"):
    mission: MissionSummary
    goal: str
    units: tuple[UnitPayload, ...]
    events: tuple[EventPayload, ...]


class RestorePointPayload(msgspec.Struct, frozen=True, rename="camel"):
    id: str
    mission_id: str
    checkpoint: str
    reason: str
    created_at: float
    label: str


class SubagentPayload(msgspec.Struct, frozen=True, rename="camel"):
    unit: str
    lane: str
    state: LeaseState  # offered | running | expired (heartbeat stale or taken over) | returned | orphaned | done
    epoch: int
    pid: int
    host_id: str
    hostname: str
    heartbeat: float
    lease_age: float  # seconds since the last heartbeat
    ttl: float
    sandbox: str
    branch: str
    last_checkpoint: int
    merged: bool
    worker: str = ""  # the `keel worker` holding the unit ("": its mission host's own worker)
    why: str = ""  # what a returned unit needs of its mission host


def subagent(lease: UnitLease, now: float) -> SubagentPayload:
    from keel.storage.leases import expired

    return SubagentPayload(
        unit=lease.unit,
        lane=lease.lane,
        state=LeaseState.EXPIRED if expired(lease, now) else lease.state,
        epoch=lease.epoch,
        pid=lease.pid,
        host_id=lease.host_id,
        hostname=lease.hostname,
        heartbeat=lease.heartbeat,
        lease_age=round(max(0.0, now - lease.heartbeat), 3),
        ttl=lease.ttl_s,
        sandbox=lease.place.sandbox,
        branch=lease.place.branch,
        last_checkpoint=lease.place.last_checkpoint,
        merged=lease.place.merged,
        worker=lease.worker,
        why=lease.why,
    )


class FileChange(msgspec.Struct, frozen=True, rename="camel"):
    path: str
    status: str  # added | removed | modified | mode


class PointFile(msgspec.Struct, frozen=True, rename="camel"):
    mission_id: str
    point: str
    path: str
    exists: bool
    binary: bool
    text: str  # the file's text ("" when it does not exist or is binary)


def file_change(path: str, old: tuple[str, str] | None, new: tuple[str, str] | None) -> FileChange:
    status = "added" if old is None else "removed" if new is None else "mode" if old[1] == new[1] else "modified"
    return FileChange(path=path, status=status)


def point_file(mission_id: str, point: str, path: str, data: bytes | None) -> PointFile:
    try:
        text, binary = (data or b"").decode(), False
    except UnicodeDecodeError:
        text, binary = "", True
    return PointFile(mission_id=mission_id, point=point, path=path, exists=data is not None, binary=binary, text=text)


def summary(view: MissionView, prices: Prices | None = None, currencies: Currencies | None = None) -> MissionSummary:
    r = view.record
    counts = unit_counts(view)
    running = next((u for u in view.units if u.state == UnitState.RUNNING), None)
    q = r.question
    host = (
        None
        if r.host is None
        else HostPayload(host_id=r.host.host_id, pid=r.host.pid, hostname=r.host.hostname, alive=view.host_alive)
    )
    return MissionSummary(
        id=r.id,
        name=r.spec.name,
        state=r.state,
        units=counts,
        percentage=counts.done * 100 // counts.total if counts.total else 0,
        stranded=view.stranded,
        mission_file=r.mission_file,
        workspace=r.workspace,
        restore_points=view.points,
        created_at=r.created_at,
        updated_at=r.updated_at,
        pause_reason=r.pause_reason.value if r.pause_reason else None,
        question=None
        if q is None
        else QuestionPayload(
            unit=q.unit, seq=q.seq, text=q.text, choices=q.choices, kind=getattr(q, "kind", "human/ask")
        ),
        error=r.error or None,
        current_unit=running.id if running else None,
        current_unit_title=(running.title or None) if running else None,
        host=host,
        head=view.head or None,
        forked_from=_fork_origin(r.forked_from),
        pause_note=_pause_note(view),
        usage=usage(view, prices or {}, currencies or {}),
    )


def _fork_origin(text: str) -> ForkOrigin | None:
    mission, _, point = text.rpartition(":")
    return ForkOrigin(mission=mission, point=point) if mission and point else None


def _pause_note(view: MissionView) -> str | None:
    """A paused mission whose HEAD a restore or a fork wrote was paused by that, not by a person."""
    reason = view.head_reason
    if view.record.state.value != "paused":
        return None
    if reason.startswith("restored to "):
        return reason
    if reason.startswith("forked from "):
        return f"forked at {reason.rsplit(' ', 1)[-1]}"
    return None


def usage(view: MissionView, prices: Prices, currencies: Currencies | None = None) -> UsagePayload | None:
    u = view.usage
    if u.calls == 0 and view.failovers == 0:
        return None
    prompt = sum(p for p, _ in u.tokens.values())
    completion = sum(c for _, c in u.tokens.values())
    priced = [p for p in u.tokens if p in prices]
    cost = (
        round(sum(u.tokens[p][0] * prices[p][0] + u.tokens[p][1] * prices[p][1] for p in priced) / 1e6, 6)
        if priced
        else None
    )
    return UsagePayload(
        calls=u.calls,
        prompt_tokens=prompt,
        completion_tokens=completion,
        served_model=u.served_model,
        failovers=view.failovers,
        cost=cost,
        currency="/".join(sorted({(currencies or {}).get(p, "USD") for p in priced})),
    )


def unit_counts(view: MissionView) -> UnitCounts:
    states = [u.state for u in view.units]
    done = sum(s in _DONE for s in states)
    running = states.count(UnitState.RUNNING)
    failed = states.count(UnitState.FAILED)
    return UnitCounts(
        total=len(states), done=done, running=running, failed=failed, pending=len(states) - done - running - failed
    )


def detail(
    view: MissionView,
    events: list[tuple[int, Event]],
    prices: Prices | None = None,
    currencies: Currencies | None = None,
) -> MissionDetail:
    units = tuple(
        UnitPayload(id=u.id, title=u.title, state=u.state, after=u.after, attempts=u.attempts, error=u.error)
        for u in view.units
    )
    return MissionDetail(
        mission=summary(view, prices, currencies),
        goal=view.record.spec.goal,
        units=units,
        events=tuple(event(seq, e) for seq, e in events),
    )


def event(seq: int, e: Event) -> EventPayload:
    return EventPayload(seq=seq, kind=e.kind, at=e.at, unit=e.unit, state=e.state, message=e.message)


def restore_point(p: RestorePoint) -> RestorePointPayload:
    return RestorePointPayload(
        id=p.id,
        mission_id=p.mission_id,
        checkpoint=p.checkpoint,
        reason=p.reason,
        created_at=p.created_at,
        label=p.label,
    )


class ProviderEndpointPayload(msgspec.Struct, frozen=True, rename="camel"):
    """One endpoint of one provider in `keel/providers` (docs/lsp.md)."""

    provider: str
    endpoint: str
    url: str
    model: str
    state: HealthState
    active: bool
    configured: bool
    kind: str = ""
    key_source: str = ""
    consecutive_failures: int = 0
    last_error: str = ""
    last_error_kind: str = ""
    last_error_at: float = 0.0
    last_success_at: float = 0.0
    cooldown_until: float = 0.0
    last_failover: str = ""
    last_failover_at: float = 0.0
    updated_at: float = 0.0
    called: bool = False  # a host has called it at least once (else its health is not known yet)


class ProvidersPayload(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """`keel/providers` and `keel/providersChanged`: every endpoint, where the configuration came from,
    and the configuration's error when it cannot be read (then only stored endpoints are listed)."""

    endpoints: tuple[ProviderEndpointPayload, ...]
    sources: tuple[str, ...] = ()
    config_error: str | None = None


def providers(rows: list[dict[str, Any]], sources: tuple[str, ...], config_error: str | None) -> ProvidersPayload:
    """From server/providers/view.py's rows (snake_case dicts)."""
    names = set(ProviderEndpointPayload.__struct_fields__)
    endpoints = tuple(
        ProviderEndpointPayload(
            **{k: v for k, v in row.items() if k in names},
            key_source=row.get("key", ""),
            called=bool(row.get("last_success_at") or row.get("last_error_at")),
        )
        for row in rows
    )
    return ProvidersPayload(endpoints=endpoints, sources=sources, config_error=config_error)


def progress_message(view: MissionView) -> str:
    """`u3 Rewrite imports · 2/5` — the current unit and how far the mission is."""
    counts = unit_counts(view)
    running = [u for u in view.units if u.state == UnitState.RUNNING]
    where = ", ".join(f"{u.id} {u.title}".strip() for u in running[:3]) or view.record.state.value
    return f"{where} · {counts.done}/{counts.total}"


def state_text(view: MissionView) -> str:
    """How a mission ended up, for a progress `end` or a log line: `paused (operator)`, `failed: …`."""
    r = view.record
    if r.pause_reason is not None and r.state.value != r.pause_reason.value:
        return f"{r.state.value} ({r.pause_reason.value})"
    if r.error:
        return f"{r.state.value}: {r.error}"
    return r.state.value


def to_json(value: Any) -> Any:
    return msgspec.to_builtins(value)
