"""The worker starter's own process (units/workerstarter.py is the host's side): load what every fork runs,
say `ready`, then fork a worker per request and write each one's exit code once it is reaped.

    python -m keel.server.engine.units.starterloop FD ROOM

Depends on protocol, server/starterlink.py and the engine's units modules (the worker's own).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import sys
from typing import Any, NoReturn

from keel.protocol.environblock import blank_secrets, retitle, show_in_block
from keel.server import background
from keel.server.engine.units import agentfork, subagent
from keel.server.engine.units.runtree import TAG_VAR
from keel.server.engine.units.workerstarter import MODULE
from keel.server.forkend import run_and_exit
from keel.server.starterlink import READY, fd_limit


def main(argv: list[str]) -> None:
    """`python -m keel.server.engine.units.starterloop FD ROOM`: the starter's whole life."""
    sock = socket.socket(fileno=int(argv[0]))
    code = 0
    try:
        blank_secrets()  # nothing of the kind is given to it; a forked worker shows this block
        subagent.load_loops()  # what every fork runs, loaded once here
        agentfork.preload()  # and what keel's own agents run on, for the agents its forks fork in turn
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


def _worker(argv: list[str], cwd: str, env: dict[str, str], fds: list[int]) -> NoReturn:
    """The forked worker: its own session, directory, environment and standard streams, then `subagent.main`."""

    def worker() -> int:
        os.setsid()
        background.follow()  # its session's scheduling group at the nice the starter has (background.py)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.closerange(3, fd_limit())
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        retitle([sys.executable, "-m", MODULE, *argv])
        show_in_block(TAG_VAR, env.get(TAG_VAR, ""))  # its run's processes are found by this (runtree.py)
        return subagent.main(argv)

    run_and_exit(worker)


if __name__ == "__main__":
    main(sys.argv[1:])
