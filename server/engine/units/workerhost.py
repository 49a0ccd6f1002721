"""One unit of any mission, run by a `keel worker` on its own machine: the step code's host for that unit.

A mission whose spec says `workers = true` offers its units in the store (remote.py) instead of running
them. A worker that claims one (storage/leases.claim: a new epoch, fencing every earlier holder) makes the
unit's sandbox here from the snapshots the lease names (placement.make_here: `tree`, merged later
against `base_tree`), and runs the same `UnitSession` a mission host runs, with this `UnitHost` in the
host's place: the unit's worker process and agent start here, every step is journaled here, fenced by the
unit's lease, and the snapshot of the files a step changed is stored with its entry, so the unit can be
made again anywhere. The completion is the worker process's, as under a host (subagent.py).

What only the mission host may do is not done here: a question for a person, `plan/add` (the task graph is
the host's), a provider stop and a full disk hand the unit back (lease `returned`, `why`): the host makes
the sandbox from the store and runs the unit itself, replaying its journal up to that point. A unit that
fails here is handed back too, so that the host runs it to the same end and records it. A mission that
stops being `running` (a pause, a cancel) stops the unit (lease `orphaned`); a lease another epoch took
stops it without a further write. Depends on the engine's step code and storage; never on the host module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

import msgspec

from keel.protocol import agent as ap
from keel.protocol.environblock import blank_secrets
from keel.protocol.errors import KeelError
from keel.protocol.records import MissionRecord, Question, UnitLease, UnitMark, WorkerOffer
from keel.protocol.spec import UnitSpec
from keel.protocol.states import MissionState, OutcomeKind, PauseReason, UnitState
from keel.server.engine.agentproc import AgentProcess, HandlerError
from keel.server.engine.files import merge, places
from keel.server.engine.graph import Graph
from keel.server.engine.interface import TxnFn
from keel.server.engine.journal import JournalWriter, lane_epoch
from keel.server.engine.step.models import ModelCalls
from keel.server.engine.step.policy import Policy
from keel.server.engine.step.progress import Progress
from keel.server.engine.step.toolcalls import mission_tool_env
from keel.server.engine.units import placement, workerstarter
from keel.server.engine.units.placement import PreparedSandbox
from keel.server.engine.units.unitrun import Outcome, UnitSession
from keel.storage import Store, Txn, leases
from keel.storage import missions as m

K = OutcomeKind
WATCH_S = 0.25  # how often a running unit's mission state and lease are read
FENCED_EXIT_S = 30.0  # a fenced worker process is killed if it has not exited by itself after this long
HANDED_BACK_FOR = {  # what a unit's return to its mission host says, by why it could not go on here
    PauseReason.DISK_FULL: "a full disk",
    PauseReason.OFFLINE: "no model provider may serve it (offline)",
    PauseReason.POLICY: "no model provider may serve it (policy)",
}


class WorkerPlaces:
    """The unit's sandbox (made at the claim) and its lease: the claimed one for the first agent start, a
    new epoch for each start after it, so that an earlier worker process is fenced off."""

    def __init__(self, unit_host: UnitHost, claimed: UnitLease, ttl: float) -> None:
        self.unit_host = unit_host
        self.lease = claimed
        self.ttl = ttl
        self._first = True

    async def completed(self, uid: str) -> UnitLease | None:
        """None: a claim is a new epoch, which nothing has completed yet."""
        return None

    async def prepare(self, uid: str) -> PreparedSandbox:
        held = self.lease
        place = held.place
        return PreparedSandbox(
            sandbox=place.sandbox, branch="", base=place.base, tree=place.tree, copied=place.is_copy()
        )

    async def grant(self, uid: str, where: PreparedSandbox) -> UnitLease:
        if self._first:
            self._first = False
            return self.lease
        host = self.unit_host
        epoch = self.lease.epoch

        def write(txn: Txn) -> UnitLease:
            held = leases.check(txn, host.mission_id, uid, epoch)
            place = held.place.started_in(held.place.sandbox, held.place.base)
            return leases.grant(
                txn,
                host.mission_id,
                uid,
                lane=held.lane,
                host_id=held.host_id,
                ttl_s=self.ttl,
                place=place,
                offer=WorkerOffer(worker=held.worker, spec=held.offer.spec if held.offer else None),
                hostname=held.hostname,
            )

        self.lease = await host.writer.commit(write)
        return self.lease


class UnitHost:
    """The `interface.Host` of one claimed unit on a `keel worker`."""

    def __init__(
        self, store: Store, store_path: Path, mission_id: str, claimed: UnitLease, workspace: Path, ttl: float
    ) -> None:
        assert claimed.offer is not None and claimed.offer.spec is not None, "an offered lease names its unit's spec"
        self.store = store
        self.store_path = store_path
        self.mission_id = mission_id
        self.host_id = claimed.worker
        record = store.read(lambda t: m.get_mission(t, mission_id))
        # provider settings are this machine's (its workspace, its keyring); the sandbox is the unit's
        self.record: MissionRecord = msgspec.structs.replace(
            record, workspace=str(workspace), sandbox=claimed.place.sandbox
        )
        self.spec = record.spec
        self.unit: UnitSpec = claimed.offer.spec
        self.policy = Policy(self.spec.checkpoint)
        self.writer = JournalWriter(store, self.policy.window_s)
        mark = UnitMark(state=UnitState.RUNNING, epoch=lane_epoch(claimed.lane))
        self.graph = Graph([self.unit], {self.unit.id: mark})
        self.sandbox = Path(claimed.place.sandbox)
        self.progress = Progress("plain")
        self.stats: dict[str, int] = {"replayed": 0, "executed": 0, "reconciled": 0, "units_run": 1}
        self.models = ModelCalls(self)
        self.tool_env = mission_tool_env(self.spec, self.models.hidden_env)
        blank_secrets(self.models.hidden_env)  # the providers' keys: not readable from this process's environ
        workerstarter.warm()  # the unit's worker is a fork of it, once it has loaded the worker's code
        self.places = WorkerPlaces(self, claimed, ttl)
        self.session = UnitSession(self, self.places, self.models, self.unit)
        self.sessions = {self.unit.id: self.session}
        self.returned = ""  # why the unit goes back to its mission host
        self._stop = asyncio.Event()
        self._fenced: list[AgentProcess] = []  # worker processes whose lease another epoch took

    async def run(self) -> Outcome:
        """Run the unit until it completes, stops or is handed back; the lease says which to the host."""
        task = asyncio.create_task(self.session.run())
        watch = asyncio.create_task(self._watch())
        stop = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await self.session.stop()
            try:
                outcome = await task
            except leases.StaleLeaseError:  # a new agent start found the lease taken
                outcome = Outcome(K.EXPIRED)
        finally:
            for waiter in (watch, stop):
                waiter.cancel()
            await asyncio.gather(watch, stop, return_exceptions=True)
        if outcome.kind in (K.FAILED, K.STOPPED) and not await asyncio.to_thread(self._still_held):
            outcome = Outcome(K.EXPIRED)  # what went wrong is the fence's doing: the unit is another's now
        if outcome.kind == K.FAILED and not self.returned:
            self.returned = f"it failed on worker {self.host_id}: {outcome.error}"
        if self.returned and outcome.kind != K.EXPIRED:
            await self._hand_back()
        for proc in self._fenced:  # it exits by itself once it sees its lease taken (workerloop.GRACE_S after)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.proc.wait(), timeout=FENCED_EXIT_S)
            await proc.close(grace=0.5)
        await asyncio.to_thread(self.writer.close)
        await self.models.aclose()
        return outcome

    @property
    def lease_ttl_s(self) -> float:
        return self.places.ttl

    def renew(self, txn: Txn) -> None:
        """The unit's lease, renewed with an effect's intent (its worker process heartbeats it otherwise)."""
        leases.beat(txn, self.mission_id, self.unit.id, self.session.epoch)

    def _still_held(self) -> bool:
        held = self.store.read(lambda t: leases.get(t, self.mission_id, self.unit.id))
        return held is not None and held.worker == self.host_id and held.epoch == self.session.epoch

    async def _watch(self) -> None:
        """Stop the unit when its mission stops running, or when another epoch holds its lease."""
        while True:
            await asyncio.sleep(WATCH_S)
            record, held = await asyncio.to_thread(
                self.store.read,
                lambda t: (m.get_mission(t, self.mission_id), leases.get(t, self.mission_id, self.unit.id)),
            )
            if held is None or held.worker != self.host_id:  # the host offered it again: another epoch holds it
                proc = self.session.expire()
                if proc is not None:  # fenced, not killed: a completion its agent sent is tried and refused
                    self._fenced.append(proc)
                return
            if record.state != MissionState.RUNNING:
                self.progress.line(f"unit {self.unit.id}: mission {self.mission_id} is {record.state}: stopping")
                self._stop.set()
                return

    def stop_unit(self) -> None:
        """Stop the unit at a consistent point (this worker is stopping): its lease reads `orphaned`."""
        self._stop.set()

    def _give_back(self, why: str) -> None:
        if not self.returned:
            self.returned = why
            self.progress.line(f"unit {self.unit.id} goes back to its mission host: {why}")
        self.session.stopping = True
        self._stop.set()

    async def _hand_back(self) -> None:
        epoch, why = self.session.epoch, self.returned

        def write(txn: Txn) -> None:
            leases.hand_back(txn, self.mission_id, self.unit.id, epoch, why[:2000])

        try:
            await self.writer.commit(write)
        except KeelError as exc:  # fenced meanwhile, or finished: the host goes by what the lease says
            self.progress.line(f"unit {self.unit.id}: could not hand it back: {exc.message}")

    # -- interface.Host: what only the mission host does hands the unit back ------------------------
    async def wait_for_input(self, question: Question) -> None:
        self._give_back(f"a question for a person: {question.text[:300]}")

    async def plan_add(self, unit: str, units: Sequence[UnitSpec]) -> tuple[list[str], TxnFn]:
        self._give_back("plan/add: the task graph is its mission host's")
        raise HandlerError(ap.ERR_PAUSING, "this unit goes back to its mission host to add units")

    async def stop(self, reason: PauseReason, message: str) -> None:
        what = HANDED_BACK_FOR.get(reason, "")
        self._give_back(f"{what}{' ' if what else ''}on worker {self.host_id}: {message}")

    # -- interface.Host: the mission's checkpoints are its host's; what a step adds is recorded ----------
    async def checkpoint(self, reason: str, *, tree: bool = True, extra: TxnFn | None = None) -> None:
        if extra is not None:
            await self.writer.commit(extra)

    def checkpoint_soon(self, reason: str, extra: TxnFn | None = None) -> None:
        if extra is not None:
            self.writer.submit(extra)

    def step_recorded(self, unit: str, method: str, summary: str, wall_ms: float) -> None:
        """Nothing more to do: the mission's snapshots are its host's, and the lease holds this unit's."""


