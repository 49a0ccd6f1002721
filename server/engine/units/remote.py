"""A unit run by a `keel worker`, as its mission host sees it (missions whose spec says `workers = true`).

The host does not start the unit's agent: it offers the unit in the store (storage/leases.offer: the next
epoch, state `offered`, with the unit's spec and the snapshots its sandbox is made from: `base_tree`, and
`tree` when the lane already holds work), and follows the lease while a worker on any machine claims and
runs it (workerhost.py):
- `done`: the worker's completion. The unit's files are made here from the stored snapshots (a plain
  folder merged file by file, as a moved unit's, moving.py) and the host merges them as any unit's.
- `returned`: the unit needs its host (a question, `plan/add`, a provider stop, a full disk, a failure).
  Its sandbox is made here from the store under the next epoch, and the unit runs here (`UnitSession`),
  replaying its journal up to where the worker left it.
- `running` with a heartbeat silent past its ttl (the worker's machine died or was cut off), or
  `orphaned`/`expired` while the mission still runs: offered again under the next epoch. The lost worker
  is fenced: its journal writes and its completion check the epoch and are rejected. A unit that
  remoteview.MAX_LAPSES workers lost in one run of it runs here instead. A unit whose lane the store holds no
  snapshot of (an outside, appending agent changes its sandbox between entries) cannot be made again
  anywhere: it is a lost sandbox (registry.lost_sandbox: run again from scratch when its journal holds no
  effect, else a `reexecute` question).
A stopping host (pause, question, cancel) withdraws an offer nobody took, and waits for a running worker to
stop by itself (it stops when the mission is no longer `running`) or to go silent. What each look at the
lease means is decided by remoteview.py (a pure function of the lease, the store's clock and what the host
saw before); this module reads the lease and acts. Depends on the engine's registry, remoteview, unitrun and
trees modules and on storage; sees the host only through interface.Host.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from keel.protocol.records import Event, Placement, UnitLease, WorkerOffer
from keel.protocol.spec import UnitSpec
from keel.protocol.states import LeaseState, OutcomeKind
from keel.server.engine.agentproc import AgentProcess
from keel.server.engine.checkpoint import QuietMark
from keel.server.engine.files.trees import Snapshotter
from keel.server.engine.interface import Host
from keel.server.engine.step.models import ModelCalls
from keel.server.engine.units.registry import Registry, lease_ttl
from keel.server.engine.units.remoteview import Act, Seen, on_look, on_start
from keel.server.engine.units.unitrun import Outcome, UnitSession
from keel.server.engine.wakeups import MissionChanges
from keel.storage import Txn, leases
from keel.storage import missions as m
from keel.storage.reach import Reach, gap_for

K = OutcomeKind
L = LeaseState
POLL_S = 0.1  # how often a unit's lease is read where the store does not say when it changed (LMDB)
OFFERED_POLL_S = 300.0  # an offer nobody has claimed, on a store that says when the lease changes: a safety net


class RemoteUnit:
    def __init__(self, host: Host, registry: Registry, models: ModelCalls, unit: UnitSpec) -> None:
        self.host = host
        self.registry = registry
        self.models = models
        self.unit = unit
        self.lane = registry.lane_of(unit.id)
        self.local: UnitSession | None = None  # the unit runs here after a worker handed it back
        self._epoch = 0  # the epoch this host offered, or the one it saw a worker claim
        self._stopping = False
        self._lapses = 0
        self._files = Snapshotter()
        self._changes: MissionChanges | None = None  # while following a worker: woken when the leases change

    # -- what the host and its registry's lease watch see of a running unit --------------------------
    @property
    def epoch(self) -> int:
        return self.local.epoch if self.local is not None else self._epoch

    @property
    def proc(self) -> AgentProcess | None:
        return self.local.proc if self.local is not None else None

    @property
    def quiet(self) -> QuietMark | None:
        """Run here: the unit at its last quiet moment; run by a worker, its lease says (with_unit_trees)."""
        return self.local.quiet if self.local is not None else None

    @property
    def stopping(self) -> bool:
        return self._stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self._stopping = value
        if self._changes is not None:
            self._changes.poke()
        if self.local is not None:
            self.local.stopping = value

    @property
    def replayed(self) -> int:
        return self.local.replayed if self.local is not None else 0

    @property
    def executed(self) -> int:
        return self.local.executed if self.local is not None else 0

    def expire(self) -> AgentProcess | None:
        return self.local.expire() if self.local is not None else None

    async def stop(self) -> None:
        self.stopping = True
        if self.local is not None:
            await self.local.stop()

    # -- the unit's run -------------------------------------------------------------------------------
    async def run(self) -> Outcome:
        held = await self._read()
        match on_start(held, self.lane).act:
            case Act.MERGE:
                assert held is not None
                return await self._done(held)
            case Act.RUN_HERE:
                return await self._run_here(held if held is not None and held.state == L.RETURNED else None)
            case Act.FOLLOW:
                assert held is not None
                self._epoch = held.epoch
                return await self._follow(held.worker)
        await self._offer(held if held is not None and held.lane == self.lane else None)
        return await self._follow("")

    async def _follow(self, worker: str) -> Outcome:
        """Follow the worker that runs the unit (or the offer nobody took yet) through the unit's lease: read
        when the store says the mission's leases changed (a claim, a heartbeat, the completion), at least every
        quarter of the ttl while a worker holds it (to judge its silence), and every POLL_S where the store
        never says."""
        changes = self._changes = MissionChanges(self.host.store, self.host.mission_id, dbs=(m.LEASE_CHANGES,))
        try:
            return await self._following(worker, changes)
        finally:
            self._changes = None
            changes.close()

    async def _following(self, worker: str, changes: MissionChanges) -> Outcome:
        """Each look at the lease is decided by remoteview.on_look; this acts on it."""
        running_poll = max(POLL_S, lease_ttl() / 4) if changes.live else POLL_S
        reach = Reach(gap_for(lease_ttl()) + running_poll)  # a store outage silences every worker: no evidence
        pause = POLL_S
        while True:
            await changes.wait(pause)
            started = time.monotonic()
            held, now = await asyncio.to_thread(
                self.host.store.read, lambda t: (leases.get(t, self.host.mission_id, self.unit.id), t.clock())
            )
            since = reach.note(started, now)
            seen = Seen(self.lane, worker, self._lapses, self.stopping)
            step = on_look(held, now, since, seen)
            if step.act == Act.FAIL:
                return Outcome(K.FAILED, error=f"unit {self.unit.id}'s {step.why}")
            assert held is not None
            self._note_progress(held)
            pause = OFFERED_POLL_S if changes.live and held.state == L.OFFERED else running_poll
            if step.lapse:
                await self._event("expired", step.lapse)
                self._lapses += 1
            match step.act:
                case Act.MERGE:
                    return await self._done(held)
                case Act.RUN_HERE:
                    return await self._run_here(_saying(held, step.why) if step.why else held)
                case Act.WITHDRAW:
                    await self._withdraw(held)
                    return Outcome(K.STOPPED)
                case Act.STOP:
                    return Outcome(K.STOPPED)
                case Act.CLAIMED:
                    worker, self._epoch = held.worker, held.epoch
                    await self._event("running", f"on worker {worker} ({held.hostname}), epoch {held.epoch}")
                case Act.OFFER:
                    if await self._offer(held) is not None:
                        worker = ""

    def _note_progress(self, held: UnitLease) -> None:
        """The worker's journal high-water mark (written with each of its entries) goes into the host's
        checkpoints, as a local unit's does: a restore point or a bundle then carries the unit's journal."""
        graph = self.host.graph
        if held.place.last_checkpoint > graph.mark(self.unit.id).journal_hwm:
            graph.update(self.unit.id, journal_hwm=held.place.last_checkpoint)

    async def _offer(self, held: UnitLease | None) -> UnitLease | None:
        """Offer the unit under the next epoch: from its lane's snapshots, or the mission sandbox's files.
        Taken from a worker judged silent (`held`), only if its lease is still as it was judged: a renewal
        that came in meanwhile (storage/reach.may_act) keeps it the worker's, and None says so."""
        host, uid = self.host, self.unit.id
        scan = None
        if held is None:  # a fresh lane starts from the mission branch as it is now (no merge in between)
            async with self.registry.git_lock:
                scan = await asyncio.to_thread(self._files.scan, host.sandbox)

        def write(txn: Txn) -> UnitLease | None:
            if held is not None and leases.get(txn, host.mission_id, uid) != held:
                return None
            saved_at = -1
            if scan is not None:
                tree = base_tree = self._files.store_txn(txn, host.sandbox, scan)
                mark = 0
            else:
                assert held is not None
                tree, base_tree, mark = held.place.tree, held.place.base_tree, held.place.last_checkpoint
                saved_at = held.place.saved_at
            place = Placement(copied=True, tree=tree, base_tree=base_tree, last_checkpoint=mark, saved_at=saved_at)
            return leases.offer(
                txn,
                host.mission_id,
                uid,
                lane=self.lane,
                host_id=host.host_id,
                ttl_s=self.registry.ttl,
                spec=self.unit,
                place=place,
            )

        offered: UnitLease | None = await host.writer.commit(write)
        if offered is None:
            return None
        self._epoch = offered.epoch
        host.progress.line(f"unit {uid} is offered to workers (epoch {offered.epoch})")
        return offered

    async def _withdraw(self, held: UnitLease) -> None:
        def write(txn: Txn) -> None:
            current = leases.get(txn, self.host.mission_id, self.unit.id)
            if current is not None and current.epoch == held.epoch and current.state == L.OFFERED:
                leases.expire(txn, self.host.mission_id, self.unit.id, held.epoch)

        await self.host.writer.commit(write)

    async def _done(self, held: UnitLease) -> Outcome:
        """A worker's completion: its files come here from the store, for the host's merge."""
        self._note_progress(held)
        if held.worker:
            await self.registry.bring_here(held, fence=False)
        return Outcome(K.SUCCEEDED, result=held.place.result)

    async def _run_here(self, held: UnitLease | None) -> Outcome:
        if held is not None:
            self.host.progress.line(f"unit {self.unit.id} runs on its mission host: {held.why or held.state}")
            here = await self.registry.bring_here(held, fence=True)
            if not here.place.is_copy():  # the sandbox stayed on the worker's machine: as any lost sandbox
                where = f"worker {held.worker or '?'} ({held.hostname or '?'})"
                why = f"its sandbox was on {where}, and the store holds no snapshot of it"
                await self.registry.lost_sandbox(self.unit.id, here, why)
                return Outcome(K.STOPPED)
        self.local = UnitSession(self.host, self.registry, self.models, self.unit)
        self.local.stopping = self.stopping
        return await self.local.run()

    async def _read(self) -> UnitLease | None:
        return await asyncio.to_thread(
            self.host.store.read, lambda t: leases.get(t, self.host.mission_id, self.unit.id)
        )

    async def _event(self, state: str, message: str) -> None:
        event = Event(kind="lease", at=time.time(), unit=self.unit.id, state=state, message=message[:500])
        self.host.progress.line(f"unit {self.unit.id}: {state} {message}")
        await self.host.writer.commit(lambda txn: m.add_event(txn, self.host.mission_id, event))


def _saying(held: UnitLease, why: str) -> UnitLease:
    """The lease as read, with why its mission host runs the unit now (for `_run_here` to say and keep)."""
    return msgspec.structs.replace(held, offer=msgspec.structs.replace(held.offer or WorkerOffer(), why=why))
