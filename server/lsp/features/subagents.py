"""The subagent registry of one mission: the `keel/subagents` request (unit, state, lease age, sandbox)."""

from __future__ import annotations

import time
from typing import Any

from keel.server.lsp import convert, errors
from keel.server.lsp.server import KeelServer, handler
from keel.storage import leases
from keel.storage import missions as m

SUBAGENTS = "keel/subagents"


def register(server: KeelServer) -> None:
    @server.feature(SUBAGENTS)
    @handler(server, SUBAGENTS)
    async def subagents(ls: KeelServer, params: Any = None) -> list[Any]:
        return await ls.blocking(_subagents, ls, errors.param_id(SUBAGENTS, params))


def _subagents(ls: KeelServer, text: str) -> list[Any]:
    store = ls.require_store()

    def read(txn: Any) -> list[Any]:
        return leases.list_leases(txn, m.resolve_mission_id(txn, text))

    now = time.time()
    return [convert.to_json(convert.subagent(lease, now)) for lease in store.read(read)]
