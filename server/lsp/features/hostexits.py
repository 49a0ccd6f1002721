"""The exits of mission hosts on this machine, as events: supervision wakes the moment a host it watches exits.

A pidfd (Linux 5.3 and later) becomes readable when its process exits, and the event loop watches it like
any other file descriptor. A pidfd is opened for the pid a mission record names, and only then is that
process checked to be the recorded host (`hostlock.host_runs`: the pid's start time); so a pid reused by
another process never stands for the host. A host that is slow, stopped or silent never makes its pidfd
readable: only its exit does. Without pidfds (another system, an old kernel) nothing wakes supervision
early and it ticks as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable

from keel.protocol.records import HostInfo
from keel.server.engine.hostlock import host_runs
from keel.server.lsp.snapshot import MissionView


class HostExits:
    """Watches the local hosts supervision is told about; `wait` returns early when one of them exits."""

    def __init__(self) -> None:
        self._fds: dict[HostInfo, int] = {}  # a watched host -> its pidfd
        self._gone: set[HostInfo] = set()  # hosts seen dead (or not watchable): not opened again
        self._ended: set[HostInfo] = set()  # hosts whose pidfd told of their exit (a subset of _gone)
        self._woken = asyncio.Event()
        self._usable = hasattr(os, "pidfd_open")

    async def wait(self, seconds: float) -> None:
        """Until `seconds` have passed or a watched host has exited since the last wait."""
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that arrives as its time runs
        # out, and supervision's loop, which waits here many times a second while a host is found gone, would
        # then never stop: the server would not exit after its client went away
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._woken.wait()
        self._woken.clear()

    def watch(self, views: Iterable[MissionView]) -> None:
        """Watch the recorded hosts of these missions (those on this machine and alive), and no others."""
        wanted = {v.record.host for v in views if v.record.host is not None and _local(v.record.host)}
        for host in [h for h in self._fds if h not in wanted]:
            self._forget(host)
        self._gone &= wanted
        self._ended &= wanted
        if self._usable:
            for host in wanted - self._fds.keys() - self._gone:
                self._open(host)

    def exited(self, host: HostInfo | None) -> bool:
        """Whether this host's own exit was seen (not merely a pid found missing): it will not come back."""
        return host in self._ended

    def close(self) -> None:
        for host in list(self._fds):
            self._forget(host)

    def _open(self, host: HostInfo) -> None:
        try:
            fd = os.pidfd_open(host.pid)
        except ProcessLookupError:
            self._gone.add(host)
            return
        except OSError:  # pidfds not supported here: supervision's ticks alone notice exits
            self._usable = False
            return
        if not host_runs(host):  # the pid exited already, or is another process's now
            os.close(fd)
            self._gone.add(host)
            return
        self._fds[host] = fd
        asyncio.get_running_loop().add_reader(fd, self._exited, host)

    def _exited(self, host: HostInfo) -> None:
        self._forget(host)
        self._gone.add(host)
        self._ended.add(host)
        self._woken.set()

    def _forget(self, host: HostInfo) -> None:
        fd = self._fds.pop(host, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)


def _local(host: HostInfo) -> bool:
    return not host.hostname or host.hostname == os.uname().nodename
