"""One unit done by an outside ACP agent (Claude Code, Gemini CLI, Codex, or any ACP command), with keel as
its client.

    run(ctx, preset, command)

The agent works in the unit's sandbox with its own HOME in the unit's home folder (kept across runs, so
its session files survive a crash), keel's model proxy as its provider and no provider key. What it does
reaches the host as journaled steps:
- every model request, through the proxy, as `model/forward` (served under the mission's policy; a
  request an earlier run already paid for is answered from the journal);
- every effect it asks permission for (edits, commands) as `effect/ask` before it happens: the intent,
  allowed or denied under the mission's permissions;
- every file it writes through the client (`fs/write_text_file`, Gemini CLI) as keel's `write_file` tool;
- every finished tool call and the final answer as evidence (`acp.tool`, `acp.message`).
Its session id is saved (`state/save`) as soon as it exists. A run after a crash `session/load`s that
session and prompts it to continue, telling it which of its effects were started without an outcome;
if loading fails it starts a new session with the goal and the journal so far. The unit's result is
the agent's stop reason and final message.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

from keel.agents.acp.connection import AcpError, AgentGone, Connection
from keel.agents.acp.mcp import OFFERED as MCP_OFFERED
from keel.agents.acp.mcp import SERVER as MCP_SERVER
from keel.agents.acp.mcp import McpTools
from keel.agents.acp.presets import Preset
from keel.agents.acp.proxy import Proxy
from keel.agents.sdk import Context, HostError
from keel.protocol import agent as ap

PROTOCOL_VERSION = 1
TOOL_OF_KIND = {"edit": "write_file", "delete": "write_file", "move": "write_file", "execute": "run", "fetch": "fetch"}
_EVIDENCE_TEXT = 4000
MAX_TOLD = 3  # follow-up prompts telling the agent what keel refused, per start
ALLOW = ("allow_once", "allow_always")
# a "no" that ends the agent's turn: Codex's `abort` (its core's ReviewDecision::Abort interrupts the turn);
# codex-acp 0.16 offers no other "no" for a command or a patch (docs/acp-agents.md)
ABORTING = frozenset({"abort"})
MAX_STARTS = 3  # an outside agent that dies mid-unit is started again (load, continue) this often per run


class UnitBridge:
    def __init__(self, ctx: Context, preset: Preset, command: list[str]) -> None:
        self.ctx = ctx
        self.preset = preset
        self.command = command
        self.sandbox = Path.cwd().resolve()
        self.home = Path(ctx.home or self.sandbox / ".keel-agent-home")
        self.conn: Connection | None = None
        self.session = ""
        self.loading = False
        self.message: list[str] = []
        self.calls: dict[str, dict[str, Any]] = {}
        self.usage: Any = None
        self.restarts: list[str] = []
        self.session_params: dict[str, Any] = {}
        # this run's effects and their outcomes, by call id (the journal's lines cover earlier runs)
        self.done: dict[str, str] = {}
        self.effects: set[str] = set()  # call ids of allowed effects whose outcome is not reported yet
        self.refused: list[str] = []  # effects keel did not make, with the reason, not yet told to the agent
        self.refusals: list[str] = []  # every effect keel did not make in this run, for a failure's message
        self.turn_cut = False  # keel's "no" ended the agent's turn (the only one it offered aborts)

    # -- the unit -----------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        token = secrets.token_hex(16)
        tools = McpTools(self.ctx, self._offered(), self._tool_done) if self.preset.keel_tools else None
        proxy = await Proxy(token, self._forward, tools.handle if tools else None).start()
        self.session_params = self._session_params(proxy.url, token)
        self.preset.prepare(self.home, proxy.url, token)
        try:
            for start in range(1, MAX_STARTS + 1):
                try:
                    return await self._run_once(proxy, token)
                except AgentGone as exc:  # the outside agent died mid-turn: start it again, load, continue
                    self.restarts.append(str(exc))
                    await self.ctx.evidence("acp.restart", summary=f"{self.preset.title}: {exc}; start {start + 1}")
                finally:
                    if self.conn is not None:
                        await self.conn.close()
                        self.conn = None
            raise RuntimeError(f"{self.preset.title} died {MAX_STARTS} times: {'; '.join(self.restarts)}")
        finally:
            await proxy.close()

    async def _run_once(self, proxy: Proxy, token: str) -> dict[str, Any]:
        self.message.clear()
        self.conn = await Connection.start(
            self.command,
            cwd=self.sandbox,
            env=self.preset.environment(self.home, proxy.url, token),
            log=self.home / "logs" / "agent.log",
            on_request=self._on_request,
            on_notify=self._on_notify,
        )
        hello = await self._call("initialize", self._initialize())
        prompt = await self._open_session(hello or {})
        try:
            answer = await self._turns(prompt)
        except AcpError as exc:
            raise RuntimeError(f"{self.preset.title}'s turn failed: {exc}{_refused_line(self.refusals)}") from None
        text = "".join(self.message).strip()
        stop = str((answer or {}).get("stopReason", ""))
        await self.ctx.evidence("acp.message", summary=text[:200], data={"text": text[:_EVIDENCE_TEXT], "stop": stop})
        if stop not in ("end_turn", ""):
            said = f"; its last message: {text[:300]}" if text else "; it said nothing"
            raise RuntimeError(
                f"{self.preset.title} stopped with {stop!r} before finishing{_refused_line(self.refusals)}{said}"
            )
        return {"stop_reason": stop, "message": text, "session": self.session, "restarts": len(self.restarts)}

    async def _turns(self, prompt: str) -> Any:
        """The prompt, then what keel refused with its reasons and recorded outcomes, as the agent's next turn:
        after a turn that ended, or that keel's own "no" cut short (Codex offers only a "no" that aborts)."""
        answer = await self._prompt(prompt)
        for _ in range(MAX_TOLD):
            stop = str((answer or {}).get("stopReason", ""))
            if not self.refused or not (stop == "end_turn" or (stop == "cancelled" and self.turn_cut)):
                break
            told, self.refused, self.turn_cut = _refusals_note(self.refused), [], False
            answer = await self._prompt(told)
        return answer

    async def _prompt(self, text: str) -> Any:
        assert self.conn is not None
        answer = await self._call(
            "session/prompt", {"sessionId": self.session, "prompt": [{"type": "text", "text": text}]}
        )
        await self.conn.drained()
        return answer

    def _offered(self) -> tuple[str, ...]:
        """keel's tools the mission's permissions allow (an agent is never offered a tool keel refuses)."""
        return tuple(t for t in MCP_OFFERED if t in self.ctx.tools or not self.ctx.tools)

    def _tool_done(self, line: str) -> None:
        self.done[f"mcp-{len(self.done)}"] = line

    def _initialize(self) -> dict[str, Any]:
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {
                # Gemini CLI 0.61 cannot create files when reads go through the client: advertise writes only
                "fs": {"readTextFile": False, "writeTextFile": self.preset.fs_write},
                "terminal": False,
            },
            "clientInfo": {"name": "keel", "version": "1"},
        }

    async def _open_session(self, hello: dict[str, Any]) -> str:
        saved = self.ctx.state if isinstance(self.ctx.state, dict) else {}
        if self.session:  # this run made a session already: the agent died mid-turn
            saved = {"session": self.session}
        can_load = bool((hello.get("agentCapabilities") or {}).get("loadSession"))
        goal = self._goal()
        if saved.get("session") and not (can_load and self.preset.loads_sessions):
            why = "does not offer session/load" if not can_load else "cannot load its sessions reliably"
            await self.ctx.evidence("acp.resume", summary=f"{self.preset.title} {why}: a new session with the journal")
        elif saved.get("session"):
            self.loading = True
            try:
                await self._call("session/load", {"sessionId": saved["session"], **self.session_params})
                self.session = str(saved["session"])
                await self.ctx.evidence("acp.resume", summary=f"session {self.session} loaded; prompted to continue")
                return self._continue_prompt()
            except AcpError as exc:
                await self.ctx.evidence("acp.resume", summary=f"session/load failed, starting afresh: {exc}"[:200])
            finally:
                self.loading = False
        created = await self._call("session/new", self.session_params)
        self.session = str((created or {}).get("sessionId", ""))
        await self.ctx.save_state({"session": self.session, "agent": self.preset.name})
        if note := _journal_note(self._history()):
            return goal + "\n\n" + note
        return goal

    def _session_params(self, proxy_url: str, token: str) -> dict[str, Any]:
        """`session/new` and `session/load` params: the sandbox, and keel's tools in place of the agent's
        own effectful ones where the preset says so."""
        params: dict[str, Any] = {"cwd": str(self.sandbox), "mcpServers": []}
        if self.preset.keel_tools:
            auth = [{"name": "authorization", "value": f"Bearer {token}"}]
            params["mcpServers"] = [{"type": "http", "name": MCP_SERVER, "url": f"{proxy_url}/mcp", "headers": auth}]
            params["_meta"] = {"claudeCode": {"options": {"disallowedTools": list(self.preset.keel_tools)}}}
        return params

    def _history(self) -> tuple[str, ...]:
        return (*self.ctx.history, *(f"this run: {line}" for line in self.done.values()))

    def _goal(self) -> str:
        unit = self.ctx.unit
        parts = [self.ctx.goal, unit.title, str(self.ctx.params.get("prompt", ""))]
        return "\n\n".join(p for p in parts if p) or f"Do unit {unit.id}."

    def _continue_prompt(self) -> str:
        return (
            "Continue the task. Your previous turn was interrupted (the process running you stopped), and "
            "this session may not hold the last things you did.\n" + _journal_note(self._history())
        ).strip()

    async def _call(self, method: str, params: Any) -> Any:
        assert self.conn is not None
        return await self.conn.request(method, params)

    # -- the agent's requests -------------------------------------------------------------------------
    async def _on_request(self, method: str, params: Any) -> Any:
        params = params if isinstance(params, dict) else {}
        if method == "session/request_permission":
            return await self._permission(params)
        if method == "fs/write_text_file" and self.preset.fs_write:
            return await self._write(params)
        raise AcpError(-32601, f"keel does not offer {method}")

    async def _permission(self, params: dict[str, Any]) -> dict[str, Any]:
        call = params.get("toolCall") or {}
        if str(call.get("title", "")).startswith(f"mcp__{MCP_SERVER}__"):
            return _selected(params, ALLOW)  # a keel tool call: journaled and checked there
        kind = str(call.get("kind") or "other")
        tool = TOOL_OF_KIND.get(kind, "run")  # an effect keel cannot classify counts as a command
        title = str(call.get("title") or kind)
        detail = {"kind": kind, "rawInput": call.get("rawInput"), "content": call.get("content")}
        call_id = str(call.get("toolCallId", ""))
        try:
            verdict = await self.ctx.effect(tool, title, call_id, detail)
        except HostError as exc:
            self._refuse(title, exc.message)
            return {"outcome": {"outcome": "cancelled"}}
        if verdict.allow:
            self.done[call_id] = f"{tool}: {title} (started, no outcome reported)"
            self.effects.add(call_id)
            return _selected(params, ALLOW)
        self._refuse(title, verdict.reason or "refused")
        answer, ends_turn = _refusal(params)
        self.turn_cut = self.turn_cut or ends_turn
        return answer

    def _refuse(self, title: str, reason: str) -> None:
        line = f"{title[:200]}: {reason}"
        self.refused.append(line)
        self.refusals.append(line)

    async def _write(self, params: dict[str, Any]) -> dict[str, Any]:
        path = Path(str(params.get("path", "")))
        try:
            resolved = await asyncio.to_thread(path.resolve)
            relative = resolved.relative_to(self.sandbox) if path.is_absolute() else path
        except ValueError:
            raise AcpError(-32602, f"keel writes only inside the unit's sandbox, not {path}") from None
        result = await self.ctx.tool("write_file", path=str(relative), content=str(params.get("content", "")))
        if not result.ok:
            raise AcpError(-32603, result.error or "write failed")
        return {}

    async def _forward(self, api: ap.ForwardApi, path: str, body: dict[str, Any]) -> ap.ModelForwardResult:
        params = ap.ModelForwardParams(api=api, body=body, path=path, session=self.session, ordinal=_ordinal(api, body))
        try:
            return await self.ctx.forward(params)
        except HostError as exc:
            return ap.ModelForwardResult(
                status=503,
                content_type="application/json",
                body=json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": exc.message}}),
            )

    # -- what the agent reports ------------------------------------------------------------------------
    async def _on_notify(self, method: str, params: Any) -> None:
        if method != "session/update" or self.loading or not isinstance(params, dict):
            return
        update = params.get("update") or {}
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = update.get("content") or {}
            if content.get("type") == "text":
                self.message.append(str(content.get("text", "")))
        elif kind in ("tool_call", "tool_call_update"):
            await self._tool_update(update)
        elif kind == "usage_update":
            self.usage = update
        elif kind == "plan":
            entries = [str(e.get("content", "")) for e in update.get("entries") or []]
            await self.ctx.evidence("acp.plan", summary="; ".join(entries)[:200], data={"entries": entries})

    async def _tool_update(self, update: dict[str, Any]) -> None:
        call_id = str(update.get("toolCallId", ""))
        call = self.calls.setdefault(call_id, {})
        call.update({k: v for k, v in update.items() if v is not None and k != "sessionUpdate"})
        status = call.get("status")
        if status not in ("completed", "failed"):
            return
        del self.calls[call_id]
        diffs = [c for c in call.get("content") or [] if isinstance(c, dict) and c.get("type") == "diff"]
        output = call.get("rawOutput")
        data = {
            "call_id": call_id,
            "kind": call.get("kind"),
            "title": call.get("title"),
            "status": status,
            "diffs": diffs,
            "output": str(output)[:_EVIDENCE_TEXT] if output is not None else None,
        }
        await self.ctx.evidence(
            "acp.tool", summary=f"{status}: {call.get('title') or call.get('kind')}"[:200], data=data
        )
        if call_id in self.effects:  # the allowed effect's intent gets its outcome
            self.effects.discard(call_id)
            shown = data["output"] or ""
            self.done[call_id] = f"{call.get('kind')}: {call.get('title')} - {status}; output: {shown[-300:]}"
            await self.ctx.effect_done(call_id, "completed" if status == "completed" else "failed", shown)


