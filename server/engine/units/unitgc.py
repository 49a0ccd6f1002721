"""Unit sandbox collection for `keel gc`: the worktrees and branches of units whose work is merged.

Each unit works in its own sandbox (`.keel/sandboxes/<mission>-units/<lane>`, a git worktree on
`keel/<mission>-units/<lane>`, or a copy) and stays there after it finished. Nothing reads it again once
the unit succeeded and its lease says merged: its commit is reachable from the mission branch, a restore
or a fork starts every unfinished unit on a new lane with a new sandbox, and an export carries only units
not yet succeeded. Those sandboxes and branches are removed, and so are those of lanes no lease names any
more (a restore or a re-execution moved their unit to a new lane); everything else is kept: a unit that is not
finished, a lease that is not merged (a skipped merge too), a branch with commits the mission branch lacks,
a path outside the mission's units folder, and every unit of a mission whose host is alive. The mission's
host lock is held while its sandboxes go, so no host can start in the middle. Only keel's own worktrees
and `refs/heads/keel/<mission>-units/*` are written: never the person's checkout, their branches, or
.git/config (branches go with `git update-ref -d`, which leaves config alone). Depends on storage and
the engine's merge, places, sandbox, hostlock and control modules; never on the language server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from keel.protocol.records import MissionRecord, UnitLease
from keel.protocol.states import UnitState
from keel.server.engine.files import merge, places
from keel.server.engine.files.sandbox import git_toplevel
from keel.server.engine.hostlock import HostBusyError, HostLock, host_alive
from keel.storage import Store, Txn, leases
from keel.storage import missions as m


class UnitGcItem(msgspec.Struct, frozen=True):
    mission: str
    unit: str
    kind: str  # "sandbox" | "base record" (the file digests a sandbox started from) | "branch"
    name: str  # the sandbox's path or the branch's name
    bytes: int = 0
    reason: str = ""  # why it is kept (kept items only)


class UnitGcReport(msgspec.Struct):
    removed: list[UnitGcItem] = []
    kept: list[UnitGcItem] = []
    running: list[str] = []  # missions left alone: their host is alive
    bytes_freed: int = 0
    dry_run: bool = False


@dataclass
class _Plan:
    repo: Path | None  # where git commands about the mission's worktrees run
    remove: list[UnitGcItem] = field(default_factory=list)
    kept: list[UnitGcItem] = field(default_factory=list)
    tips: dict[str, str] = field(default_factory=dict)  # branch -> its commit, checked to be merged


def collect(store: Store, store_path: Path, *, dry_run: bool = False) -> UnitGcReport:
    """Remove (or, dry run, list) the sandboxes and branches of every finished, merged unit."""
    report = UnitGcReport(dry_run=dry_run)
    for record in store.read(m.list_missions):
        if not store.read(lambda t, mid=record.id: leases.list_leases(t, mid)):  # type: ignore[misc]
            continue
        lock = HostLock(places.lock_path(store_path, record.id), record.id)
        if host_alive(record) or lock.held_elsewhere():
            report.running.append(record.id)
            continue
        try:
            if not dry_run:
                lock.acquire()  # no host starts while its units' sandboxes go
            plan = _plan(store, store_path, record.id)
            if not dry_run:
                _remove(plan, store_path, record.id)
        except HostBusyError:
            report.running.append(record.id)
            continue
        finally:
            lock.release()
        report.removed += plan.remove
        report.kept += plan.kept
    report.bytes_freed = sum(item.bytes for item in report.removed)
    return report


def _plan(store: Store, store_path: Path, mission_id: str) -> _Plan:
    def read(txn: Txn) -> tuple[MissionRecord, dict[str, UnitState], list[UnitLease]]:
        head = m.head_checkpoint(txn, mission_id)
        marks = {uid: mark.state for uid, mark in (head.units.items() if head else ())}
        return m.get_mission(txn, mission_id), marks, leases.list_leases(txn, mission_id)

    record, marks, held = store.read(read)
    repo = _repo(store_path, record)
    units_root = places.unit_sandbox_path(store_path, mission_id, "x").parent
    plan = _Plan(repo)
    for lease in held:
        sandbox = Path(lease.place.sandbox) if lease.place.sandbox else None
        sandbox = sandbox if sandbox is not None and (sandbox.exists() or sandbox.is_symlink()) else None
        branch = lease.place.branch if lease.place.branch.startswith(f"keel/{mission_id}-units/") else ""
        tip = _tip(repo, branch) if repo is not None and branch else ""
        items = (_sandbox_items(mission_id, lease.unit, sandbox) if sandbox else []) + (
            [UnitGcItem(mission_id, lease.unit, "branch", branch)] if tip else []
        )
        why = _needed(lease, marks.get(lease.unit), sandbox, units_root, repo, tip, mission_id)
        if why:
            plan.kept += [msgspec.structs.replace(item, bytes=0, reason=why) for item in items]
            continue
        plan.remove += items
        if tip:
            plan.tips[branch] = tip
    _superseded(plan, mission_id, units_root, held)
    return plan


def _superseded(plan: _Plan, mission_id: str, units_root: Path, held: list[UnitLease]) -> None:
    """Sandboxes, base records and branches of lanes no lease names: a restore, a fork's parent or a
    re-execution started their unit on a new lane, and nothing reads an old lane's folder again (a point
    inside the unit gets its files from the lane's snapshots in the store)."""
    named = {Path(lease.place.sandbox).name for lease in held if lease.place.sandbox}
    branches = {lease.place.branch for lease in held}
    for path in sorted(units_root.iterdir()) if units_root.is_dir() else ():
        sandbox = path.name.removesuffix(".base.json")
        if sandbox in named or (path.name != sandbox and (units_root / sandbox).exists()):
            continue  # a lease's folder, or the base record of a folder that is itself listed
        if path.name == sandbox:
            plan.remove += _sandbox_items(mission_id, sandbox, path)
        else:
            plan.remove.append(UnitGcItem(mission_id, sandbox, "base record", str(path), _size(path)))
    if plan.repo is None:
        return
    prefix = f"refs/heads/keel/{mission_id}-units/"
    listed = merge.git(plan.repo, "for-each-ref", "--format=%(refname) %(objectname)", prefix, check=False)
    for line in listed.stdout.splitlines():
        ref, _, tip = line.partition(" ")
        branch = ref.removeprefix("refs/heads/")
        if branch not in branches:
            plan.remove.append(UnitGcItem(mission_id, branch.rsplit("/", 1)[-1], "branch", branch))
            plan.tips[branch] = tip


