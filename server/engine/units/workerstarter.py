"""A worker starter: one process per host process that starts the units' workers as forks of itself.

A unit's worker started as a new interpreter spends about 60 ms of CPU starting Python and importing its loops
(units/workerloop.py) before it does anything, on every unit's start and on every restart of a unit after a
crash. The starter is started once, as a new interpreter, when the host process starts (`warm`); it imports
the worker's code in its own time, says `ready`, and then forks one worker per request:
- a request is `{"argv": [subagent args...], "cwd": DIR, "env": {...}}` with four descriptors (the worker's
  stdin, stdout and stderr, and one for its exit code), one message on a SOCK_SEQPACKET socket pair; the
  answer is `{"pid": N}` or `{"error": "..."}`;
- the fork leads its own session in `cwd`, with exactly that environment and those standard streams, shows
  the worker's command line (`python -m keel.server.engine.units.subagent ...`: the starter is started with
  room for it), and runs `subagent.main`;
- the starter reaps it (a pidfd per fork) and writes its exit code (negative: the signal that ended it) to the
  exit-code descriptor, which the host reads as `ForkedProcess.wait()`.
The starter's own environment, which is all a fork shows in `/proc/<pid>/environ`, is PLAIN's names and room for
the run's tag: nothing of the host's secrets, whatever a provider's key variable is called. A worker whose
starter is gone while it runs takes it for its parent's death and stops; its unit is started again.
Until it has said `ready`, or once it is gone or has not answered in time (server/starterlink.py), the host
starts a worker as a new interpreter, as before. It exits when its host process does (the socket ends); a
worker it started then finds its stdin closed and stops, as it does when its host dies. Depends on protocol,
server/starterlink.py and the engine's units modules (the worker's own).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keel.protocol.environblock import blank_secrets, retitle, show_in_block
from keel.protocol.framing import STREAM_LIMIT
from keel.server.engine.units import subagent
from keel.server.engine.units.runtree import TAG_VAR
from keel.server.starterlink import READY, StarterLink, fd_limit

MODULE = "keel.server.engine.units.subagent"
ROOM = 4096  # bytes of command line kept free for a fork's title (a worker's arguments name paths)
TAG_ROOM = 200  # bytes of the starter's environment kept for a fork's run tag (runtree.run_tag)
# all of its own environment a fork shows in /proc/<pid>/environ (it runs with the one the host sends): no secret
# of the host's, whatever the name of a provider's key, is there for a unit's command to read
PLAIN = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


class WorkerStarter:
    """The host's side. `request` is safe to call from any thread (a unit's start calls it in a thread)."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc = proc
        self._link = StarterLink(sock)

    @classmethod
    def launch(cls) -> WorkerStarter | None:
        """Start the starter (a new interpreter); None where it cannot be started."""
        if not hasattr(os, "pidfd_open"):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            env = {k: os.environ[k] for k in PLAIN if k in os.environ}
            proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), " " * ROOM],
                pass_fds=[theirs.fileno()],
                # nothing of the starting process's: `keel run --detach` hands the starter to its host and exits,
                # and whoever reads that command's output waits for every copy of its pipes to close
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={**env, TAG_VAR: " " * TAG_ROOM},
                start_new_session=True,
            )
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        return cls(proc, ours)

    def request(self, argv: Sequence[str], cwd: Path, env: dict[str, str], fds: Sequence[int]) -> int | None:
        """The pid of a worker forked with these arguments, directory, environment and descriptors (stdin,
        stdout, stderr, exit code); None when the caller should start a new interpreter instead."""
        if len(env.get(TAG_VAR, "").encode()) > TAG_ROOM:
            return None
        reply = self._link.ask({"argv": list(argv), "cwd": str(cwd), "env": env}, fds)
        return int(reply["pid"]) if reply is not None and "pid" in reply else None

    def close(self) -> None:
        self._link.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)


_shared: WorkerStarter | None = None
_shared_lock = threading.Lock()
_launched_by = 0  # the pid of the process that started _shared: a fork of it starts its own


