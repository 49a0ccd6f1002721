"""The host's side of the subagent registry: unit sandboxes, leases, takeover, recovery and merging.

Each running unit gets a lease (storage/leases.py) with a new epoch every time a worker starts for it,
and its own sandbox (placement.py: where it is, and making it). While the host runs, `watch` turns a
lease whose heartbeat went stale into `resumable` and the unit is started again under a new epoch; the
old worker is left alone, fenced.
When a host starts, `recover` looks at every unfinished unit's lease: a stale worker still alive on this
machine is terminated; a completion a subagent recorded is taken over as the unit's result; a unit whose
sandbox is missing, or whose files no longer match the digest recorded with its last journal entry, is
re-executed from scratch on a new journal lane, with evidence saying why. Before that, the mission
sandbox is settled (what a kill left of a merge; files a restore put there), and keel's temporary files a
write killed half-way left are removed from the sandboxes recovered. A finished unit that does not
merge asks the person (`merge-conflict`). Depends on storage and the engine's merge, trees, placement,
journal, restore and interface modules; sees the host only through interface.Host and never imports the host or
unitrun modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import tempfile
import time
from pathlib import Path

import msgspec

from keel.protocol.records import (
    CheckpointManifest,
    Event,
    Evidence,
    Placement,
    Question,
    UnitLease,
    WorkerOffer,
    WorkerPlace,
)
from keel.protocol.states import LeaseState, QuestionKind, Resolution, UnitState
from keel.server.engine import faultpoints
from keel.server.engine.agentproc import AgentProcess, kill_session
from keel.server.engine.files import merge, trees
from keel.server.engine.files.merge import MergeConflict
from keel.server.engine.interface import Host, LeasedWorker, TxnFn
from keel.server.engine.journal import fresh_epoch, lane
from keel.server.engine.restore import check_restored_files
from keel.server.engine.units import placement
from keel.server.engine.units.placement import PreparedSandbox
from keel.server.engine.units.runtree import end_runs, unit_key
from keel.server.engine.units.unitrecovery import LeaseFacts, Recovery, ask_choices, checked, recovery
from keel.server.processes import kill_tagged, process_running
from keel.server.tools.shell import OWNER_VAR, command_owner
from keel.storage import Store, Txn, leases
from keel.storage import missions as m
from keel.storage.reach import Reach, gap_for

DEFAULT_TTL_S = 10.0


def lease_ttl() -> float:
    """Unit leases' ttl: KEEL_LEASE_TTL_S, or DEFAULT_TTL_S."""
    return float(os.environ.get("KEEL_LEASE_TTL_S", DEFAULT_TTL_S))