def forget_sandbox(sandbox: Path) -> None:
    """A unit's sandbox on this worker once the unit left it (done, handed back, stopped or fenced): the store
    holds its files, and a later claim makes the sandbox again from there."""
    with contextlib.suppress(OSError):  # what is left is made again (or removed) by the next claim of its lane
        merge.remove_sandbox(sandbox)


def offered_units(txn: Txn) -> list[tuple[str, UnitLease]]:
    """Every unit that a running mission of the store offers to workers, as (mission id, lease)."""
    running = [record.id for record in m.list_missions(txn) if record.state == MissionState.RUNNING]
    return leases.offers(txn, running)


def claim_here(
    store: Store, store_path: Path, mission_id: str, offered: UnitLease, worker: str, hostname: str, ttl: float
) -> UnitLease:
    """Claim an offered unit for this worker; its sandbox is made here from the snapshots the lease names.
    Raises StaleLeaseError when another worker took it first or its host withdrew it."""
    sandbox = places.worker_sandbox_path(store_path, worker, mission_id, offered.lane, offered.epoch + 1)

    def write(txn: Txn) -> UnitLease:
        if not txn.try_mission(mission_id):  # another write of the mission is under way (another worker's claim?)
            raise leases.StaleLeaseError(f"mission {mission_id} is being written: its offers are looked at later")
        if (state := m.get_mission(txn, mission_id).state) != MissionState.RUNNING:  # a pause came first
            raise leases.StaleLeaseError(f"mission {mission_id} is {state}: its offers are closed")
        return leases.claim(
            txn,
            mission_id,
            offered.unit,
            offered.epoch,
            worker=worker,
            ttl_s=ttl,
            sandbox=str(sandbox),
            base="",  # a copy made from the stored snapshots, as the offer says (Placement.copied)
            hostname=hostname,
        )

    claimed: UnitLease = store.write(write)
    assert Path(claimed.place.sandbox) == sandbox and claimed.epoch == offered.epoch + 1, "a claim is the next epoch"
    try:
        built = placement.make_here(store, store_path, mission_id, claimed, sandbox)
        if not built.place.is_copy():  # an offer names both snapshots; a lease from elsewhere may not
            raise KeelError(f"mission {mission_id} unit {offered.unit}: the store holds no snapshot of its sandbox")
    except Exception as exc:
        why = f"worker {worker} could not make its sandbox: {exc}"[:2000]
        store.write(lambda t: leases.hand_back(t, mission_id, offered.unit, claimed.epoch, why))
        raise
    return claimed
