"""An ACP connection: JSON-RPC 2.0 over an outside agent's stdin/stdout, one JSON object per line.

keel is the client. `request` sends and awaits an answer; the agent's own requests go to `on_request`
(its answer or an AcpError is sent back), its notifications to `on_notify`, in the order they arrive.
Every message both ways is appended to a transcript file (one JSON line each, with its direction). The
agent stays in the bridge's process group (a worker stopping the bridge by its group stops the agent and
its children too) and dies with the bridge (PR_SET_PDEATHSIG); the bridge adopts its orphans, and `close`
kills every process below the bridge (Claude Code's CLI runs under its adapter and outlives it otherwise).
Depends on the standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

LINE_LIMIT = 64 * 1024 * 1024
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36  # a session/load replays whole histories in single lines


class AcpError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        detail = f" ({json.dumps(data)[:300]})" if data is not None else ""
        super().__init__(f"{message}{detail} (code {code})")
        self.code = code
        self.message = message
        self.data = data


class AgentGone(Exception):
    """The agent's process ended or closed its output."""


RequestHandler = Callable[[str, Any], Awaitable[Any]]
NotifyHandler = Callable[[str, Any], Awaitable[None]]


class Connection:
    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        on_request: RequestHandler,
        on_notify: NotifyHandler,
        transcript: IO[str],
    ) -> None:
        self.proc = proc
        self._on_request = on_request
        self._on_notify = on_notify
        self._transcript = transcript
        self._next = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._notes: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())
        self._notifier = asyncio.create_task(self._notify_loop())

    @classmethod
    async def start(
        cls,
        command: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        log: Path,
        on_request: RequestHandler,
        on_notify: NotifyHandler,
    ) -> Connection:
        adopt_orphans()
        err, transcript = _open_logs(log)
        with err:
            proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=str(cwd),
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                limit=LINE_LIMIT,
                preexec_fn=_die_with_parent,
            )
        return cls(proc, on_request, on_notify, transcript)

    async def request(self, method: str, params: Any) -> Any:
        self._next += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[self._next] = future
        self._send({"jsonrpc": "2.0", "id": self._next, "method": method, "params": params})
        return await future

    def notify(self, method: str, params: Any) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def _send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False)
        self._log(">", line)
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            raise AgentGone("the agent's input is closed")
        stdin.write(line.encode() + b"\n")

    def _log(self, direction: str, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._transcript.write(f'{{"dir":"{direction}","msg":{line}}}\n')
            self._transcript.flush()

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        error: BaseException = AgentGone("the agent closed its output")
        try:
            while line := await self.proc.stdout.readline():
                text = line.decode("utf-8", "replace").strip()
                if not text:
                    continue
                try:
                    message = json.loads(text)
                except ValueError:
                    continue  # not protocol (a stray print): kept in the agent's log by nobody; skip it
                self._log("<", text)
                if isinstance(message, dict):
                    self._dispatch(message)
        except (OSError, ValueError) as exc:
            error = AgentGone(f"reading from the agent failed: {exc}")
        code = await self.proc.wait()
        error = AgentGone(f"the agent exited (code {code})") if isinstance(error, AgentGone) else error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        self._notes.put_nowait(None)

    def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        msg_id = message.get("id")
        if method is None:
            future = self._pending.pop(msg_id, None) if isinstance(msg_id, int) else None
            if future is None or future.done():
                return
            if "error" in message:
                error = message["error"] if isinstance(message["error"], dict) else {}
                future.set_exception(
                    AcpError(int(error.get("code", -32603)), str(error.get("message", "error")), error.get("data"))
                )
            else:
                future.set_result(message.get("result"))
        elif msg_id is None:
            self._notes.put_nowait((str(method), message.get("params")))
        else:
            task = asyncio.create_task(self._answer(msg_id, str(method), message.get("params")))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _notify_loop(self) -> None:
        while (note := await self._notes.get()) is not None:
            method, params = note
            if isinstance(params, asyncio.Event):
                params.set()
            else:
                await self._on_notify(method, params)

    async def _answer(self, msg_id: Any, method: str, params: Any) -> None:
        try:
            result = await self._on_request(method, params)
        except AcpError as exc:
            reply: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": msg_id,
                "error": {"code": exc.code, "message": exc.message},
            }
        else:
            reply = {"jsonrpc": "2.0", "id": msg_id, "result": result}
        with contextlib.suppress(AgentGone, ConnectionError):
            self._send(reply)

    async def drained(self) -> None:
        """Wait until every notification received so far has been handled."""
        done = asyncio.Event()
        await self._notes.put(("", done))
        await done.wait()

    async def close(self, grace: float = 2.0) -> None:
        """End the agent: close its input, then kill it and its descendants after `grace` seconds."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), grace)
        kill_descendants(os.getpid())  # the agent and whatever it left: orphans are ours (adopt_orphans)
        await self.proc.wait()
        for task in (self._reader, self._notifier, *self._tasks):
            task.cancel()
        self._transcript.close()


def adopt_orphans() -> None:
    """Make this process the reaper of its orphaned descendants (Linux): a child of the agent whose parent
    died (Claude Code's CLI when its adapter is killed) is then still below the bridge, and `close` ends it."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)


def kill_descendants(pid: int) -> None:
    """SIGKILL every process below `pid`, not `pid` itself (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, doomed = list(children.get(pid, [])), []
    while todo:
        current = todo.pop()
        doomed.append(current)
        todo.extend(children.get(current, []))
    for victim in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the bridge dies (Linux), so a killed bridge leaves no agent."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _open_logs(log: Path) -> tuple[IO[bytes], IO[str]]:
    """The agent's stderr log and the transcript of every message (`<log>.acp.jsonl`, closed in close())."""
    log.parent.mkdir(parents=True, exist_ok=True)
    return open(log, "ab"), open(log.with_suffix(".acp.jsonl"), "a", encoding="utf-8")
