"""The agent SDK: write an agent as async handlers per unit kind; the SDK speaks the agent protocol.

    from keel.agents.sdk import Agent, Context

    async def migrate(ctx: Context) -> dict:
        text = (await ctx.tool("read_file", path="a.py")).output["text"]
        ...
    Agent("my-agent", {"migrate": migrate}).run()

JSON-RPC 2.0 with Content-Length framing over stdin/stdout; the agent reads the host's requests and
sends its own concurrently. Every journaled request is sent one at a time per unit (the host numbers
them in order, and replays them after a crash), so a handler must be deterministic given the answers it
gets: use ctx.now() and ctx.random(), never the clock or `random` directly. Agents never open the store
and never see API keys. If stdin closes (the host died), the agent exits at once.
Depends on keel.protocol only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, BinaryIO, Literal

import msgspec

from keel.protocol import agent as ap
from keel.protocol import rpc
from keel.protocol.errors import ProtocolError
from keel.protocol.framing import STREAM_LIMIT, frame, read_frame, read_frame_async
from keel.protocol.spec import UnitSpec

Handler = Callable[["Context"], Awaitable[Any]]
Journal = Literal["replay", "append"]


class HostError(Exception):
    """The host answered a request with an error (denied tool, nondeterminism, pausing...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message


class _Connection:
    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._next = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}

    def send(self, message: rpc.Message) -> None:
        self._out.write(frame(rpc.encode(message)))
        self._out.flush()

    async def request(self, method: str, params: Any) -> Any:
        self._next += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[self._next] = future
        self.send(rpc.Request(method=method, id=self._next, params=params))
        return await future

    def resolve(self, message: rpc.Response | rpc.ErrorResponse) -> None:
        future = self._pending.pop(message.id, None) if isinstance(message.id, int) else None
        if future is None or future.done():
            return
        if isinstance(message, rpc.ErrorResponse):
            future.set_exception(HostError(message.error.code, message.error.message))
        else:
            future.set_result(message.result)


class Context:
    """What a unit handler may do; every call goes through the host and its journal."""

    def __init__(
        self, conn: _Connection, params: ap.UnitRunParams, init: ap.InitializeParams, appending: bool = False
    ) -> None:
        self._conn = conn
        self.appending = appending
        self._lock = asyncio.Lock()
        self.unit: UnitSpec = params.unit
        self.params: dict[str, Any] = dict(params.unit.params)
        self.attempt = params.attempt
        self.state: Any = params.state
        self.resumed_at = params.resumed_at  # a resuming agent carries on from `state`, saved at this entry
        self.replaying = params.replaying
        self.mission_id = init.mission_id
        self.goal = init.goal
        self.home = params.home  # a folder of this unit's own outside the sandbox, kept across its runs
        self.history = params.history  # an appending agent's journal so far, in words
        self.tools = params.tools  # the keel tools the mission allows (empty: not said)

    async def _call(self, method: str, params: Any = None) -> Any:
        payload = None if params is None else msgspec.to_builtins(params)
        if self.appending:  # nothing is replayed by position: requests may overlap
            return await self._conn.request(method, payload)
        async with self._lock:  # one journaled request at a time: replay order is request order
            return await self._conn.request(method, payload)

    async def model(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[ap.ToolCallSpec] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        purpose: str = "",
    ) -> ap.ModelCompleteResult:
        params = ap.ModelCompleteParams(
            messages=messages, tools=tools or [], max_tokens=max_tokens, temperature=temperature, purpose=purpose
        )
        return msgspec.convert(await self._call("model/complete", params), ap.ModelCompleteResult)

    async def forward(self, params: ap.ModelForwardParams) -> ap.ModelForwardResult:
        """A model request in a provider's own format, served by keel's providers (keel.agents.acp)."""
        return msgspec.convert(await self._call("model/forward", params), ap.ModelForwardResult)

    async def effect(self, tool: str, title: str, call_id: str = "", detail: Any = None) -> ap.EffectAskResult:
        """Ask before an effect this agent's outside agent makes itself; the host records it as an intent."""
        params = ap.EffectAskParams(tool=tool, title=title, call_id=call_id, detail=detail)
        return msgspec.convert(await self._call("effect/ask", params), ap.EffectAskResult)

    async def effect_done(
        self, call_id: str, status: Literal["completed", "failed"] = "completed", output: str = ""
    ) -> None:
        """Report that the effect `effect(..., call_id)` allowed has finished, with what it reported."""
        await self._call("effect/done", ap.EffectDoneParams(call_id=call_id, status=status, output=output))

    async def tool(self, name: str, **args: Any) -> ap.ToolRunResult:
        result = await self._call("tool/run", ap.ToolRunParams(tool=name, args=args))
        return msgspec.convert(result, ap.ToolRunResult)

    async def ask(self, question: str, choices: tuple[str, ...] = ()) -> str:
        result = await self._call("human/ask", ap.HumanAskParams(question=question, choices=tuple(choices)))
        return msgspec.convert(result, ap.HumanAskResult).answer

    async def now(self) -> float:
        return msgspec.convert(await self._call("now"), ap.NowResult).time

    async def random(self) -> float:
        return msgspec.convert(await self._call("random"), ap.RandomResult).value

    async def save_state(self, state: Any) -> None:
        await self._call("state/save", ap.StateSaveParams(state=state))
        self.state = state

    async def add_units(self, units: list[UnitSpec | Mapping[str, Any]]) -> list[str]:
        specs = tuple(u if isinstance(u, UnitSpec) else msgspec.convert(dict(u), UnitSpec) for u in units)
        result = await self._call("plan/add", ap.PlanAddParams(units=specs))
        return list(msgspec.convert(result, ap.PlanAddResult).added)

    async def evidence(self, kind: str, summary: str = "", data: Any = None) -> None:
        await self._call("evidence/add", ap.EvidenceAddParams(kind=kind, summary=summary, data=data))