class Registry:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.ttl = lease_ttl()
        self.zombies: list[tuple[str, AgentProcess]] = []  # (unit, its fenced worker)
        # one change of the mission sandbox at a time (a merge, a unit sandbox made from it), and none while a
        # checkpoint takes its snapshot
        self.git_lock = asyncio.Lock()
        self._files = trees.Snapshotter()  # fresh unit sandboxes' snapshots (their base_tree)

    @property
    def mission_id(self) -> str:
        return self.host.mission_id

    def lane_of(self, uid: str) -> str:
        return lane(uid, self.host.graph.mark(uid).epoch)

    def _lease(self, uid: str) -> UnitLease | None:
        return self.host.store.read(lambda t: leases.get(t, self.mission_id, uid))

    # -- starting a worker --------------------------------------------------------------------------
    async def completed(self, uid: str) -> UnitLease | None:
        """The unit's lease when a run of its lane recorded the unit's completion and its files are at hand
        (a worker fenced by a take-over may still finish before a new epoch is granted): the unit is then
        taken over as finished, as a recovering host takes one, and its agent is not started again."""
        faultpoints.pause_here("UNIT_START")  # crash tests: a unit about to start, its lease not yet read
        held = await asyncio.to_thread(self._lease, uid)
        if held is None or held.state != LeaseState.DONE or await self._decide(held) != Recovery.FINISHED:
            return None
        return held

    async def prepare(self, uid: str) -> PreparedSandbox:
        """The unit's sandbox: the one its lane already has (made again from its snapshots when the lane has
        steps and the folder is not here), or a fresh one from the mission branch."""
        unit_lane, store_path = self.lane_of(uid), self.host.store_path
        lease = await asyncio.to_thread(self._lease, uid)
        kept = await asyncio.to_thread(placement.reuse, store_path, self.mission_id, unit_lane, lease)
        if kept is not None:
            return kept
        if lease is not None and placement.has_steps(unit_lane, lease):
            async with self.git_lock:
                return await asyncio.to_thread(placement.remade, self.host.store, store_path, self.mission_id, lease)
        async with self.git_lock:
            base = await asyncio.to_thread(
                placement.branch_off, self.host.sandbox, store_path, self.mission_id, unit_lane
            )
        return await asyncio.to_thread(placement.fill, store_path, self.mission_id, unit_lane, base)

    async def grant(self, uid: str, where: PreparedSandbox) -> UnitLease:
        unit_lane = self.lane_of(uid)

        def write(txn: Txn) -> UnitLease:
            old = leases.get(txn, self.mission_id, uid)
            was = old.place if old is not None and old.lane == unit_lane else Placement()
            same = old is not None and old.lane == unit_lane and was.sandbox == where.sandbox
            # a worker started again on the same lane keeps the digest of the lane's last recorded change:
            # the prepared digest is from before this run's steps and would make the sandbox look tampered
            tree = was.tree if same else where.tree
            base_tree = was.base_tree if same else ""
            if where.scan is not None:
                tree = base_tree = (where.files or self._files).store_txn(txn, Path(where.sandbox), where.scan)
            mark = was.last_checkpoint if same else 0
            place = Placement(  # the lane's newest save is the lane's, whatever its sandbox
                where.sandbox,
                where.branch,
                where.base,
                tree,
                base_tree,
                mark,
                saved_at=was.saved_at,
                copied=where.copied,
            )
            return leases.grant(
                txn, self.mission_id, uid, lane=unit_lane, host_id=self.host.host_id, ttl_s=self.ttl, place=place
            )

        lease: UnitLease = await self.host.writer.commit(write)
        return lease

    # -- while the host runs --------------------------------------------------------------------------
    async def watch(self) -> None:
        """Take over units whose worker stopped heartbeating (it is fenced, not killed)."""
        period = max(0.05, self.ttl / 4)
        reach = Reach(gap_for(self.ttl) + period)  # a store outage silences every worker: no evidence of a dead one
        while True:
            await asyncio.sleep(period)
            if not any(session.proc is not None for session in self.host.sessions.values()):
                continue  # no worker process of this host's to judge (a waiting mission's units are offered)
            started = time.monotonic()
            held_now, now = await asyncio.to_thread(
                self.host.store.read, lambda t: (leases.list_leases(t, self.mission_id), t.clock())
            )
            since = reach.note(started, now)
            current = {x.unit: x for x in held_now}
            for uid, session in list(self.host.sessions.items()):
                held = current.get(uid)
                live = session.proc is not None
                if held and held.epoch == session.epoch and live and leases.expired(held, now, since):
                    await self._take_over(session, held, now - held.heartbeat)

    async def _take_over(self, session: LeasedWorker, held: UnitLease, silent_s: float) -> None:
        proc = session.expire()
        if proc is not None:
            self.zombies.append((held.unit, proc))
        event = Event(
            kind="lease",
            at=time.time(),
            unit=held.unit,
            state="expired",
            message=f"lease epoch {held.epoch} (pid {held.pid}) expired: no heartbeat for "
            f"{silent_s:.1f} s; the unit is resumable",
        )

        def write(txn: Txn) -> None:
            with contextlib.suppress(leases.StaleLeaseError):
                leases.expire(txn, self.mission_id, held.unit, held.epoch)
            m.add_event(txn, self.mission_id, event)

        await self.host.writer.commit(write)
        self.host.progress.line(event.message)

    async def close(self) -> None:
        """The host stops: its fenced workers are killed, with every process of their runs (runtree.py)."""
        for uid, proc in self.zombies:
            with contextlib.suppress(Exception):
                await proc.kill()
            await asyncio.to_thread(end_runs, unit_key(self.host.store_path, self.mission_id, uid))
        self.zombies.clear()

    # -- after a restart ------------------------------------------------------------------------------
    async def move_here(self) -> None:
        """The mission moved to this machine: every unfinished unit's lease points at a sandbox made here
        from the store (placement.make_here), or at a folder that does not exist here when that cannot be done. A unit
        offered to `keel worker`s, or held by one, is not on the lost machine: remote.py follows it."""
        graph = self.host.graph
        held_all = await asyncio.to_thread(self.host.store.read, lambda t: leases.list_leases(t, self.mission_id))
        for held in held_all:
            uid = held.unit
            if uid not in graph.units or graph.mark(uid).state == UnitState.SUCCEEDED or held.lane != self.lane_of(uid):
                continue
            if held.worker or held.state == LeaseState.OFFERED:
                continue
            await self.bring_here(held, fence=True)
            faultpoints.pause_here("MOVE_UNIT")  # crash tests: a mission half moved

    async def bring_here(self, held: UnitLease, *, fence: bool) -> UnitLease:
        """The unit's sandbox made on this machine from the snapshots its lease names, and the lease pointing
        at it, held by this host. `fence`: under the next epoch, so that whoever ran it elsewhere (a lost
        machine's worker, a `keel worker`), should it come back, can neither heartbeat nor complete it."""
        store, path = self.host.store, self.host.store_path
        async with self.git_lock:
            here = await asyncio.to_thread(placement.make_here, store, path, self.mission_id, held)
        ran_on = held.place.ran_on
        if held.worker:  # `keel status` goes on saying where it ran
            ran_on = WorkerPlace(held.worker, held.hostname, held.pid, held.place.sandbox)
        place = msgspec.structs.replace(here.place, ran_on=ran_on)
        offer = WorkerOffer(why=held.why) if held.why else None  # its host runs it; why it came back stays said
        here = msgspec.structs.replace(here, host_id=self.host.host_id, place=place, offer=offer)

        stored: UnitLease = await self.host.writer.commit(
            lambda txn: leases.moved(txn, self.mission_id, here, fence=fence)
        )
        return stored  # under the next epoch when fenced: a question about the unit names that one

    async def recover(self) -> list[UnitLease]:
        """Returns the leases of units whose completion a subagent recorded since the last checkpoint.

        Before anything is decided, what an earlier host left running is stopped: its workers with every
        process of their runs (runtree.py: what their agents started, however detached), and the commands
        its `run` tool started (their process groups outlive a killed host and could still make their
        effect after an answer was given). A unit is never started from scratch silently when its
        journal holds an effect: that is a question to the person (`reexecute`)."""
        finished = []
        await asyncio.to_thread(kill_tagged, OWNER_VAR, command_owner(self.mission_id))
        held_all = await asyncio.to_thread(self.host.store.read, lambda t: leases.list_leases(t, self.mission_id))
        faultpoints.pause_here("RECOVER_LEASES")  # crash tests: the leases read, an earlier host's runs not yet stopped
        for held in held_all:
            decision = await self._decide(held)
            if decision == Recovery.BRING_HERE:
                held = await self.bring_here(held, fence=False)
                decision = await self._decide(held)
            if decision in (Recovery.LEAVE, Recovery.FOLLOW):
                continue
            await asyncio.to_thread(terminate, held, self.mission_id)
            await asyncio.to_thread(end_runs, unit_key(self.host.store_path, self.mission_id, held.unit))
            # what its run recorded until it was stopped counts (a completion it wrote meanwhile, say):
            # decided on the lease as it is now that nothing of an earlier host writes it any more
            now = await asyncio.to_thread(self._lease, held.unit)
            if now is None or now.lane != held.lane:
                continue
            held, decision = now, await self._decide(now)
            if decision in (Recovery.LEAVE, Recovery.FOLLOW, Recovery.BRING_HERE):
                continue
            if held.place.sandbox:
                await asyncio.to_thread(merge.clear_stale_locks, Path(held.place.sandbox))
                await asyncio.to_thread(trees.remove_temps, Path(held.place.sandbox))  # a killed write's
            if decision == Recovery.FINISHED:
                finished.append(held)
            else:
                await self._act(decision, held)
        return finished

    async def _decide(self, held: UnitLease) -> Recovery:
        graph, uid = self.host.graph, held.unit
        exists = bool(held.place.sandbox) and await asyncio.to_thread(Path(held.place.sandbox).exists)
        known = uid in graph.units
        succeeded = not known or graph.mark(uid).state == UnitState.SUCCEEDED
        current = known and held.lane == self.lane_of(uid)
        return recovery(LeaseFacts(held, succeeded=succeeded, current_lane=current, sandbox_exists=exists))

    async def _act(self, decision: Recovery, held: UnitLease) -> None:
        uid = held.unit
        if decision == Recovery.RERUN:  # a person's answer
            after = " after a merge conflict" if held.state == LeaseState.DONE else ""
            await self.reexecute(uid, held, f"a person chose to run it again{after}")
        elif decision == Recovery.FAIL:
            self.graph_hold(uid)
            self.host.graph.fail(uid, f"a person chose to fail unit {uid}: its sandbox {held.place.sandbox} is missing")
            await self.host.writer.commit(self._resolved(uid, held))
        elif decision == Recovery.CONTINUE:
            await self.host.writer.commit(self._resolved(uid, held, forget_tree=True))
        elif decision == Recovery.CHECK:
            why = await asyncio.to_thread(placement.problem, self.host.store, self.mission_id, held, self.host.sandbox)
            if why:
                await self.lost_sandbox(uid, held, why)

    async def lost_sandbox(self, uid: str, held: UnitLease, why: str) -> None:
        """A sandbox that is gone or changed: a unit with no effect in its journal starts again from
        scratch by itself; one with effects asks the person, naming the effects a rerun would repeat."""
        effects = await asyncio.to_thread(self.effects_of, held.lane)
        if checked(why, len(effects)) == Recovery.RERUN:
            await self.reexecute(uid, held, why)
            return
        exists = bool(held.place.sandbox) and await asyncio.to_thread(Path(held.place.sandbox).exists)
        choices = tuple(ask_choices(exists))
        keep = "go on from its journal with the sandbox as it is (continue)" if exists else "fail the unit (fail)"
        text = (
            f"unit {uid} cannot resume where it was: {why}. Run it again from scratch (rerun) — this repeats "
            f"{len(effects)} effect(s) it already made: {'; '.join(effects[:5])} — or {keep}?"
        )
        self.graph_hold(uid)
        await self.host.wait_for_input(
            Question(
                unit=uid,
                seq=0,
                text=text,
                choices=choices,
                kind=QuestionKind.REEXECUTE,
                lane=held.lane,
                epoch=held.epoch,
            )
        )

    def graph_hold(self, uid: str) -> None:
        if self.host.graph.mark(uid).state == UnitState.RUNNING:
            self.host.graph.suspend(uid)

    def effects_of(self, unit_lane: str) -> list[str]:
        """The effectful calls recorded (done, or intended) in a journal lane, described."""
        return self.host.store.read(
            lambda t: [
                f"{e.summary or e.kind} (entry {e.seq}{', maybe' if e.phase == 'intent' else ''})"
                for e in m.journal_scan(t, self.mission_id, unit_lane)
                if e.tool_class == "effectful"
            ]
        )

    def _resolved(self, uid: str, held: UnitLease, *, forget_tree: bool = False) -> TxnFn:
        """A transaction function that clears the lease's applied resolution. `forget_tree` for "continue":
        the sandbox as it is becomes the lane's reference when the unit resumes."""
        return lambda txn: leases.resolved(txn, self.mission_id, uid, held.epoch, forget_tree=forget_tree)

    async def reexecute(self, uid: str, held: UnitLease, why: str) -> None:
        """Start the unit afresh on a new journal lane and sandbox; the evidence says why."""
        graph = self.host.graph
        named = graph.mark(uid).epoch
        epoch = await asyncio.to_thread(self.host.store.read, lambda t: fresh_epoch(t, self.mission_id, uid, named))
        if graph.mark(uid).state == UnitState.RUNNING:
            graph.suspend(uid)
        graph.update(uid, epoch=epoch, journal_hwm=0, agent_state="")
        place = held.place
        if place.sandbox:  # a lease that names no sandbox (a restore's, from a point without one) has none
            async with self.git_lock:
                await asyncio.to_thread(merge.remove_sandbox, Path(place.sandbox), self.host.sandbox, place.branch)
        item = Evidence(
            kind="reexecuted",
            at=time.time(),
            unit=uid,
            summary=f"unit {uid} is executed again from scratch: {why}",
            data={
                "reason": why,
                "lane": held.lane,
                "epoch": held.epoch,
                "sandbox": place.sandbox,
                "recorded_tree": place.tree,
            },
        )
        self.host.progress.line(item.summary)
        await self.host.checkpoint(
            f"re-execute {uid}", tree=False, extra=lambda txn: m.add_evidence(txn, self.mission_id, item)
        )

    async def settle_mission_sandbox(self, manifest: CheckpointManifest | None) -> None:
        """Repair what a killed process left in the mission sandbox before any git operation: stale locks,
        an interrupted merge; files a restore put there are checked and committed on the mission branch;
        anything else uncommitted is a leftover of an interrupted merge and is reset (evidence says so)."""
        sandbox = self.host.sandbox
        if manifest is not None:  # a host that ran before may have been killed in a restore's or merge's write
            await asyncio.to_thread(trees.remove_temps, sandbox)
        await asyncio.to_thread(merge.settle, sandbox, keep_changes=True)
        if manifest is not None and manifest.files_restored:
            await asyncio.to_thread(check_restored_files, self.host.store, manifest, sandbox)
            if merge.is_git(sandbox):
                await asyncio.to_thread(merge.commit_pending, sandbox)
        reset = await asyncio.to_thread(merge.settle, sandbox)
        if reset:
            item = Evidence(
                kind="repaired",
                at=time.time(),
                summary=f"the mission sandbox held changes of an interrupted merge; reset to the "
                f"mission branch: {', '.join(reset[:10])}",
                data={"paths": reset[:200]},
            )
            await self.host.writer.commit(lambda txn: m.add_evidence(txn, self.mission_id, item))

    # -- merging ----------------------------------------------------------------------------------------
    async def merge(self, uid: str) -> tuple[merge.MergeConflict | None, TxnFn | None]:
        """Merge a finished unit into the mission sandbox; the caller holds `git_lock` (and records the
        unit's success under it, so that a checkpoint never sees one without the other). Returns the conflict
        that stopped it, or the transaction function that marks the lease whose files it merged (for the
        checkpoint that records the merge; None when there was nothing to merge)."""
        held = await asyncio.to_thread(self._lease, uid)
        if held is None or held.place.merged or held.resolution == Resolution.SKIP:
            return None, None
        try:
            place = held.place
            await asyncio.to_thread(merge.merge_unit, self.host.sandbox, Path(place.sandbox), uid, place.commit)
        except merge.MergeConflict as conflict:
            return conflict, None
        return None, lambda txn: leases.mark_merged(txn, self.mission_id, uid, held.epoch)

    async def ask_about_conflict(self, uid: str, conflict: MergeConflict) -> None:
        """A finished unit whose changes collide with the mission branch: the person decides."""
        self.host.graph.suspend(uid)
        held = await asyncio.to_thread(self._lease, uid)
        effects = await asyncio.to_thread(self.effects_of, self.lane_of(uid))
        again = f" — this repeats {len(effects)} effect(s) it made: {'; '.join(effects[:5])} —" if effects else ""
        text = (
            f"{conflict}. Run unit {uid} again on top of the mission branch as it is now (rerun){again}, or "
            f"keep its result without its file changes (skip)?"
        )
        item = Evidence(
            kind="merge-conflict",
            at=time.time(),
            unit=uid,
            summary=str(conflict),
            data={"paths": getattr(conflict, "paths", [])},
        )
        await self.host.writer.commit(lambda txn: m.add_evidence(txn, self.mission_id, item))
        await self.host.wait_for_input(
            Question(
                unit=uid,
                seq=0,
                text=text,
                choices=("rerun", "skip"),
                kind=QuestionKind.MERGE_CONFLICT,
                epoch=held.epoch if held is not None else 0,
            )
        )


