"""keel's own agents (`python -m keel.agents.NAME ...`) started as forks of their unit's worker.

A new interpreter spends about 60 ms of CPU, and as long of the unit's start and of its recovery, starting Python
and importing asyncio and the agent SDK before it reads its first frame. A worker forked by its starter
(units/workerstarter.py) has both loaded: the starter loads the SDK with the worker's own code (`preload`).

The fork is the process the new interpreter would be: its own process group in the worker's session and cgroup,
working in the sandbox, with the environment the worker gives its agent, the pipes as stdin and stdout and the
worker's stderr, and nothing else open. It shows the agent's command line, `sys.path[0]` is the sandbox (as `-m`
makes it), and it runs the module as `__main__` and exits with its code. It forks only where nothing would start
differently: the command names this interpreter and a module of keel.agents, and the environment sets no PYTHON*
variable that changes how an interpreter starts (PYTHONPATH, PYTHONHASHSEED, ...), which a fork cannot honour.
Anything else, an outside agent or a worker with a second thread, is started as a new interpreter.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, NoReturn, Protocol

from keel.protocol.environblock import retitle
from keel.server.forkend import run_and_exit
from keel.server.starterlink import fd_limit

PACKAGE = "keel.agents."
# set or not, these change nothing of how keel's agents run: they may be in the environment of a fork
SAME_EITHER_WAY = frozenset({"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"})


class AgentChild(Protocol):
    """What a worker uses of its agent's process: a subprocess.Popen, or a ForkedAgent."""

    pid: int
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None

    def wait(self, timeout: float | None = None) -> int: ...


def preload() -> None:
    """In the worker starter: the SDK that keel's agents run on, loaded once for every fork."""
    with contextlib.suppress(ImportError):
        importlib.import_module(PACKAGE + "sdk")


def module_of(command: list[str], env: dict[str, str]) -> str | None:
    """The keel agent module a fork may run for `command` in `env` (None: start a new interpreter)."""
    if len(command) < 3 or command[0] != sys.executable or command[1] != "-m" or not command[2].startswith(PACKAGE):
        return None
    if any(name.startswith("PYTHON") and name not in SAME_EITHER_WAY for name in env):
        return None
    return command[2] if hasattr(os, "pidfd_open") and threading.active_count() == 1 else None


class ForkedAgent:
    """The agent forked by this worker, with the parts of subprocess.Popen that the worker uses."""

    def __init__(self, pid: int, args: list[str], stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid = pid
        self.args = args
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)
        self._lock = threading.Lock()

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (negative: the signal that ended it); subprocess.TimeoutExpired after `timeout`."""
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._reap()
        assert self.returncode is not None
        return self.returncode

    def _reap(self) -> None:
        with self._lock:
            if self.returncode is None:
                try:
                    self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
                except ChildProcessError:  # reaped by someone else: its code is lost, as Popen takes it
                    self.returncode = 0


def start(command: list[str], sandbox: Path, env: dict[str, str]) -> ForkedAgent | None:
    """The agent as a fork of this process, or None when it must be a new interpreter."""
    module = module_of(command, env)
    if module is None:
        return None
    to_agent, from_agent = os.pipe(), os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _run(module, command, sandbox, env, to_agent[0], from_agent[1])
    with contextlib.suppress(OSError):  # as the child does: its group exists before this returns (a kill finds it)
        os.setpgid(pid, pid)
    os.close(to_agent[0])
    os.close(from_agent[1])
    return ForkedAgent(pid, command, os.fdopen(to_agent[1], "wb", 0), os.fdopen(from_agent[0], "rb", 0))


def _run(module: str, command: list[str], sandbox: Path, env: dict[str, str], stdin: int, stdout: int) -> NoReturn:
    """The fork: set up as a new interpreter would be, then the agent's module as `__main__`."""

    def agent() -> None:
        os.setpgid(0, 0)
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.closerange(3, fd_limit())
        os.chdir(sandbox)
        os.environ.clear()
        os.environ.update(env)
        retitle(command)
        _fresh_stdio(unbuffered=bool(env.get("PYTHONUNBUFFERED")))
        sys.path[0] = str(sandbox)
        sys.argv = [module, *command[3:]]  # run_module puts the module's file in argv[0]
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)

    run_and_exit(agent)


def _fresh_stdio(unbuffered: bool) -> None:
    """Standard streams over descriptors 0, 1 and 2, as an interpreter starts with them: none of the worker's
    objects (nothing they buffered), the same encodings."""
    was = sys.stdin, sys.stdout, sys.stderr
    stdin = open(0, encoding=was[0].encoding, errors=was[0].errors, closefd=False)  # noqa: SIM115
    out = 1 if unbuffered else -1
    stdout = open(1, "w", out, was[1].encoding, was[1].errors, closefd=False)  # noqa: SIM115
    stderr = open(2, "w", 1, was[2].encoding, was[2].errors, closefd=False)  # noqa: SIM115
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = stdin, stdout, stderr  # type: ignore[misc]  # an agent may use these
