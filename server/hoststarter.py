"""A host starter: a process that a long-lived keel process (`keel serve`, `keel supervise`) forks while it still
has one thread and no store open, so that it can start mission hosts as forks (hoststart.py) later, when it has
both.

Restarting a host that died is on the critical path of recovery, and a new interpreter spends about 90 ms
starting and importing the host before it does anything. The starter imports the host's code once, in its own
time, then forks one host per request. A request is one line on a socket pair, `[store, mission id]` in JSON;
the answer is one line, `{"pid": N}` or `{"error": "..."}`. Until it has said `ready` (its imports done), a start
does not wait for it: the host is a new interpreter.

It keeps nothing of its parent's: /dev/null as stdin and stdout (the parent's stdout may be the LSP pipe), its
end of the socket, and stderr. The kernel reaps the hosts it forks (it ignores SIGCHLD; a host sets SIGCHLD back
first thing, hoststart.py). It exits when its parent does: the socket ends. When it is gone, or does not answer
within TIMEOUT_S, `start` starts a new interpreter instead (`control.spawn_host`), and stops asking it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from keel.protocol.environblock import retitle
from keel.server.engine import control
from keel.server.hoststart import fd_limit, start_host
from keel.storage.base import held_in_process

TIMEOUT_S = 2.0


class HostStarter:
    """The parent's side: `start` is a `control.Starter`, safe to call from any thread."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.pid = pid
        self._sock: socket.socket | None = sock
        self._replies = sock.makefile("rb")
        self._lock = threading.Lock()
        self._ready = False  # it said it has loaded the host; before that, hosts are new interpreters

    @classmethod
    def launch(cls) -> HostStarter | None:
        """Fork the starter; None where it cannot be forked safely (no fork, another thread, a store open)."""
        if not hasattr(os, "fork") or threading.active_count() != 1 or held_in_process():
            return None
        ours, theirs = socket.socketpair()
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
        with self._lock:
            reply = self._ask(store_path, mission_id)
        if reply is None:
            return control.spawn_host(store_path, mission_id)
        if "error" in reply:
            raise OSError(f"starting the host of mission {mission_id}: {reply['error']}")
        return int(reply["pid"])

    def _ask(self, store_path: Path, mission_id: str) -> dict[str, Any] | None:
        if self._sock is None or not (self._ready or self._readied()):
            return None
        try:
            self._sock.settimeout(TIMEOUT_S)
            self._sock.sendall(json.dumps([str(store_path), mission_id]).encode() + b"\n")
            line = self._replies.readline()
            reply = json.loads(line) if line else None
        except (OSError, ValueError):
            reply = None
        if not isinstance(reply, dict):
            self._close()
        return reply if isinstance(reply, dict) else None

    def _readied(self) -> bool:
        """Whether its `ready` line has come, without waiting for it: a start never waits for its imports."""
        assert self._sock is not None
        try:
            if not select.select([self._sock], [], [], 0)[0]:
                return False  # nothing yet
            self._sock.settimeout(TIMEOUT_S)
            self._ready = self._replies.readline() == b"ready\n"
        except (OSError, ValueError):
            self._ready = False
        if not self._ready:
            self._close()  # it ended, or said something else: it is not asked again
        return self._ready

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._sock is not None:
            self._replies.close()
            self._sock.close()
            self._sock = None


def _serve(sock: socket.socket) -> None:
    """The starter's whole life; it never returns into the code that forked it."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its hosts are reaped by the kernel
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        keep = sock.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, fd_limit())
        from keel.server import cli  # noqa: F401 - what a host runs, loaded once here
        from keel.server.engine import host  # noqa: F401

        sock.sendall(b"ready\n")
        retitle(["keel", "host-starter"])  # ps tells it from the server it was forked from
        requests = sock.makefile("rb")
        for line in requests:
            try:
                store, mission_id = json.loads(line)
                reply: dict[str, Any] = {"pid": start_host(Path(store), str(mission_id))}
            except Exception as exc:  # told to the parent, which reports it as a failed start
                reply = {"error": str(exc) or type(exc).__name__}
            sock.sendall(json.dumps(reply).encode() + b"\n")
    except BaseException:  # the parent is gone mid-answer, or the set-up failed: the parent starts hosts itself
        code = 1
    finally:
        os._exit(code)
