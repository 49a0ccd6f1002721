"""What the agent did: the `keel/activity` and `keel/activityFile` requests and the `keel/activityChanged`
notification (docs/lsp.md).

Requests read a page of a mission's activity (server/activity) in a thread. The follower keeps one cursor
per mission: after every look of the store watcher whose transaction id moved, it reads what each
mission recorded since its cursor and notifies the new items (an intent that got its result comes again
with the same id). Missions already in the store when the server starts begin at their end, so nothing
old is pushed; clients ask `keel/activity` for the history. Depends on server/activity and the LSP core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from keel.server.activity.files import file_sides
from keel.server.activity.pricing import configured_prices
from keel.server.activity.reader import (
    DEFAULT_LIMIT,
    ActivityError,
    Filter,
    end_cursor,
    read_page,
)
from keel.server.lsp.errors import invalid, param_id
from keel.server.lsp.server import KeelServer, handler
from keel.server.lsp.snapshot import MissionView, read_view
from keel.storage import Store

log = logging.getLogger(__name__)
ACTIVITY = "keel/activity"
ACTIVITY_FILE = "keel/activityFile"
ACTIVITY_CHANGED = "keel/activityChanged"
FOLLOW_PAGE = 500


def register(server: KeelServer) -> None:
    follower = _Follower(server)
    server.hub.on_look.append(follower.look)

    @server.feature(ACTIVITY)
    @handler(server, ACTIVITY)
    async def activity(ls: KeelServer, params: Any = None) -> Any:
        mission = param_id(ACTIVITY, params)
        fields = _fields(params)
        return await ls.blocking(_page, ls, mission, fields)

    @server.feature(ACTIVITY_FILE)
    @handler(server, ACTIVITY_FILE)
    async def activity_file(ls: KeelServer, params: Any = None) -> Any:
        mission = param_id(ACTIVITY_FILE, params)
        fields = _fields(params)
        item, path = _text(ACTIVITY_FILE, fields, "item"), _text(ACTIVITY_FILE, fields, "path")
        sides = await ls.blocking(file_sides, ls.require_store(), mission, item, path)
        return msgspec.to_builtins(sides)


def _page(ls: KeelServer, mission: str, fields: dict[str, Any]) -> Any:
    store = ls.require_store()
    view = read_view(store, mission)
    kinds = fields.get("kinds") or []
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise invalid(f"{ACTIVITY} expects kinds as a list of strings, got {kinds!r}"[:200])
    unit, cursor = fields.get("unit") or "", fields.get("cursor") or ""
    limit, failures = fields.get("limit", DEFAULT_LIMIT), fields.get("failuresOnly", False)
    if not isinstance(unit, str) or not isinstance(cursor, str) or not isinstance(failures, bool):
        raise invalid(f"{ACTIVITY} expects unit and cursor as strings and failuresOnly as true or false")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise invalid(f"{ACTIVITY} expects limit as a whole number, got {limit!r}"[:200])
    try:
        wanted = Filter(unit=unit, kinds=frozenset(kinds), failures_only=failures)
        page = read_page(
            store,
            view.record.id,
            cursor=cursor,
            limit=limit,
            filter=wanted,
            prices=configured_prices(Path(view.record.workspace)),
        )
    except ActivityError as exc:
        raise invalid(f"{ACTIVITY}: {exc.message}") from None
    return msgspec.to_builtins(page)


def _fields(params: Any) -> dict[str, Any]:
    if isinstance(params, dict):
        return params
    if hasattr(params, "_asdict"):
        return dict(params._asdict())
    return {}


def _text(method: str, fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise invalid(f"{method} expects params {{{name!r}: <string>}} as well as the mission id")
    return value


class _Follower:
    """One cursor per mission; reads in a thread, one read at a time, after the store moved."""

    def __init__(self, server: KeelServer) -> None:
        self.server = server
        self.cursors: dict[str, str] = {}
        self.started = False
        self.busy = False
        self.again = False
        self.seen_txn = -1

    def look(self, views: dict[str, MissionView]) -> None:
        if self.busy:
            self.again = True
            return
        self.busy = True
        self.server.spawn(self._follow(views), "following mission activity")

    async def _follow(self, views: dict[str, MissionView]) -> None:
        loop = asyncio.get_running_loop()

        def send(payload: Any) -> None:  # each page as it is read: the reader never holds more than one
            loop.call_soon_threadsafe(self.server.protocol.notify, ACTIVITY_CHANGED, payload)

        try:
            while True:
                self.again = False
                await self.server.blocking(self._read, views, send)
                if not self.again:
                    return
                views = dict(self.server.hub.views)
        finally:
            self.busy = False

    def _read(self, views: dict[str, MissionView], send: Callable[[Any], None]) -> None:
        store = self.server.store()
        if store is None:  # no store yet: every mission that appears is new, from its first step
            self.started = True
            return
        txn = store.txn_id()
        if txn == self.seen_txn and set(views) <= set(self.cursors):
            return
        self.seen_txn = txn
        for mid, view in views.items():
            if mid not in self.cursors:
                self.cursors[mid] = "" if self.started else end_cursor(store, mid)
            self._news(store, view, send)
        self.started = True

    def _news(self, store: Store, view: MissionView, send: Callable[[Any], None]) -> None:
        """Send what the mission recorded since its cursor, one notification per page (none holds more than
        FOLLOW_PAGE items, however far the mission got since the last look)."""
        mid = view.record.id
        prices = configured_prices(Path(view.record.workspace))
        while True:
            page = read_page(store, mid, cursor=self.cursors[mid], limit=FOLLOW_PAGE, prices=prices)
            self.cursors[mid] = page.cursor
            if page.items:
                items = msgspec.to_builtins(page.items)
                send({"id": mid, "state": page.state, "items": items, "cursor": page.cursor})
            if not page.more:
                return
