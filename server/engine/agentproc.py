"""An agent subprocess and the JSON-RPC 2.0 connection over its stdin/stdout.

The host sends `initialize`, `unit/run`, `shutdown`; the agent sends its own requests concurrently,
which `handler` answers (the host's journal). An agent that writes garbage, dies, or closes its stdout
ends the connection with an `AgentError` that says which; a unit's worker reports its agent's garbage
with a `keel/agentError` notification, which ends it the same way. The process starts a session of its
own, and killing it kills that whole session (a worker's agent and what the agent started). Agents get a
scrubbed environment: no variable that looks like a secret, and none of the store's settings, reaches them.
Depends on protocol and storage.location only.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from keel.protocol import rpc
from keel.protocol.agent import AGENT_ERROR
from keel.protocol.environblock import SECRET_NAME, STORE_ENV_VAR, is_secret
from keel.protocol.errors import ErrorCode, KeelError, ProtocolError
from keel.protocol.framing import STREAM_LIMIT, frame, read_frame_async
from keel.server import background
from keel.storage.location import store_env, with_store_env

Handler = Callable[[str, Any], Awaitable[Any]]


class Child(Protocol):
    """What the connection uses of its process: asyncio's, or a worker forked by a starter (units/forkedworker.py)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdin(self) -> asyncio.StreamWriter | None: ...

    @property
    def stdout(self) -> asyncio.StreamReader | None: ...

    async def wait(self) -> int: ...


# (command, cwd, environment, stderr descriptor) -> the started process, or None: start it as usual
Fork = Callable[[tuple[str, ...], Path, dict[str, str], int], Awaitable[Child | None]]


class AgentError(KeelError):
    """The agent process misbehaved: garbage on stdout, died, or answered with an error."""

    code = ErrorCode.AGENT

    def __init__(self, message: str, *, died: bool = False, exit_code: int | None = None, last_words: str = "") -> None:
        super().__init__(message)
        self.died = died
        self.exit_code = exit_code
        self.last_words = last_words  # the last line the process wrote on stderr


class RemoteError(KeelError):
    """An error response from the agent (e.g. the unit's handler raised); `rpc_code` is its JSON-RPC code."""

    code = ErrorCode.AGENT

    def __init__(self, message: str, rpc_code: int = 0) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code


class HandlerError(Exception):
    """Raised by a handler to answer the agent with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class ProcState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"


_PROC_TRANSITIONS = {
    ProcState.STARTING: {ProcState.RUNNING, ProcState.STOPPING, ProcState.EXITED},
    ProcState.RUNNING: {ProcState.STOPPING, ProcState.EXITED},
    ProcState.STOPPING: {ProcState.EXITED},
    ProcState.EXITED: set(),
}


def keel_only_env(hide: frozenset[str] = frozenset()) -> frozenset[str]:
    """Names of keel's environment that neither agents nor commands get, even when named: the store's
    settings (KEEL_STORE, libpq's PG*) and `hide` (the providers' `api_key_env` variables)."""
    return hide | store_env().keys() | {"KEEL_STORE", STORE_ENV_VAR}


def plain_env(given: dict[str, str]) -> dict[str, str]:
    """A mission's `[env]` values without any whose name looks like a secret's (a secret is never written
    in a mission file)."""
    return {k: v for k, v in given.items() if not SECRET_NAME.search(k)}


def agent_env(extra: dict[str, str], hide: frozenset[str] = frozenset()) -> dict[str, str]:
    """The parent's environment without anything that looks like a secret (environblock.is_secret: a
    secret-looking name, DATABASE_URL, which may carry a password; or a name in `hide`, e.g. the providers'
    `api_key_env` variables) and without the store's settings (KEEL_STORE, libpq's PG*), plus the mission's
    env."""
    keel_only = keel_only_env(hide)
    env = {k: v for k, v in os.environ.items() if not is_secret(k) and k not in keel_only}
    env.update(plain_env(extra))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (its leader's pid): the leader's group, and the other
    groups in the session, such as a worker's agent group. Processes that left with setsid() are out of
    reach; /proc is read where there is one (elsewhere only the leader's group is killed)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for _ in range(3):  # a process may fork while the session is being killed
        members = [pid for pid in _session_members(sid) if pid != os.getpid()]
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _session_members(sid: int) -> list[int]:
    members = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != b"Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
                members.append(int(entry.name))
    return members


def _open_log(log: Path) -> Any:
    """The agent's stderr file, appended to (a quick local open, done before the agent starts)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    return open(log, "ab")


def resolve_command(command: tuple[str, ...]) -> list[str]:
    """`python`/`python3` means the interpreter keel runs on, so agents see the same packages."""
    cmd = list(command)
    if cmd and cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    return cmd


