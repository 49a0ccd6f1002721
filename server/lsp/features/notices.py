"""Failures and logs for any editor: a mission entering `failed` → `window/showMessage` (Error); a pause
for `offline`, `disk_full` or `policy` (and the state `offline`) → Warning; every new mission event →
`window/logMessage`. Missions the server finds when it starts are not replayed: only what happens while
it runs is announced."""

from __future__ import annotations

from lsprotocol import types

from keel.protocol.records import Event
from keel.protocol.states import MissionState, PauseReason
from keel.server.lsp.server import KeelServer
from keel.server.lsp.snapshot import MissionView
from keel.storage import missions as m

WARN_REASONS = frozenset({PauseReason.OFFLINE, PauseReason.DISK_FULL, PauseReason.POLICY, PauseReason.BUDGET})


def register(server: KeelServer) -> None:
    def on_change(old: MissionView | None, new: MissionView) -> None:
        if old is None:
            return
        r = new.record
        if r.state != old.record.state:
            if r.state == MissionState.FAILED:
                server.show(
                    f"keel: mission {r.spec.name} ({r.id}) failed: {r.error or 'no reason recorded'}",
                    types.MessageType.Error,
                )
            elif r.state in (MissionState.PAUSED, MissionState.OFFLINE) and r.pause_reason in WARN_REASONS:
                reason = r.pause_reason.value.replace("_", " ") if r.pause_reason else ""
                server.show(
                    f"keel: mission {r.spec.name} ({r.id}) paused: {reason}" + (f" — {r.error}" if r.error else ""),
                    types.MessageType.Warning,
                )
        if new.events_seq > old.events_seq:
            server.spawn(_log_events(server, r.id, old.events_seq, new.events_seq), f"logging mission {r.id}")

    server.hub.subscribe(on_change)


async def _log_events(server: KeelServer, mission_id: str, after: int, upto: int) -> None:
    store = server.store()
    if store is None:
        return
    events: list[tuple[int, Event]] = await server.blocking(
        store.read, lambda txn: [(s, e) for s, e in m.events_after(txn, mission_id, after) if s <= upto]
    )
    for _, e in events:
        parts = [f"[{mission_id}]", e.kind, e.unit, e.message or e.state]
        server.log_line(" ".join(p for p in parts if p))
