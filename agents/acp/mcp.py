"""keel's effectful tools offered to an outside agent as an MCP server (streamable HTTP, JSON answers),
served by the unit's model proxy at `/mcp` under the unit's token.

    McpTools(ctx, offered, on_done).handle(message) -> the JSON-RPC answer, or None for a notification

Claude Code takes them in place of its own Edit, Write and Bash (keel.agents.acp.presets): then every
edit and command is a keel tool call, journaled as an intent before it runs and its result after,
checked against the mission's permissions and reconciled after a crash like keel's own agents' calls.
Only the tools the mission's permissions allow are offered (`offered`); `on_done` hears each call's
outcome in words (the continue prompt after a restart). The tools' schemas are keel's (`protocol/tools.py`).
Depends on keel.protocol and the agent SDK only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from keel.agents.sdk import Context, HostError
from keel.protocol.tools import TOOL_SPECS

OFFERED = ("write_file", "apply_diff", "run")  # the effects; the agent keeps its own read-only tools
SERVER = "keel"  # Claude Code names the tools mcp__keel__<tool>
PROTOCOL = "2025-06-18"


class McpTools:
    def __init__(
        self, ctx: Context, offered: tuple[str, ...] = OFFERED, on_done: Callable[[str], None] | None = None
    ) -> None:
        self.ctx = ctx
        self.offered = tuple(t for t in offered if t in OFFERED)
        self.on_done = on_done
        self.specs = [s for s in TOOL_SPECS if s.name in self.offered]

    async def handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        method, msg_id = message.get("method"), message.get("id")
        if msg_id is None:  # notifications/initialized and the like
            return None
        raw = message.get("params")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": str(params.get("protocolVersion") or PROTOCOL),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": SERVER, "version": "1"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {
                "tools": [
                    {"name": s.name, "description": s.description, "inputSchema": s.parameters} for s in self.specs
                ]
            }
        elif method == "tools/call":
            result = await self._call(str(params.get("name", "")), params.get("arguments") or {})
        else:
            return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": f"keel offers no {method}"}}
        return {"jsonrpc": "2.0", "id": msg_id, "result": result}

    async def _call(self, name: str, arguments: Any) -> dict[str, Any]:
        if name not in self.offered or not isinstance(arguments, dict):
            offered = ", ".join(self.offered)
            return _content(f"keel offers {offered} with an arguments object; not {name!r}", error=True)
        try:
            answer = await self.ctx.tool(name, **arguments)
        except HostError as exc:  # refused by the mission's permissions, or bad arguments: the call was not made
            return _content(f"keel refused {name}: {exc.message}", error=True)
        if self.on_done is not None:
            what = arguments.get("cmd") or arguments.get("path") or ""
            shown = json.dumps(answer.output)[-300:] if answer.output is not None else answer.error
            self.on_done(f"{name} {str(what)[:120]} - {'completed' if answer.ok else 'failed'}; output: {shown}")
        if not answer.ok:
            return _content(answer.error or f"{name} failed", error=True, output=answer.output)
        return _content("", output=answer.output)


def _content(text: str, *, error: bool = False, output: Any = None) -> dict[str, Any]:
    parts = [text] if text else []
    if output is not None:
        parts.append(output if isinstance(output, str) else json.dumps(output, indent=1))
    return {"content": [{"type": "text", "text": "\n".join(parts) or "ok"}], "isError": error}