class Agent:
    """An agent: a name and one async handler per unit kind ("*" handles any kind)."""

    def __init__(
        self,
        name: str,
        handlers: Mapping[str, Handler],
        version: str = "",
        journal: Journal = "replay",
        *,
        resumes: bool = False,
    ) -> None:
        self.name = name
        self.handlers = dict(handlers)
        self.version = version
        self.journal = journal  # "append": see protocol.agent.InitializeResult
        self.resumes = resumes  # its handlers carry on from `Context.state` when `Context.resumed_at` > 0
        self._init: ap.InitializeParams | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def run(self) -> None:
        """Serve the host on stdin/stdout until it says shutdown or closes stdin."""
        out = sys.stdout.buffer
        sys.stdout = sys.stderr  # stdout is the protocol pipe: a stray print must not corrupt it
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(self._serve(out))
        os._exit(0)

    async def _frames(self) -> Callable[[], Awaitable[bytes | None]]:
        """A frame reader for stdin: the event loop for pipes and sockets, a thread for anything else
        (a file or /dev/null cannot be watched by epoll)."""
        mode = os.fstat(sys.stdin.fileno()).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            reader = asyncio.StreamReader(limit=STREAM_LIMIT)
            await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer
            )
            return lambda: read_frame_async(reader)
        return lambda: asyncio.to_thread(read_frame, sys.stdin.buffer)

    async def _serve(self, out: BinaryIO) -> None:
        next_frame = await self._frames()
        conn = _Connection(out)
        while True:
            try:
                body = await next_frame()
            except ProtocolError as exc:
                print(f"{self.name}: bad frame from host: {exc.message}", file=sys.stderr)
                return
            if body is None:
                return  # the host is gone: exit promptly
            message = rpc.decode(body)
            match message:
                case rpc.Response() | rpc.ErrorResponse():
                    conn.resolve(message)
                case rpc.Request(method="shutdown", id=msg_id):
                    conn.send(rpc.Response(id=msg_id, result=None))
                    return
                case rpc.Notification(method="shutdown"):
                    return
                case rpc.Request(method=method, id=msg_id, params=params):
                    task = asyncio.create_task(self._answer(conn, method, msg_id, params))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    async def _answer(self, conn: _Connection, method: str, msg_id: rpc.Id, params: Any) -> None:
        try:
            result = await self._dispatch(conn, method, params)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            conn.send(
                rpc.ErrorResponse(
                    id=msg_id, error=rpc.ErrorObject(code=rpc.INTERNAL_ERROR, message=f"{type(exc).__name__}: {exc}")
                )
            )
            return
        conn.send(rpc.Response(id=msg_id, result=msgspec.to_builtins(result)))

    async def _dispatch(self, conn: _Connection, method: str, params: Any) -> Any:
        if method == "initialize":
            self._init = msgspec.convert(params, ap.InitializeParams)
            kinds = tuple(k for k in self.handlers if k != "*")
            return ap.InitializeResult(
                name=self.name, kinds=kinds, version=self.version, journal=self.journal, resumes=self.resumes
            )
        if method == "unit/run":
            if self._init is None:
                raise RuntimeError("unit/run before initialize")
            run = msgspec.convert(params, ap.UnitRunParams)
            handler = self.handlers.get(run.unit.kind) or self.handlers.get("*")
            if handler is None:
                raise LookupError(f"agent {self.name} has no handler for unit kind {run.unit.kind!r}")
            result = await handler(Context(conn, run, self._init, appending=self.journal == "append"))
            return ap.UnitRunResult(result=result)
        raise LookupError(f"unknown method {method!r}")
