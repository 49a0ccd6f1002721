"""This machine's processes as /proc shows them: whether one is alive, which carry a tag in their
environment, which are below another; and killing them until they are gone.

A process that is a zombie counts as gone everywhere here: it can make no effect. Used by a `run`
command's cleanup (server/tools/shell.py) and a unit run's (server/engine/units/runtree.py). Depends on the
standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def process_running(pid: int) -> bool:
    """Whether `pid` is alive: running or stopped, not a zombie and not gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_tagged(var: str, prefix: str, wait_s: float = 5.0, *, keep: str = "") -> list[int]:
    """Kill every process on this machine whose environment has `var` with a value starting with `prefix`
    (but not the value `keep`), with its process group, and wait until they are gone; again while a look
    finds more (a child forked meanwhile). Returns the pids it killed."""
    needle, spared = f"{var}={prefix}".encode(), f"{var}={keep}".encode()
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    while (found := _tagged(needle, spared if keep else b"")) and time.monotonic() < deadline:
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill_group(os.getpgid(pid))
                os.kill(pid, signal.SIGKILL)
        while time.monotonic() < deadline and any(process_running(pid) for pid in found):
            time.sleep(0.01)
        killed += found
    return killed


def _tagged(needle: bytes, spared: bytes) -> list[int]:
    """Live processes (not this one) with an environment entry starting with `needle` that is not `spared`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        tagged = any(item.startswith(needle) and item != spared for item in environ.split(b"\0"))
        if tagged and process_running(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_descendants(pid: int, wait_s: float = 10.0) -> None:
    """SIGKILL every live process below `pid` until none is left: what a killed process leaves comes to the
    next subreaper up, which `pid` is when it has made itself one (else those are out of reach)."""
    deadline = time.monotonic() + wait_s
    while (below := descendants(pid)) and time.monotonic() < deadline:
        for victim in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.01)


def descendants(pid: int) -> list[int]:
    """Live processes below `pid` (zombies left out, the processes below them not)."""
    table = _table()
    below: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        below.setdefault(parent, []).append(child)
    found, todo = [], list(below.get(pid, []))
    while todo:
        current = todo.pop()
        if table[current][1] != "Z":
            found.append(current)
        todo.extend(below.get(current, []))
    return found


def zombie_children(pid: int) -> list[int]:
    """Children of `pid` that have exited and wait to be reaped."""
    return [child for child, (parent, state) in _table().items() if parent == pid and state == "Z"]


def _table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process, from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table