def _ordinal(api: ap.ForwardApi, body: dict[str, Any]) -> int:
    """A request's place in its conversation: how many turns its history holds (stable across restarts)."""
    history = (
        body.get("messages")
        if api == "anthropic"
        else body.get("input")
        if api == "openai-responses"
        else body.get("contents")
    )
    return len(history) if isinstance(history, list) else 0


def _selected(params: dict[str, Any], wanted: tuple[str, ...]) -> dict[str, Any]:
    """The permission answer choosing the first offered option of the wanted kinds (else cancelled)."""
    for want in wanted:
        for option in params.get("options") or []:
            if option.get("kind") == want:
                return {"outcome": {"outcome": "selected", "optionId": option.get("optionId")}}
    return {"outcome": {"outcome": "cancelled"}}


def _refusal(params: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The permission answer refusing an effect, and whether it ends the agent's turn: a "no" that lets the
    turn go on is chosen over one that aborts it (Codex's `abort`), a single "no" over a lasting one."""
    rejects = [o for o in params.get("options") or [] if o.get("kind") in ("reject_once", "reject_always")]
    if not rejects:
        return {"outcome": {"outcome": "cancelled"}}, True
    chosen = min(rejects, key=lambda o: (o.get("optionId") in ABORTING, o.get("kind") != "reject_once"))
    return {"outcome": {"outcome": "selected", "optionId": chosen.get("optionId")}}, chosen.get("optionId") in ABORTING


def _refused_line(refusals: list[str]) -> str:
    """What keel refused in this run, for the message of a unit the agent did not finish."""
    if not refusals:
        return ""
    shown = "; ".join(list(dict.fromkeys(refusals))[-3:])[:600]
    return f"; keel refused {len(refusals)} effect(s) it asked for ({shown})"


def _journal_note(history: tuple[str, ...]) -> str:
    started = [line for line in history if line.startswith("this run: ") or "effect/ask" in line or "tool/run" in line]
    effects = [line for line in started if " - " in line or "started, no" in line]
    lines = "\n".join(f"- {line}" for line in effects[-20:])
    if not lines:
        return ""
    return (
        "keel's journal of this task records these effects, with their outcomes. One that completed happened: "
        "do not make it again (keel answers a repeat on the same files from its journal and runs nothing). One "
        "with no outcome recorded was interrupted and may or may not have happened: check before repeating it.\n"
        + lines
    )


def _refusals_note(refused: list[str]) -> str:
    lines = "\n".join(f"- {line}" for line in list(dict.fromkeys(refused))[-20:])
    return (
        "keel did not make these effects you asked for; here is its answer to each, with the reason and, for one "
        "that already happened, its recorded outcome (a call of yours whose result says it was aborted, cancelled "
        "or rejected is one of these: it was not made again, and this is its result). Go on from these results "
        "and finish the task, without asking for them again.\n" + lines
    )
