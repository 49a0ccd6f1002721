"""Stopping the detached mission hosts a test started (the editor tests' shared clean-up), and what /proc shows of
keel's processes: a process's live children by title, the processes it watches through pidfds."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from keel.storage import Store
from keel.storage import missions as m
from keel.storage.location import store_exists


def kill_hosts(store_path: Path) -> None:
    """SIGKILL every mission host recorded in the store (and its agents: a host leads its process group)."""
    if not store_exists(store_path):
        return
    with Store.open(store_path) as store:
        records = store.read(m.list_missions)
    for record in records:
        if record.host is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.host.pid, signal.SIGKILL)


def children(pid: int, title: bytes) -> list[int]:
    """The live children of `pid` whose command line starts with `title` (a keel starter shows `keel\0host-starter`
    or `keel\0worker-starter` once it is ready)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes().rpartition(b")")[2].split()  # state, ppid, ...
                if stat[0] != b"Z" and int(stat[1]) == pid and (entry / "cmdline").read_bytes().startswith(title):
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def pidfds(pid: int) -> set[int]:
    """The processes `pid` holds a pidfd of (/proc/PID/fdinfo shows a pidfd's process as `Pid:`)."""
    found = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            found |= {int(line.split()[1]) for line in info.read_text().splitlines() if line.startswith("Pid:")}
        except (OSError, IndexError, ValueError):
            continue
    return found
