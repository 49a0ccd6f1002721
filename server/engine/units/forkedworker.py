"""A unit's worker forked by the host process's worker starter (units/workerstarter.py), as the host's
connection to an agent sees it (`agentproc.Fork`): pipes for its stdin and stdout, and its exit code as the
starter writes it. Depends on protocol and units/workerstarter.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from keel.protocol.framing import STREAM_LIMIT
from keel.server.engine.units.workerstarter import MODULE, warm


class ForkedProcess:
    """A worker forked by the starter, with the parts of asyncio.subprocess.Process that AgentProcess uses."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader, status: int) -> None:
        self.pid = pid
        self.stdin: asyncio.StreamWriter | None = stdin
        self.stdout: asyncio.StreamReader | None = stdout
        self.returncode: int | None = None
        self._done = asyncio.get_running_loop().create_task(self._status(status))

    async def wait(self) -> int:
        return await asyncio.shield(self._done)

    async def _status(self, fd: int) -> int:
        """The exit code the starter writes once it has reaped the worker. Nothing written (the starter itself
        was killed): the worker is waited for through a pidfd, and reported as killed."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        try:
            text = (await reader.read()).strip()
        finally:
            transport.close()
        if text:
            self.returncode = int(text)
            self._closed()
            return self.returncode
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(self.pid)
            try:
                exited: asyncio.Future[None] = loop.create_future()
                loop.add_reader(pidfd, lambda: None if exited.done() else exited.set_result(None))
                try:
                    await exited
                finally:
                    loop.remove_reader(pidfd)
            finally:
                os.close(pidfd)
        self.returncode = -signal.SIGKILL
        self._closed()
        return self.returncode

    def _closed(self) -> None:
        """The worker is gone: the host's end of its stdin goes too (its stdout ends by itself)."""
        if self.stdin is not None and not self.stdin.is_closing():
            self.stdin.close()


async def fork_worker(command: tuple[str, ...], cwd: Path, env: dict[str, str], stderr: int) -> ForkedProcess | None:
    """`python -m keel.server.engine.units.subagent ARGS` as a fork of this process's starter, with pipes for its
    stdin and stdout (an `agentproc.Fork`); None when it cannot (the caller starts a new interpreter)."""
    starter = warm()
    if starter is None or command[1:3] != ("-m", MODULE):
        return None
    argv = command[3:]
    to_worker, from_worker, status = os.pipe(), os.pipe(), os.pipe()
    theirs = [to_worker[0], from_worker[1], stderr, status[1]]
    try:
        pid = await asyncio.to_thread(starter.request, argv, cwd, env, theirs)
    finally:
        for fd in (to_worker[0], from_worker[1], status[1]):
            os.close(fd)
    if pid is None:
        for fd in (to_worker[1], from_worker[0], status[0]):
            os.close(fd)
        return None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STREAM_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_worker[0], "rb", 0))
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), os.fdopen(to_worker[1], "wb", 0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return ForkedProcess(pid, writer, reader, status[0])
