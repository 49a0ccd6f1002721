"""Every process of a unit's run on this machine, contained: none outlives the run's end or a judgement of it.

A unit's run is its worker process (subagent.py) and everything below it: its agent (keel's own, or the
ACP bridge with an outside agent), the agent's shells and whatever those start, also what leaves its
process group or session (setsid, a double fork). Such a process could make an effect after keel asked a
person whether that effect happened, so each way a run ends, and each judgement of an effect in doubt,
first ends the run's processes and waits until they are gone:

- a cgroup v2 per run, `<root>/<unit key>/<epoch>` (`cgroup_root`: KEEL_CGROUP_ROOT, else `keel` in the
  machine's cgroup2 hierarchy, where keel may make folders there): the host makes it, the worker moves
  itself into it before it starts its agent, and no process started below can leave it. It is killed by
  `cgroup.kill` (or SIGKILL of each member, on kernels without it) and gone once `cgroup.events` says
  `populated 0`; a killed host leaves it behind, named by the unit, for the next host to kill.
- a tag in the environment, `KEEL_UNIT_RUN=<unit key>/<epoch>`, which every process below the worker
  inherits (the ACP bridge passes it to the outside agent, which passes its environment to its shell):
  found in `/proc/*/environ`, also after its parents died. It is what holds where no cgroup may be made;
  a process that starts itself with a new environment leaves it, never a cgroup.
- the worker is a child subreaper: what its agent orphans stays below it, and its way out kills it all.

The unit key names the store's folder, the mission and the unit, so that runs of another store on this
machine are never touched. Depends on the standard library and server/processes.py only.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import time
from pathlib import Path
from typing import NamedTuple

from keel.protocol.hashes import blake2b
from keel.server.processes import kill_descendants, kill_tagged, zombie_children

TAG_VAR = "KEEL_UNIT_RUN"
ROOT_VAR = "KEEL_CGROUP_ROOT"  # a folder of a cgroup2 hierarchy for keel's runs; empty: no cgroups
PR_SET_CHILD_SUBREAPER = 36
GONE_S = 10.0  # how long a kill waits for the run's processes to be gone
PRUNE_S = 60.0  # an empty run cgroup older than this is a leftover of a killed host or worker


@functools.cache
def cgroup_root() -> Path | None:
    """Where keel makes its runs' cgroups, or None where it may not: KEEL_CGROUP_ROOT when set (empty: never),
    else `keel` at the top of this machine's cgroup2 hierarchy, made if keel may."""
    if ROOT_VAR in os.environ:
        named = os.environ[ROOT_VAR]
        return Path(named) if named and _usable(Path(named)) else None
    mount = _cgroup2_mount()
    if mount is None:
        return None
    root = mount / "keel"
    return root if _usable(root) else None


def _cgroup2_mount() -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split(" ")[4])
    return None


def _usable(root: Path) -> bool:
    try:
        root.mkdir(exist_ok=True)
    except OSError:
        return False
    return os.access(root / "cgroup.procs", os.W_OK) and os.access(root, os.W_OK)


def unit_key(store_path: Path, mission_id: str, unit_id: str) -> str:
    """`<mission>-<digest of the store's folder and the unit>`: one name per unit of a store, safe as a
    folder name and in an environment variable."""
    h = blake2b(f"{Path(store_path).resolve()}\0{unit_id}".encode(), digest_size=8, person=b"keel-run")
    return f"{mission_id}-{h.hexdigest()}"


class RunTree(NamedTuple):  # not a dataclass: a worker imports this module before it starts its agent
    """One run of a unit here: its tag, and its cgroup where this machine lets keel make one."""

    key: str
    epoch: int

    @property
    def tag(self) -> str:
        return run_tag(self.key, self.epoch)

    @property
    def cgroup(self) -> Path | None:
        root = cgroup_root()
        return None if root is None else root / self.key / str(self.epoch)

    def prepare(self) -> Path | None:
        """Make the run's cgroup (before its worker starts); None where there is none. Emptied cgroups that a
        killed host or worker left (of any unit: a mission may never run again) are removed first."""
        group = self.cgroup
        if group is None:
            return None
        prune(group.parent.parent)
        try:
            group.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return group

    def end(self) -> None:
        """Kill every process of this run and wait until they are gone."""
        end_runs(self.key, only=self.epoch)

    def end_others(self) -> None:
        """Kill every process of the unit's other runs here (earlier ones, a fenced one) and wait until they
        are gone; this run's own are left alone."""
        end_runs(self.key, keep=self.epoch)


def run_tag(key: str, epoch: int) -> str:
    return f"{key}/{epoch}/"  # the closing slash: a prefix of one run's tag is never another run's


def end_runs(key: str, *, only: int | None = None, keep: int | None = None) -> None:
    """Kill every process of the unit `key`'s runs on this machine (only run `only`'s; all but run `keep`'s),
    by cgroup and by tag, and wait until they are gone. Emptied cgroups are removed."""
    root = cgroup_root()
    unit = root / key if root is not None else None
    if unit is not None and unit.is_dir():
        for group in sorted(p for p in unit.iterdir() if p.is_dir()):
            if group.name != str(keep) and only in (None, int(group.name) if group.name.isdigit() else None):
                _kill_cgroup(group)
        with contextlib.suppress(OSError):
            unit.rmdir()  # fails while a run's cgroup is left in it
    prefix = f"{key}/" if only is None else run_tag(key, only)
    kill_tagged(TAG_VAR, prefix, GONE_S, keep="" if keep is None else run_tag(key, keep))


def prune(root: Path) -> None:
    """Remove the runs' cgroups under `root` that hold no process and were made over PRUNE_S ago (a cgroup
    just made for a worker about to enter it is left alone); a cgroup with a process in it cannot be removed."""
    now = time.time()
    with contextlib.suppress(OSError):
        for unit in [p for p in root.iterdir() if p.is_dir()]:
            with contextlib.suppress(OSError):
                for group in [p for p in unit.iterdir() if p.is_dir()]:
                    if now - group.stat().st_mtime > PRUNE_S and not _populated(group):
                        with contextlib.suppress(OSError):
                            group.rmdir()
                unit.rmdir()  # fails while a run's cgroup is left in it


def _kill_cgroup(group: Path) -> None:
    """SIGKILL every process in `group` and wait until it holds none; then remove it."""
    kill = group / "cgroup.kill"
    deadline = time.monotonic() + GONE_S
    while _populated(group) and time.monotonic() < deadline:
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
        else:  # a kernel before 5.14: one member at a time (a fork meanwhile is caught the next time round)
            for pid in _members(group):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        group.rmdir()


def _populated(group: Path) -> bool:
    try:
        return "populated 1" in (group / "cgroup.events").read_text()
    except OSError:
        return False


def _members(group: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    return []


# -- in the worker -----------------------------------------------------------------------------------
def enter(cgroup: str) -> str:
    """Put this process (a unit's worker, before it starts anything) in its run's cgroup, and make it the
    reaper of its orphaned descendants. Returns why it is not in the cgroup ("" when it is)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    if not cgroup:
        return ""
    try:
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        return f"cannot enter cgroup {cgroup}: {exc.strerror}; its processes are found by {TAG_VAR}"
    return ""


def end_descendants(spare: int = 0) -> None:
    """SIGKILL every process below this one until none is left (a killed process's children come to this
    one, a subreaper), and reap those it adopted; `spare`: a child whose exit status its owner reaps."""
    me = os.getpid()
    kill_descendants(me, GONE_S)
    for pid in zombie_children(me):
        if pid != spare:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