class AgentProcess:
    def __init__(
        self,
        proc: Child,
        handler: Handler,
        name: str,
        log: Path,
        on_notice: Callable[[str, Any], None] | None = None,
    ) -> None:
        self.proc = proc
        self._on_notice = on_notice
        self.log = log
        self.name = name
        self.state = ProcState.STARTING
        self._handler = handler
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failure: AgentError | None = None
        self._reader = asyncio.create_task(self._read_loop())

    @classmethod
    async def start(
        cls,
        command: tuple[str, ...],
        *,
        cwd: Path,
        env: dict[str, str],
        log: Path,
        handler: Handler,
        name: str,
        hide_env: frozenset[str] = frozenset(),
        opens_store: bool = False,
        on_notice: Callable[[str, Any], None] | None = None,
        fork: Fork | None = None,
    ) -> AgentProcess:
        """Start the process; `handler` answers its requests, `on_notice` (if any) hears its notifications,
        each before any frame that came after it is read. A process of keel's that `opens_store` (a unit's
        subagent) also gets the store's settings, which it keeps from its own agent. `fork`, when it gives a
        process, starts it instead of a new interpreter (a unit's worker: units/forkedworker.py)."""
        full_env = agent_env(env, hide_env)
        if opens_store:
            full_env = with_store_env(full_env)
        with _open_log(log) as err:
            forked = None if fork is None else await fork(command, cwd, full_env, err.fileno())
            if forked is not None:
                return cls(forked, handler, name, log, on_notice)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *resolve_command(command),
                    cwd=str(cwd),
                    env=full_env,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                    limit=STREAM_LIMIT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise AgentError(f"cannot start agent {' '.join(command)!r}: {exc.strerror}") from None
            background.lower(proc.pid)  # a unit's worker, in a session of its own (background.py)
        return cls(proc, handler, name, log, on_notice)

    def _set_state(self, new: ProcState) -> None:
        if new == self.state:
            return
        if new not in _PROC_TRANSITIONS[self.state]:
            raise RuntimeError(f"agent process cannot go from {self.state} to {new}")
        self.state = new

    async def request(self, method: str, params: Any) -> Any:
        if self._failure is not None:
            raise self._failure
        self._next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        self._send(rpc.Request(method=method, id=self._next_id, params=msgspec.to_builtins(params)))
        if method == "initialize":
            result = await future
            if self.state == ProcState.STARTING:
                self._set_state(ProcState.RUNNING)
            return result
        return await future

    def _send(self, message: rpc.Message) -> None:
        self.send_body(rpc.encode(message))

    def send_body(self, body: bytes) -> None:
        """Send one message already encoded as JSON (a notification the caller built itself)."""
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            stdin.write(frame(body))

    async def _read_loop(self) -> None:
        assert self.proc.stdout is not None
        try:
            while True:
                body = await read_frame_async(self.proc.stdout)
                if body is None:
                    code = await self._exit_code()
                    words = self._last_words()
                    tail = f"; its stderr ends: {words[:200]!r}" if words else ""
                    self._fail(
                        AgentError(
                            f"agent {self.name} exited (code {code}) without finishing{tail}",
                            died=True,
                            exit_code=code,
                            last_words=words,
                        )
                    )
                    return
                message = rpc.decode(body)
                if isinstance(message, rpc.Notification) and message.method == AGENT_ERROR:
                    raise ProtocolError(_agent_error_message(message.params))
                self._dispatch(message)
        except ProtocolError as exc:
            self._fail(AgentError(f"agent {self.name} wrote garbage on stdout: {exc.message}"))
            await self.kill()
        except Exception as exc:
            self._fail(AgentError(f"agent {self.name} connection failed: {exc}"))
            await self.kill()

    def _last_words(self) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 2000))
                tail = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return tail[-1].strip() if tail else ""

    async def _exit_code(self) -> int | None:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout=2.0)
        except TimeoutError:
            return None

    def _dispatch(self, message: rpc.Message) -> None:
        match message:
            case rpc.Request(method=method, id=msg_id, params=params):
                task = asyncio.create_task(self._answer(method, msg_id, params))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            case rpc.Response(id=msg_id, result=result):
                future = self._pending.pop(msg_id, None) if isinstance(msg_id, int) else None
                if future is not None and not future.done():
                    future.set_result(result)
            case rpc.ErrorResponse(id=msg_id, error=error):
                future = self._pending.pop(msg_id, None) if isinstance(msg_id, int) else None
                if future is not None and not future.done():
                    future.set_exception(RemoteError(error.message, error.code))
            case rpc.Notification(method=method, params=params):
                if self._on_notice is not None:  # else agents may log through notifications; nothing to do
                    self._on_notice(method, params)

    async def _answer(self, method: str, msg_id: rpc.Id, params: Any) -> None:
        try:
            result = await self._handler(method, params)
        except HandlerError as exc:
            self._send(rpc.ErrorResponse(id=msg_id, error=rpc.ErrorObject(exc.code, exc.message, exc.data)))
            return
        except asyncio.CancelledError:
            raise
        except KeelError as exc:
            self._send(rpc.ErrorResponse(id=msg_id, error=rpc.ErrorObject(-32000 - int(exc.code), exc.message)))
            return
        self._send(rpc.Response(id=msg_id, result=msgspec.to_builtins(result)))

    def _fail(self, error: AgentError) -> None:
        """The first failure is the one reported: what came after (the pipe closing) only follows from it."""
        if self._failure is None:
            self._failure = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    async def close(self, grace: float = 2.0) -> None:
        """Ask the agent to shut down, close its stdin, and make sure it is gone."""
        if self.state != ProcState.EXITED:
            self._set_state(ProcState.STOPPING)
        if self.proc.returncode is None and self._failure is None:
            self._send(rpc.Notification(method="shutdown"))
        if self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=grace)
        except TimeoutError:
            await self.kill()
        kill_session(self.proc.pid)  # whatever it left behind, also when it exited by itself
        await self._finish()

    async def kill(self) -> None:
        if self.proc.returncode is None:
            kill_session(self.proc.pid)
            await self.proc.wait()
        self._set_state(ProcState.EXITED)

    async def _finish(self) -> None:
        if self._failure is None:
            self._fail(AgentError(f"agent {self.name} was stopped", died=True))
        for task in list(self._tasks):
            task.cancel()
        if not self._reader.done():
            self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        self._set_state(ProcState.EXITED)


def _agent_error_message(params: Any) -> str:
    message = params.get("message") if isinstance(params, dict) else None
    return message if isinstance(message, str) and message else f"{AGENT_ERROR} without a message: {params!r}"
