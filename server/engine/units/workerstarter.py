"""A worker starter: one process per host process that starts the units' workers as forks of itself.

A unit's worker started as a new interpreter spends about 60 ms of CPU starting Python and importing its loops
(units/workerloop.py) before it does anything, on every unit's start and on every restart of a unit after a
crash. The starter is started once, as a new interpreter, when the host process starts (`warm`; `keel run` and
`keel resume` start it first thing, server/cli.py); it imports the worker's code in its own time, says `ready`,
and then forks one worker per request (its own loop: units/starterloop.py):
- a request is `{"argv": [subagent args...], "cwd": DIR, "env": {...}}` with four descriptors (the worker's
  stdin, stdout and stderr, and one for its exit code), one message on a SOCK_SEQPACKET socket pair; the
  answer is `{"pid": N}` or `{"error": "..."}`;
- the fork leads its own session in `cwd`, with exactly that environment and those standard streams, shows
  the worker's command line (`python -m keel.server.engine.units.subagent ...`: the starter is started with
  room for it), and runs `subagent.main`;
- the starter reaps it (a pidfd per fork) and writes its exit code (negative: the signal that ended it) to the
  exit-code descriptor, which the host reads as `ForkedProcess.wait()` (units/forkedworker.py).
The starter's own environment, which is all a fork shows in `/proc/<pid>/environ`, is PLAIN's names and room for
the run's tag: nothing of the host's secrets, whatever a provider's key variable is called. A worker whose
starter is gone while it runs takes it for its parent's death and stops; its unit is started again.
Until it has said `ready`, or once it is gone or has not answered in time (server/starterlink.py), the host
starts a worker as a new interpreter, as before. It exits when its host process does (the socket ends); a
worker it started then finds its stdin closed and stops, as it does when its host dies. This module is the
host's side, light enough for a command to import before it parses its arguments; depends on protocol and
server/starterlink.py.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from keel.server import background
from keel.server.engine.units.runtree import TAG_VAR
from keel.server.starterlink import StarterLink

MODULE = "keel.server.engine.units.subagent"  # what a worker runs
LOOP = "keel.server.engine.units.starterloop"  # what the starter runs
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
                [sys.executable, "-m", LOOP, str(theirs.fileno()), " " * ROOM],
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
        background.lower(proc.pid)  # its workers are forks of it: they inherit its nice (background.py)
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