def carry_unfinished(store: Store, mission_id: str, mission_sandbox: Path) -> tuple[list[str], MergeConflict | None]:
    """Merge the work of every unit not yet succeeded (and not yet merged) from its own sandbox into the
    mission sandbox, so that the mission sandbox holds all of the mission's work (export: a bundle carries
    only the mission sandbox). A unit whose sandbox is not on this machine (a `keel worker` ran it, or a
    restore reopened it) is carried from the snapshots its lease names. Each carried unit's lease then
    names its snapshot at the mark as the one it started from (leases.carried), so that a checkpoint
    written from now on makes its sandbox again consistently with the mission files that hold its work.
    Only while no host runs the mission. Returns the units carried and the conflict that stopped the
    carrying, if one did (the units before it stay carried, that one merged nothing)."""
    head = store.read(lambda t: m.head_checkpoint(t, mission_id))
    marks = head.units if head else {}
    carried: list[str] = []
    for held in store.read(lambda t: leases.list_leases(t, mission_id)):
        mark = marks.get(held.unit)
        if (
            mark is None
            or mark.state == UnitState.SUCCEEDED
            or held.place.merged
            or held.resolution == Resolution.SKIP
            or held.lane != lane(held.unit, mark.epoch)
        ):
            continue
        try:
            if not _carry_one(store, mission_id, mission_sandbox, held):
                continue
        except MergeConflict as conflict:
            return carried, conflict
        store.write(functools.partial(leases.carried, mission_id=mission_id, unit_id=held.unit, epoch=held.epoch))
        carried.append(held.unit)
    return carried, None


