"""A host starter: a process that a long-lived keel process (`keel serve`, `keel supervise`) forks while it still
has one thread and no store open, so that it can start keel processes as forks later, when it has both.

A new interpreter spends about 90 ms starting and importing keel before it does anything: on the critical path of
recovery when a host that died is restarted, and of every editor action that runs in a child of the language
server (lsp/enginecall.py: start, resume, answer, restore, fork). The starter imports the host's code once, in its
own time, then forks per request:
- `{"host": [store, mission id]}`: a mission's detached host (hoststart.py);
- `{"run": ["-m", module, args...]}` with three descriptors (stdout, stderr, and one for the exit code): `keel`'s
  command line (`keel.server.cli`) or an engine call (`keel.server.lsp.enginecall`), run as that module's `main`.
A request and its answer (`{"pid": N}` or `{"error": "..."}`) are one message each on a SOCK_SEQPACKET socket pair.
Until it has said `ready` (its imports done), nothing waits for it: the caller starts a new interpreter.

It keeps nothing of its parent's: /dev/null as stdin and stdout (the parent's stdout may be the LSP pipe), its
end of the socket, and stderr. The kernel reaps what it forks (it ignores SIGCHLD; each fork sets SIGCHLD back
first thing). It exits when its parent does: the socket ends. When it is gone, or does not answer within
starterlink.TIMEOUT_S, the caller starts a new interpreter instead, and it is not asked again.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from keel.protocol.environblock import retitle
from keel.server.engine import control
from keel.server.engine.units import workerstarter
from keel.server.forkend import run_and_exit
from keel.server.hoststart import can_fork, start_host
from keel.server.starterlink import READY, StarterLink, fd_limit

MAINS = ("keel.server.cli", "keel.server.lsp.enginecall")  # the modules a `run` request may name


class HostStarter:
    """The parent's side: `start` is a `control.Starter`; `start` and `run` are safe to call from any thread."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.pid = pid
        self._link = StarterLink(sock)

    @classmethod
    def launch(cls) -> HostStarter | None:
        """Fork the starter; None where it cannot be forked safely (no fork, another thread, a store open)."""
        if not can_fork():
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _serve(theirs)
        theirs.close()
        return cls(ours, pid)

    def start(self, store_path: Path, mission_id: str) -> int:
        """The pid of the mission's new detached host."""
        reply = self._link.ask({"host": [str(store_path), mission_id]})
        if reply is None:
            return control.spawn_host(store_path, mission_id)
        if "error" in reply:
            raise OSError(f"starting the host of mission {mission_id}: {reply['error']}")
        return int(reply["pid"])

    def run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
        """`python ARGV` (`-m` and one of MAINS, then its arguments) as a fork of the starter: its exit code and
        output as `subprocess.run` gives them. None when the starter cannot (the caller runs a new interpreter).
        Raises subprocess.TimeoutExpired (the fork killed) after `timeout` seconds."""
        pipes = [os.pipe() for _ in range(3)]
        try:
            reply = self._link.ask({"run": list(argv)}, [w for _, w in pipes])
        finally:
            for _, w in pipes:
                os.close(w)
        if reply is None or "pid" not in reply:
            for r, _ in pipes:
                os.close(r)
            return None
        pid = int(reply["pid"])
        out, err, status = _read_all([r for r, _ in pipes], time.monotonic() + timeout)
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(list(argv), timeout)
        code = int(status) if status.strip() else -signal.SIGKILL  # no code written: it was killed
        return subprocess.CompletedProcess(list(argv), code, out.decode(errors="replace"), err.decode(errors="replace"))

    def close(self) -> None:
        self._link.close()


def _read_all(fds: list[int], deadline: float) -> tuple[bytes, bytes, bytes | None]:
    """Everything written to these pipes until each is closed; None as the last one's data after the deadline."""
    got: dict[int, list[bytes]] = {fd: [] for fd in fds}
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                ready = sel.select(left) if left > 0 else []
                if not ready:
                    return b"", b"", None
                for key, _ in ready:
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        got[key.fd].append(chunk)
                    else:
                        sel.unregister(key.fd)
        finally:
            for fd in fds:
                os.close(fd)
    out, err, status = (b"".join(got[fd]) for fd in fds)
    return out, err, status


def _serve(sock: socket.socket) -> None:
    """The starter's whole life; it never returns into the code that forked it."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # what it forks is reaped by the kernel
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        keep = sock.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, fd_limit())
        from keel.server import cli  # noqa: F401 - what a host runs, loaded once here
        from keel.server.engine import host  # noqa: F401
        from keel.server.lsp import enginecall  # noqa: F401

        workerstarter.warm()  # the next host's worker starter, ready when it is forked
        sock.send(READY)
        retitle(["keel", "host-starter"])  # ps tells it from the server it was forked from
        while True:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            if not data:
                break
            try:
                reply: dict[str, Any] = {"pid": _fork_for(json.loads(data), fds)}
            except Exception as exc:  # told to the parent, which reports it or starts a new interpreter
                reply = {"error": str(exc) or type(exc).__name__}
            finally:
                for fd in fds:
                    os.close(fd)
            sock.send(json.dumps(reply).encode())
    except BaseException:  # the parent is gone mid-answer, or the set-up failed: the parent starts processes itself
        code = 1
    finally:
        os._exit(code)


def _fork_for(request: dict[str, Any], fds: list[int]) -> int:
    if "host" in request:
        store, mission_id = request["host"]
        pid = start_host(Path(store), str(mission_id))  # which takes this process's worker starter with it
        workerstarter.warm()  # and one for the next
        return pid
    argv = request["run"]
    if len(fds) != 3 or argv[:1] != ["-m"] or argv[1:2] == [] or argv[1] not in MAINS:
        raise ValueError(f"not a run this starter does: {argv[:2]} with {len(fds)} descriptors")
    pid = os.fork()
    if pid == 0:
        _run(argv[1], argv[2:], fds)
    return pid


def _run(module: str, args: list[str], fds: list[int]) -> NoReturn:
    """The forked run: the module's `main(args)` with the given stdout and stderr; its exit code written last."""
    out, err, status = fds

    def run() -> int:
        workerstarter.drop()  # the next host's, not this run's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # it waits for what it starts (git, a host's fork)
        retitle(["keel", *args] if module == "keel.server.cli" else ["keel", "engine-call", *args])
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, status)
        os.closerange(status + 1, fd_limit())
        from keel.server import cli
        from keel.server.lsp import enginecall

        return cli.main(args) if module == "keel.server.cli" else enginecall.main(args)

    def report(code: int) -> None:
        os.write(status, str(code).encode())

    run_and_exit(run, last=report)