def _sandbox_items(mission_id: str, unit: str, sandbox: Path) -> list[UnitGcItem]:
    """A sandbox and, when it has one, its base record (`merge.base_file`): they go together."""
    base = merge.base_file(sandbox)
    return [UnitGcItem(mission_id, unit, "sandbox", str(sandbox), _size(sandbox))] + (
        [UnitGcItem(mission_id, unit, "base record", str(base), _size(base))] if base.exists() else []
    )


def _needed(
    lease: UnitLease,
    state: UnitState | None,
    sandbox: Path | None,
    units_root: Path,
    repo: Path | None,
    tip: str,
    mission_id: str,
) -> str:
    """Why a unit's sandbox and branch must stay ('' when nothing needs them any more)."""
    if state != UnitState.SUCCEEDED:
        return f"unit {lease.unit} is {state.value if state else 'not in the mission'}, not finished"
    if lease.state != "done" or not lease.place.merged:
        return f"unit {lease.unit}'s work is not merged into the mission branch"
    if sandbox is not None and not sandbox.resolve().is_relative_to(units_root.resolve()):
        return f"{sandbox} is not inside the mission's units folder {units_root}"
    if sandbox is not None and merge.is_git(sandbox) and repo is None:
        return f"no git repository to remove the worktree {sandbox} from"
    if (
        tip
        and repo is not None
        and merge.git(repo, "merge-base", "--is-ancestor", tip, f"refs/heads/keel/{mission_id}", check=False).returncode
        != 0
    ):
        return f"its branch has commits that are not on keel/{mission_id}"
    return ""


def _remove(plan: _Plan, store_path: Path, mission_id: str) -> None:
    repo = plan.repo
    for item in plan.remove:
        if item.kind == "sandbox":
            merge.remove_sandbox(Path(item.name), repo)
        elif item.kind == "base record":
            Path(item.name).unlink(missing_ok=True)
    for branch, tip in plan.tips.items():
        if repo is not None:
            merge.git(repo, "update-ref", "-d", f"refs/heads/{branch}", tip)
    units_root = places.unit_sandbox_path(store_path, mission_id, "x").parent
    if units_root.is_dir() and not any(units_root.iterdir()):
        units_root.rmdir()


def remove_mission_sandbox(store_path: Path, record: MissionRecord) -> None:
    """A deleted mission's own sandbox (worktree or copy); its branch stays."""
    path = Path(record.sandbox or places.sandbox_path(store_path, record.id))
    repo = git_toplevel(Path(record.workspace)) if Path(record.workspace).is_dir() else None
    if path.exists() or path.is_symlink():
        merge.remove_sandbox(path, repo)


def _repo(store_path: Path, record: MissionRecord) -> Path | None:
    """Where git commands about the mission's worktrees run: its sandbox, else the workspace's repo."""
    sandbox = Path(record.sandbox or places.sandbox_path(store_path, record.id))
    if merge.is_git(sandbox):
        return sandbox
    return git_toplevel(Path(record.workspace)) if Path(record.workspace).is_dir() else None


def _tip(repo: Path, branch: str) -> str:
    proc = merge.git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def describe(report: UnitGcReport) -> list[str]:
    """One line per removed (or kept) item and a summary, for `keel gc`."""
    verb = "would remove" if report.dry_run else "removed"
    lines = [
        f"  {verb} unit {item.kind} {item.name} (mission {item.mission}, unit {item.unit}"
        + (f", {item.bytes} bytes)" if item.kind == "sandbox" else ")")
        for item in report.removed
    ]
    lines += [f"  kept unit {item.kind} {item.name}: {item.reason}" for item in report.kept]
    lines += [f"  left mission {mid} alone: its host is running" for mid in report.running]
    sandboxes = sum(1 for item in report.removed if item.kind == "sandbox")
    branches = sum(1 for item in report.removed if item.kind == "branch")
    lines.append(
        f"gc {verb} {sandboxes} unit sandboxes and {branches} unit branches "
        f"({report.bytes_freed} bytes freed); kept {len(report.kept)}"
    )
    return lines