def _carry_one(store: Store, mission_id: str, mission_sandbox: Path, held: UnitLease) -> bool:
    """Merge one unit's work so far into the mission sandbox, from its sandbox here or else from its lease's
    snapshots; False when it has neither."""
    if held.place.sandbox and Path(held.place.sandbox).is_dir():
        merge.carry(mission_sandbox, Path(held.place.sandbox), held.unit, held.place.commit)
        return True
    if not held.place.kept():
        return False
    with tempfile.TemporaryDirectory(prefix="keel-carry-") as tmp:
        made = placement.make_here(store, Path(tmp), mission_id, held, Path(tmp) / held.unit)
        merge.carry(mission_sandbox, Path(made.place.sandbox), held.unit)
    return True


def terminate(held: UnitLease, mission_id: str) -> bool:
    """Kill a worker of an earlier host that is still alive on this machine; True if one was."""
    if not held.pid or held.hostname != os.uname().nodename or held.pid == os.getpid():
        return False
    try:
        cmdline = Path(f"/proc/{held.pid}/cmdline").read_bytes()
    except OSError:
        return False
    if b"keel.server.engine.units.subagent" not in cmdline or mission_id.encode() not in cmdline:
        return False
    kill_session(held.pid)  # the worker leads a session: its agent's process group goes with it
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and process_running(held.pid):
        time.sleep(0.01)
    return True
