"""The parent's end of a starter: a process that loads keel's code once and then forks what it is asked to start
(server/hoststarter.py: hosts and commands; server/engine/units/workerstarter.py: units' workers).

They speak on a SOCK_SEQPACKET socket pair, one message each way per request (JSON, with descriptors passed
alongside). The starter first says `ready` once its imports are done; until then nothing waits for it (`ask`
answers None at once and the caller starts a new interpreter). A starter that is gone, says something else, or
does not answer within TIMEOUT_S is not asked again. Depends on the standard library only.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
from collections.abc import Sequence
from typing import Any

TIMEOUT_S = 2.0
READY = b"ready"


class StarterLink:
    """Safe to use from any thread: one request at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()
        self._ready = False

    def ask(self, request: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any] | None:
        """The starter's answer; None when it is not ready yet or is gone (the caller starts a new interpreter)."""
        with self._lock:
            if self._sock is None or not (self._ready or self._readied()):
                return None
            try:
                self._sock.settimeout(TIMEOUT_S)
                socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
                reply = json.loads(self._sock.recv(1 << 16) or b"null")
            except (OSError, ValueError):
                reply = None
            if not isinstance(reply, dict):
                self._close()
                return None
            return reply

    def _readied(self) -> bool:
        """Whether its `ready` has come, without waiting for it: nothing waits for its imports."""
        assert self._sock is not None
        try:
            if not select.select([self._sock], [], [], 0)[0]:
                return False  # nothing yet
            self._ready = self._sock.recv(64) == READY
        except OSError:
            self._ready = False
        if not self._ready:
            self._close()  # it ended, or said something else: it is not asked again
        return self._ready

    def close(self) -> None:
        with self._lock:
            self._close()

    def fileno(self) -> int:
        return self._sock.fileno() if self._sock is not None else -1

    def detach(self) -> None:
        """Forget the socket without closing its descriptor (a fork's copy of its parent's link: the descriptor
        may be closed, or another's, by now)."""
        with self._lock:
            if self._sock is not None:
                self._sock.detach()
                self._sock = None

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def fd_limit() -> int:
    """The highest descriptor number a process may have, for closing every inherited one in a fork."""
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536
