"""keel's background work yields the CPU to the person at the machine: a detached host, a worker starter, a
unit's worker, and the agents and commands they start run at nice `KEEL_NICE` (10 unless set; 0 leaves them
at normal priority), so that an editor, a terminal or a build the user runs stays responsive while a fleet of
missions works. The language server and a `keel run` in the foreground keep normal priority; the processes
below the ones that chose the level inherit it.

A process that starts its own session (setsid) is, on Linux with autogroups, the first of a new scheduling
group whose nice is 0 whatever its processes' is: the CPU is shared between groups before it is shared
between their processes, so each detached host, worker and command would weigh as much as the whole editor.
Each such process's autogroup is lowered too. Lowering only: nothing here raises a priority, and where the
kernel refuses (no /proc, no autogroups) it is left as it is.
"""

from __future__ import annotations

import contextlib
import os

NICE_VAR = "KEEL_NICE"
DEFAULT_NICE = 10


def nice_level() -> int:
    """The nice value background work runs at: KEEL_NICE (0 to 19), else 10."""
    try:
        return min(19, max(0, int(os.environ.get(NICE_VAR, DEFAULT_NICE))))
    except ValueError:
        return DEFAULT_NICE


def lower(pid: int = 0, level: int | None = None) -> None:
    """Process `pid` (0: this one) and its autogroup at nice `level` (None: `nice_level()`), where they are
    not that low already. For a process in a session of its own: another's autogroup is its caller's."""
    level = nice_level() if level is None else level
    if level <= 0:
        return
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, pid) < level:
            os.setpriority(os.PRIO_PROCESS, pid, level)
    _lower_autogroup(pid, level)


def follow(pid: int = 0) -> None:
    """Process `pid` (0: this one) started a session of its own: its new autogroup takes the nice the process
    inherited. Below the process that chose the level (a detached host, a worker), this is all that is set:
    KEEL_NICE is read where the user's environment is."""
    with contextlib.suppress(OSError):
        _lower_autogroup(pid, os.getpriority(os.PRIO_PROCESS, pid))


def autogroup_nice(pid: int = 0) -> int | None:
    """The nice of `pid`'s autogroup; None where the kernel has none."""
    try:
        with open(f"/proc/{pid or 'self'}/autogroup") as f:
            return int(f.read().rsplit("nice", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def _lower_autogroup(pid: int, level: int) -> None:
    now = autogroup_nice(pid)
    if now is None or now >= level:
        return
    with contextlib.suppress(OSError), open(f"/proc/{pid or 'self'}/autogroup", "w") as f:
        f.write(str(level))
