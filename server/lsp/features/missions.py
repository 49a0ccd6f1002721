"""Mission views: the `keel/missions`, `keel/mission` and `keel/restorePoints` requests, and the
`keel/missionChanged` notification (one per mission whose summary changed, whoever changed the store).

The summaries the hub's changes produce are kept: `keel/missions` answers from them without reading the
store, and only a summary that differs from the last one is sent. The missions the server finds when it
starts are not news: clients ask `keel/missions` for them."""

from __future__ import annotations

from typing import Any

import msgspec

from keel.server.activity.pricing import currencies, price_table
from keel.server.lsp import convert, errors
from keel.server.lsp.server import KeelServer, handler
from keel.server.lsp.snapshot import MissionView, read_view, read_views
from keel.storage import missions as m

MISSIONS = "keel/missions"
MISSION = "keel/mission"
RESTORE_POINTS = "keel/restorePoints"
MISSION_CHANGED = "keel/missionChanged"
EVENTS_SHOWN = 50


def register(server: KeelServer) -> None:
    summaries: dict[str, Any] = {}  # mission id → the newest summary, as the hub has it

    @server.feature(MISSIONS)
    @handler(server, MISSIONS)
    async def missions(ls: KeelServer, params: Any = None) -> list[Any]:
        if ls.watcher is None:  # asked before `initialized`: nothing is watched yet
            return await ls.blocking(_missions, ls)
        if not ls.hub.loaded:
            await ls.watcher.current()
        return [summaries[mid] for mid in sorted(summaries)]

    @server.feature(MISSION)
    @handler(server, MISSION)
    async def mission(ls: KeelServer, params: Any = None) -> Any:
        return await ls.blocking(_mission, ls, errors.param_id(MISSION, params))

    @server.feature(RESTORE_POINTS)
    @handler(server, RESTORE_POINTS)
    async def restore_points(ls: KeelServer, params: Any = None) -> list[Any]:
        return await ls.blocking(_points, ls, errors.param_id(RESTORE_POINTS, params))

    def on_change(old: MissionView | None, new: MissionView) -> None:
        payload = convert.to_json(convert.summary(new, prices(server), currencies(server.workspace_root)))
        if summaries.get(new.record.id) == payload:
            return
        summaries[new.record.id] = payload
        if server.hub.loaded:
            server.protocol.notify(MISSION_CHANGED, payload)

    server.hub.subscribe(on_change)
    server.hub.on_remove.append(lambda mid: summaries.pop(mid, None))


def _missions(ls: KeelServer) -> list[Any]:
    store = ls.store()
    if store is None:
        return []
    views, known, money = read_views(store), prices(ls), currencies(ls.workspace_root)
    return [convert.to_json(convert.summary(_flag(ls, v), known, money)) for v in views.values()]


def _mission(ls: KeelServer, text: str) -> Any:
    store = ls.require_store()
    view = read_view(store, text)
    mid = view.record.id
    events = store.read(lambda txn: m.events_after(txn, mid, max(0, view.events_seq - EVENTS_SHOWN)))
    return convert.to_json(convert.detail(_flag(ls, view), events, prices(ls), currencies(ls.workspace_root)))


def _points(ls: KeelServer, text: str) -> list[Any]:
    store = ls.require_store()

    def read(txn: Any) -> list[Any]:
        return m.restore_points(txn, m.resolve_mission_id(txn, text))

    return [convert.to_json(convert.restore_point(p)) for p in store.read(read)]


def _flag(ls: KeelServer, view: MissionView) -> MissionView:
    """Requests read the store afresh; the stranded flag is the supervisor's, kept by the hub."""
    return msgspec.structs.replace(view, stranded=view.record.id in ls.hub.stranded)


def summary_json(ls: KeelServer, view: MissionView) -> Any:
    return convert.to_json(convert.summary(_flag(ls, view), prices(ls), currencies(ls.workspace_root)))


def prices(ls: KeelServer) -> convert.Prices:
    """Each priced provider's (input, output) per million tokens, so a mission's cost is shown only when it is
    known; cached until the configuration changes (the Providers view says why one cannot be read)."""
    return price_table(ls.workspace_root)
