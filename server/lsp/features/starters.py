"""The `keel/starter` request: the starter files `keel init` writes, for an editor's "Create a Mission
File" and "Open Config" buttons — the same text (server/templates), never overwriting a file.
Depends on server/templates and the LSP core.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from keel.server.lsp.errors import invalid
from keel.server.lsp.server import KeelServer, handler
from keel.server.templates import STARTERS, StarterExistsError, write_starter

STARTER = "keel/starter"


def register(server: KeelServer) -> None:
    @server.feature(STARTER)
    @handler(server, STARTER)
    async def starter(ls: KeelServer, params: Any = None) -> Any:
        what = params.get("what") if isinstance(params, dict) else getattr(params, "what", None)
        if what not in STARTERS:
            raise invalid(f'{STARTER} expects params {{"what": "mission" or "config"}}, got {what!r}'[:200])
        return await asyncio.to_thread(_write, ls.workspace_root, what)


def _write(root: Path, what: str) -> dict[str, Any]:
    try:
        return {"path": str(write_starter(root, what)), "created": True}
    except StarterExistsError:
        return {"path": str(root / STARTERS[what]), "created": False}
