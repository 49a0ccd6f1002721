"""A detached mission host started by a single-threaded keel process (`keel run --detach`, `keel resume`,
`keel answer`, and the language server's engine calls, server/lsp/enginecall.py): a fork of that process,
which has keel's code loaded already.

A new interpreter (`control.spawn_host`) spends about 90 ms starting and importing what this process has
imported by now, and recovery by hand is the time until the host runs. The fork is the same host: its child
leaves the session, takes /dev/null and the mission's log as its standard streams, closes every other
descriptor it inherited, and runs `keel resume ID --plain --wait-online` through the command line's own
`main`, as the new interpreter would. It never returns into the code that forked it.

A process with more than one thread (a thread holding a lock in the parent would hold it forever in the
child) or with a store open (its environment, locks and connections are the parent's), or without fork,
starts the host as a new interpreter instead.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from keel.protocol.environblock import retitle
from keel.server import background
from keel.server.engine import control
from keel.server.engine.files import places
from keel.server.engine.units import workerstarter
from keel.server.forkend import run_and_exit
from keel.server.starterlink import fd_limit
from keel.storage.base import held_in_process


def can_fork() -> bool:
    """Whether a fork of this process may run keel: fork exists, no other thread (its locks would stay held in
    the child) and no store open (its environment, locks and connections are this process's)."""
    return hasattr(os, "fork") and threading.active_count() == 1 and not held_in_process()


def start_host(store_path: Path, mission_id: str) -> int:
    """The detached host's pid."""
    if not can_fork():
        return control.spawn_host(store_path, mission_id)
    log = places.log_path(store_path, mission_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        workerstarter.hand_over()  # the host took this process's worker starter, if it had one
        return pid
    _host(store_path, mission_id, log)


def _host(store_path: Path, mission_id: str, log: Path) -> NoReturn:
    def host() -> int:
        os.setsid()
        background.lower()  # a detached host is background work (background.py)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a host starter ignores it (hoststarter.py); a host waits
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        keep = workerstarter.adopt()  # the worker starter this process was handed, if any: the host's now
        for low, high in ((3, keep), (keep + 1, fd_limit())) if keep >= 3 else ((3, fd_limit()),):
            os.closerange(low, high)
        from keel.server.cli import main  # the command line's verbs import this module: a cycle at the top

        argv = control.host_argv(store_path, mission_id)
        # ps shows the host as `keel resume ID ...` (as far as the command line it was forked with is long), not
        # the command or server it was forked from: a `pkill -f "keel serve"` must not reach the hosts
        retitle(["keel", *argv])
        return main(argv)  # the host's own errors are handled there; run_and_exit reports the set-up's

    run_and_exit(host)