def warm() -> WorkerStarter | None:
    """This process's starter, started on the first call (a host calls it first thing, so that the starter
    has loaded the worker's code by the time the first unit starts)."""
    global _shared, _launched_by
    with _shared_lock:
        if _launched_by != os.getpid():
            _launched_by = os.getpid()
            _shared = WorkerStarter.launch()
            if _shared is not None:
                atexit.register(_shared.close)  # it ends with its socket; reaped here, not left to init
        return _shared


def adopt() -> int:
    """In a host just forked (hoststart.py): the starter its parent started for it, ready or nearly (a host
    starter keeps one ready for its next host; `keel resume --detach` starts one before it forks), becomes this
    process's own. Any other starter it inherited (a grandparent's) is dropped without closing its socket,
    whose descriptor is the owner's to close. Returns the descriptor the host keeps for it (-1: none)."""
    global _shared, _launched_by
    with _shared_lock:
        if _shared is not None and _launched_by == os.getppid():
            _launched_by = os.getpid()
            return _shared._link.fileno()
    drop()
    return -1


def drop() -> None:
    """In a forked process that is no host (a host starter's command run): forget an inherited starter without
    closing its socket, whose descriptor is its owner's."""
    global _shared, _launched_by
    with _shared_lock:
        if _shared is not None and _launched_by != os.getpid():
            atexit.unregister(_shared.close)
            _shared._link.detach()
            _shared, _launched_by = None, 0


def hand_over() -> None:
    """In the parent of a host that adopted this process's starter: it is the host's now."""
    global _shared, _launched_by
    with _shared_lock:
        if _shared is not None:
            atexit.unregister(_shared.close)
            _shared._link.close()
        _shared, _launched_by = None, 0


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


# -- the starter process --------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    """`python -m keel.server.engine.units.workerstarter FD ROOM`: the starter's whole life."""
    sock = socket.socket(fileno=int(argv[0]))
    code = 0
    try:
        blank_secrets()  # nothing of the kind is given to it; a forked worker shows this block
        subagent.load_loops()  # what every fork runs, loaded once here
        retitle(["keel", "worker-starter"])
        sock.send(READY)
        _serve(sock)
    except BaseException:  # the host is gone mid-answer: it starts its workers itself
        code = 1
    finally:
        os._exit(code)


def _serve(sock: socket.socket) -> None:
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, exit-code descriptor)
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fileobj is sock:
                    data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
                    if not data:
                        return
                    reply: dict[str, Any]
                    try:
                        pid = _fork(json.loads(data), fds)
                        pidfd = os.pidfd_open(pid)
                        children[pidfd] = (pid, os.dup(fds[3]))
                        sel.register(pidfd, selectors.EVENT_READ)
                        reply = {"pid": pid}
                    except Exception as exc:  # told to the host, which starts a new interpreter
                        reply = {"error": str(exc) or type(exc).__name__}
                    finally:
                        for fd in fds:
                            os.close(fd)
                    sock.send(json.dumps(reply).encode())
                else:
                    pidfd = int(key.fd)
                    sel.unregister(pidfd)
                    pid, status = children.pop(pidfd)
                    _, how = os.waitpid(pid, 0)
                    with contextlib.suppress(OSError):
                        os.write(status, str(os.waitstatus_to_exitcode(how)).encode())
                    os.close(status)
                    os.close(pidfd)


def _fork(request: dict[str, Any], fds: list[int]) -> int:
    argv, cwd, env = request["argv"], request["cwd"], request["env"]
    if len(fds) != 4 or not isinstance(argv, list) or not isinstance(env, dict):
        raise ValueError(f"not a worker's start: {len(fds)} descriptors")
    pid = os.fork()
    if pid == 0:
        _worker([str(a) for a in argv], str(cwd), {str(k): str(v) for k, v in env.items()}, fds)
    return pid


def _worker(argv: list[str], cwd: str, env: dict[str, str], fds: list[int]) -> None:
    """The forked worker: its own session, directory, environment and standard streams, then `subagent.main`,
    which ends the process."""
    code = 1
    try:
        os.setsid()
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.closerange(3, fd_limit())
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        retitle([sys.executable, "-m", MODULE, *argv])
        show_in_block(TAG_VAR, env.get(TAG_VAR, ""))  # its run's processes are found by this (runtree.py)
        subagent.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
