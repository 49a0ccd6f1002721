"""The mission host: one per running mission (a process of its own, or a task of `keel supervise --in-process`,
hosting.py); drives the task graph and owns the journal.

Loop: start ready units (up to max_parallel), each in its own agent subprocess; record each finished
unit with a checkpoint (a restore point); watch the control log for pause requests and stop at a
consistent point; stop for a person's answer (waiting_input). Model calls go through models.py (provider
router, failover restore points); when every provider is unreachable the mission stops `offline`, and a
host started with `wait_online` probes (offline.py) and resumes it by itself. A full disk (the store's or a
sandbox's) stops the mission paused with reason `disk_full`, its message naming the filesystem; the store's
reserve (storage/store.py) leaves room to record the steps in flight and the pause. Mission state moves only through
`_set_state` (storage/missions.set_mission_state, which checks protocol/states.py's table). Completion
is recorded in a transaction that checks this host's fencing token (MissionRecord.host.host_id).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from keel.protocol.diskspace import disk_full
from keel.protocol.environblock import blank_secrets
from keel.protocol.errors import DiskFullError, InvalidTransitionError
from keel.protocol.records import Control, Event, HostInfo, HostLease, MissionRecord, Question
from keel.protocol.spec import UnitSpec
from keel.protocol.states import MissionState, OutcomeKind, PauseReason, StartDecision, UnitState, stopped_state
from keel.server.engine import checkpoint, faultpoints, offline
from keel.server.engine.control import spawn_host
from keel.server.engine.files import places
from keel.server.engine.files.sandbox import ensure_sandbox
from keel.server.engine.files.trees import Scan, Snapshotter
from keel.server.engine.graph import Graph
from keel.server.engine.hostlock import HostLock, host_ttl, lease_holder_dead
from keel.server.engine.interface import TxnFn
from keel.server.engine.journal import JournalWriter
from keel.server.engine.recovery import apply_controls
from keel.server.engine.step.models import ModelCalls
from keel.server.engine.step.policy import Policy
from keel.server.engine.step.progress import Progress
from keel.server.engine.step.toolcalls import mission_tool_env
from keel.server.engine.units import moving, workerstarter
from keel.server.engine.units.registry import Registry
from keel.server.engine.units.remote import RemoteUnit
from keel.server.engine.units.unitrun import Outcome, UnitSession
from keel.server.engine.wakeups import MissionChanges
from keel.server.exits import Exit
from keel.storage import Store, Txn, hostlease, leases
from keel.storage import missions as m
from keel.storage.hostlease import FencedHostError

S = MissionState
K = OutcomeKind
POLL_S = 0.02
WOKEN_POLL_S = 300.0  # a store that wakes this host when its controls change (NOTIFY: lost only with its
# connection, and the listener wakes everyone after a reconnect): read anyway this often


class MissionHost:
    def __init__(
        self,
        store: Store,
        store_path: Path,
        mission_id: str,
        progress: Progress,
        wait_online: bool,
        lease: HostLease,
    ) -> None:
        self.store = store
        self.store_path = store_path
        self.mission_id = mission_id
        self.progress = progress
        self.lease = lease
        self.host_id = lease.host_id
        record = store.read(lambda t: m.get_mission(t, mission_id))
        self.record: MissionRecord = record
        self.spec = record.spec
        self.policy = Policy(self.spec.checkpoint)
        self.writer = JournalWriter(store, self.policy.window_s)
        self.writer.fence = self._check_lease  # first in every write: this host's lease is still its own
        self.graph = Graph([], {})
        self.sandbox = Path(record.sandbox or places.sandbox_path(store_path, mission_id))
        self.stats: dict[str, int] = {"replayed": 0, "executed": 0, "reconciled": 0, "units_run": 0}
        self.sessions: dict[str, UnitSession | RemoteUnit] = {}
        self.registry = Registry(self)
        self._stop: asyncio.Event = asyncio.Event()
        self._stop_state: MissionState | None = None
        self._files = Snapshotter()
        self._step = ""
        self._snapshot: asyncio.Task[None] | None = None  # the snapshot checkpoint being written, if any
        self.wait_online = wait_online
        self.models = ModelCalls(self)
        self.tool_env = mission_tool_env(self.spec, self.models.hidden_env)  # commands': an allowlist
        blank_secrets(self.models.hidden_env)  # the providers' keys: not readable from this process's environ
        workerstarter.warm()  # the units' workers are forks of it, once it has loaded their code
        self.disk_full = ""  # why the mission stops for a full disk (the message naming the filesystem)
        self.beats_itself = True  # False: a process hosting many missions renews their leases together (hosting.py)
        self.on_fenced: Callable[[], object] | None = None  # None: a fenced host ends its process

    # -- state --------------------------------------------------------------------------------------
    async def _set_state(self, state: MissionState, **changes: object) -> MissionRecord:
        old = self.record.state

        def write(txn: Txn) -> MissionRecord:
            return m.set_mission_state(txn, self.mission_id, state, **changes)

        self.record = await self.writer.commit(write)
        if old != state:
            self.progress.event(
                "state",
                mission=self.mission_id,
                state=state.value,
                reason=self.record.pause_reason.value if self.record.pause_reason else "",
            )
        return self.record

    async def checkpoint(self, reason: str, *, tree: bool = True, extra: TxnFn | None = None) -> None:
        # the mission sandbox's files and the units' marks from one moment: no merge half-made in between;
        # each running unit is taken at its own last quiet moment (with_unit_trees), so no unit is waited for
        async with self.registry.git_lock:
            scan = await asyncio.to_thread(self._files.scan, self.sandbox) if tree and self.sandbox.exists() else None
            write = self._checkpoint_write(reason, extra, scan)
        # handed to the writer before another checkpoint can take the lock: they commit in the order taken
        await self.writer.commit(write)
        self.policy.snapshotted()

    def checkpoint_soon(self, reason: str, extra: TxnFn | None = None) -> None:
        """A checkpoint queued now, without a file snapshot (none can be taken synchronously): it commits no
        later than the step being recorded; `restore --files` says that this point has no files."""
        self.writer.submit(self._checkpoint_write(reason, extra, None))

    def _checkpoint_write(self, reason: str, extra: TxnFn | None, scan: Scan | None, recording: str = "") -> TxnFn:
        """`recording`: the unit whose step's transaction this checkpoint is written in; its lease there,
        written by that step, is the unit at a quiet moment, its step included."""
        units, marks, state = self.graph.unit_list(), self.graph.marks(), self.record.state
        quiet = {uid: q for uid, s in self.sessions.items() if uid != recording and (q := s.quiet) is not None}
        config = checkpoint.config_of(self.spec, self.models.active_model)

        def write(txn: Txn) -> None:
            if extra is not None:
                extra(txn)
            tree_digest = self._files.store_txn(txn, self.sandbox, scan) if scan is not None else ""
            checkpoint.commit(
                txn,
                self.mission_id,
                reason=reason,
                units=units,
                marks=checkpoint.with_unit_trees(marks, leases.list_leases(txn, self.mission_id), quiet),
                config=config,
                state=state,
                sandbox_tree=tree_digest,
            )

        return write

    # -- startup ------------------------------------------------------------------------------------
    async def start(self) -> MissionState | None:
        """Take the mission over; returns a final state when there is nothing to run."""
        host = HostInfo(host_id=self.host_id, pid=os.getpid(), started_at=time.time(), hostname=os.uname().nodename)
        decision, self.record = await self.writer.commit(lambda txn: apply_controls(txn, self.mission_id, host))
        manifest = self.store.read(lambda t: m.head_checkpoint(t, self.mission_id))
        units = (
            self.store.read(lambda t: checkpoint.load_graph(t, manifest.graph)) if manifest else list(self.spec.units)
        )
        self.graph = Graph(units, manifest.units if manifest else {})
        if manifest is not None:
            self.store.read(lambda t: self.models.carry_on(t, manifest.config))
        self.graph.reopen_after_crash()
        if decision == StartDecision.PAUSED:
            await self.checkpoint("paused")
            return S.PAUSED
        if decision != StartDecision.RUN:
            return self.record.state
        self.graph.retry_failed(mission_failed=self.record.state == S.FAILED)
        workspace = Path(self.record.workspace)
        if moving.moved(self.record, self.store):  # its machine is gone: the sandboxes are made here from the store
            origin, workspace = self.record.machine, places.workspace_of(self.store_path)
            self.sandbox = places.sandbox_path(self.store_path, self.mission_id)
            self.progress.line(f"mission {self.mission_id} moves here from {origin}: its files come from the store")
            await asyncio.to_thread(
                moving.rebuild_mission_sandbox, self.store, workspace, self.sandbox, self.mission_id, manifest, origin
            )
            await self.registry.move_here()
        else:
            self.sandbox = await asyncio.to_thread(ensure_sandbox, workspace, self.sandbox, self.mission_id)
        await self.registry.settle_mission_sandbox(manifest)
        await self._set_state(
            S.RUNNING,
            sandbox=str(self.sandbox),
            workspace=str(workspace),
            machine=moving.here(),
            pause_reason=None,
            question=None,
            error="",
        )
        if manifest is None or manifest.files_restored:
            await self.checkpoint("started" if manifest is None else "resumed on the restored files")
        for held in await self.registry.recover():  # finished by a subagent after the last checkpoint
            if held.place.last_checkpoint > self.graph.mark(held.unit).journal_hwm:
                self.graph.update(held.unit, journal_hwm=held.place.last_checkpoint)
            self.graph.start(held.unit)
            await self._unit_finished(
                held.unit,
                Outcome(K.SUCCEEDED, result=held.place.result),
                note=f"recovered from subagent epoch {held.epoch}",
            )
        return None

    # -- the loop -----------------------------------------------------------------------------------
    async def run(self) -> MissionState:
        loop = asyncio.get_running_loop()
        self.writer.on_disk_full = lambda message: loop.call_soon_threadsafe(self._disk_alarm, message)
        beating = asyncio.create_task(self._heartbeat() if self.beats_itself else asyncio.sleep(0))
        try:
            self._check_room()
            final = await self._run_mission()
            while final == S.OFFLINE:
                if not (self.wait_online and self.spec.models.auto_resume):
                    state: MissionState = await self.writer.commit(
                        lambda txn: offline.honour_pause(txn, self.mission_id)
                    )
                    return state
                self.progress.event("waiting_online", mission=self.mission_id)
                online = await offline.wait_online(
                    self.store, self.mission_id, self.models.router().probe, self.writer.commit
                )
                if not online:
                    return self.store.read(lambda t: m.get_mission(t, self.mission_id)).state
                self.progress.event("online", mission=self.mission_id)
                self._stop, self._stop_state = asyncio.Event(), None
                final = await self._run_mission()
            return final
        finally:
            beating.cancel()
            await self.registry.close()
            faultpoints.pause_here("HOST_RELEASE")  # tests: stopped, still named by the mission's record
            with contextlib.suppress(Exception):
                await self.writer.commit(self._release)
            await asyncio.to_thread(self.writer.close)
            await self.models.aclose()
            self.progress.finish()

    async def _run_mission(self) -> MissionState:
        try:
            final = await self.start()
        except DiskFullError as exc:
            await self._stop_for_disk_full(exc.message)
            return S.PAUSED
        if final is not None:
            return final
        watchers = [asyncio.create_task(self._watch_controls()), asyncio.create_task(self.registry.watch())]
        try:
            return await self._drive()
        finally:
            for watcher in watchers:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, DiskFullError):  # the stop has begun already
                    await watcher

    def _check_room(self) -> None:
        """Refuse to start without the store's reserve (no room to make it): a full disk met then could not
        even be recorded. Nothing is written; the mission stays as it was."""
        if self.store.reserve_bytes > 0 and not self.store.keep_reserve():
            raise disk_full(
                self.store.path,
                f"no room for the {self.store.reserve_bytes // 1024} KiB reserve keel keeps there to record a pause",
                "the store at",
            )

    def _release(self, txn: Txn) -> None:
        """A host that stops says so: the record no longer names it (host_alive is then False), and its
        lease is free at once for a host on any machine."""
        current = m.get_mission(txn, self.mission_id)
        if current.host is not None and current.host.host_id == self.host_id:
            m.put_mission(txn, msgspec.structs.replace(current, host=None))
        hostlease.release(txn, self.mission_id, self.lease.epoch)

    @property
    def lease_ttl_s(self) -> float:
        return self.lease.ttl_s

    def renew(self, txn: Txn) -> None:
        """The host lease, renewed with an effect's intent: its units' effects start under it."""
        hostlease.beat(txn, self.mission_id, self.lease.epoch)

    def _check_lease(self, txn: Txn) -> None:
        """First in every write of this host: its lease must still be its own. A host whose lease another
        host took (it was frozen or cut off past the ttl) stops at once, writing nothing more; its workers
        see it gone and their unit leases are fenced by the new host's epochs."""
        try:
            hostlease.check(txn, self.mission_id, self.lease.epoch)
        except FencedHostError as exc:
            sys.stderr.write(f"keel host: {exc.message}\n")
            sys.stderr.flush()
            if self.on_fenced is None:
                os._exit(Exit.BUSY)
            self.on_fenced()  # this mission's host alone stops, writing nothing more (its write raises)
            raise

    async def _heartbeat(self) -> None:
        """Renew the host lease every quarter of its ttl (the fence runs first in that write too)."""
        epoch = self.lease.epoch
        while True:
            await asyncio.sleep(self.lease.ttl_s / 4)
            with contextlib.suppress(Exception):  # a store that is away now: the next beat tries again
                await self.writer.commit(lambda t: hostlease.beat(t, self.mission_id, epoch), urgent=False)

    async def _drive(self) -> MissionState:
        tasks: dict[asyncio.Task[Outcome], str] = {}
        stop_wait = asyncio.create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                for uid in self.graph.ready():
                    if len(tasks) >= self.spec.max_parallel:
                        break
                    if uid not in self.sessions:
                        tasks[self._launch(uid)] = uid
                if not tasks:
                    break
                done, _ = await asyncio.wait([*tasks, stop_wait], return_when=asyncio.FIRST_COMPLETED)
                for task in [t for t in tasks if t in done]:
                    uid = tasks.pop(task)
                    await self._unit_finished(uid, task.result())
            if self._stop.is_set():
                return await self._stop_all(tasks)
            return await self._conclude()
        finally:
            stop_wait.cancel()

    def _launch(self, uid: str) -> asyncio.Task[Outcome]:
        self.graph.start(uid)
        unit = self.graph.units[uid]
        run_by = RemoteUnit if self.spec.workers else UnitSession  # workers = true: `keel worker`s run it
        session = run_by(self, self.registry, self.models, unit)
        self.sessions[uid] = session
        self.writer.parallel = len(self.sessions)
        self.stats["units_run"] += 1
        attempt = self.graph.mark(uid).attempts
        self.progress.event("unit_started", unit=uid, attempt=attempt)
        event = Event(kind="unit", at=time.time(), unit=uid, state="running", message=f"attempt {attempt}")
        self.writer.submit(lambda txn: m.add_event(txn, self.mission_id, event))
        return asyncio.create_task(session.run())

    async def _unit_finished(self, uid: str, outcome: Outcome, note: str = "") -> None:
        session = self.sessions.pop(uid, None)
        self.writer.parallel = len(self.sessions)
        if outcome.kind in (K.STOPPED, K.EXPIRED):
            self.graph.suspend(uid)
            return
        merged: TxnFn | None = None
        if outcome.kind == K.SUCCEEDED:
            full = ""
            async with self.registry.git_lock:  # a checkpoint sees the merge and the unit's success together
                try:
                    conflict, merged = await self.registry.merge(uid)
                except DiskFullError as exc:  # not a conflict: merged again when the mission resumes
                    self.graph.suspend(uid)
                    conflict, full = None, exc.message
                if conflict is None and not full:
                    self.graph.succeed(uid, outcome.result)
            if full:
                await self._stop_for_disk_full(full)
                return
            if conflict is not None:
                await self.registry.ask_about_conflict(uid, conflict)
                return
        else:
            self.graph.fail(uid, outcome.error)
        event = Event(kind="unit", at=time.time(), unit=uid, state=outcome.kind, message=(outcome.error or note)[:500])

        def extra(txn: Txn) -> None:
            m.add_event(txn, self.mission_id, event)
            if merged is not None:
                merged(txn)

        try:
            await self.checkpoint(f"unit {outcome.kind}: {uid}", extra=extra)
        except DiskFullError as exc:  # the subagent's recorded completion is taken over on resume
            await self._stop_for_disk_full(exc.message)
            return
        self.progress.event(
            f"unit_{outcome.kind}",
            unit=uid,
            replayed=session.replayed if session else 0,
            executed=session.executed if session else 0,
            error=outcome.error,
        )
        self._draw()

    async def _conclude(self) -> MissionState:
        if self.graph.all_succeeded():
            try:
                await self._set_state(S.COMPLETED)
                await self.checkpoint("completed")
            except DiskFullError as exc:
                await self._stop_for_disk_full(exc.message)
                return await self._stop_all({})
            return S.COMPLETED
        failed = [uid for uid, mk in self.graph.marks().items() if mk.state == UnitState.FAILED]
        errors = "; ".join(f"{uid}: {self.graph.mark(uid).error}" for uid in failed)
        await self._set_state(S.FAILED, error=errors[:2000])
        await self.checkpoint("failed")
        return S.FAILED

    async def _stop_all(self, tasks: dict[asyncio.Task[Outcome], str]) -> MissionState:
        """Pause or wait for input: let running steps finish recording, stop the agents, checkpoint."""
        await asyncio.gather(*(s.stop() for s in list(self.sessions.values())), return_exceptions=True)
        for task, uid in list(tasks.items()):
            outcome = await task
            if outcome.kind == K.STOPPED or uid not in self.sessions:
                self.sessions.pop(uid, None)
                self.graph.suspend(uid)
            else:
                await self._unit_finished(uid, outcome)
        final = self._stop_state or S.PAUSED
        try:
            if final == S.CANCELLED:
                await self._set_state(S.CANCELLED, pause_reason=None)
                faultpoints.pause_here("HOST_CANCELLED")  # tests: cancelled, its last records not yet written
                await self.checkpoint("cancelled")
                return final
            if final == S.PAUSED and self.record.state != S.PAUSED:
                await self._set_state(S.PAUSED, **self._pause_reason())
            reason = self.record.pause_reason
            await self.checkpoint(
                {S.WAITING_INPUT: "waiting for input", S.OFFLINE: "offline"}.get(
                    final, "paused" if reason in (None, PauseReason.OPERATOR) else f"paused: {reason.value}"
                )
            )
        except DiskFullError as exc:
            if not self.disk_full:
                raise
            self.progress.line(f"the pause checkpoint could not be recorded: {exc.message}")
        return final

    def _pause_reason(self) -> dict[str, object]:
        if self.disk_full:
            return {"pause_reason": PauseReason.DISK_FULL, "error": self.disk_full[:2000]}
        return {"pause_reason": PauseReason.OPERATOR}

    # -- pause and questions --------------------------------------------------------------------------
    async def _watch_controls(self) -> None:
        """Act on control records (pause, answer, cancel) as they are committed. A store that wakes its
        watchers (PostgreSQL's NOTIFY, naming the missions and databases a commit changed) is read when it
        says this mission's controls changed, and every WOKEN_POLL_S in case a wake-up was lost; otherwise its
        transaction id is polled every POLL_S."""
        changes = MissionChanges(self.store, self.mission_id, dbs=(m.CONTROL_CHANGES,))
        seen_txn = -1
        try:
            while not self._stop.is_set():
                # woken (or its safety poll due) on a store that says what changed: read; else only on a change
                if changes.live or self.store.txn_id() != seen_txn:
                    seen_txn, controls = self.store.read(self._unseen_controls)
                    if controls:
                        await self._on_controls(controls)
                await changes.wait(WOKEN_POLL_S if changes.live else POLL_S)
        finally:
            changes.close()

    def _unseen_controls(self, txn: Txn) -> tuple[int, list[tuple[int, Control]]]:
        # remember the snapshot actually read: LMDB publishes a commit's id a moment before new read
        # transactions see it, and a control committed in that moment must not be skipped
        return txn.snapshot_id(), m.controls_after(txn, self.mission_id, self.record.control_seen)

    async def _on_controls(self, controls: list[tuple[int, Control]]) -> None:
        last = controls[-1][0]
        if self.record.state == S.OFFLINE and any(c.action == "pause" for _, c in controls):
            return  # left unseen for offline.honour_pause: a paused mission is never resumed by the prober
        if any(c.action == "cancel" for _, c in controls) and self.record.state in (S.RUNNING, S.PAUSING):
            await self._set_state(S.PAUSING, pause_reason=PauseReason.OPERATOR, control_seen=last)
            self._request_stop(S.CANCELLED)
        elif any(c.action == "pause" for _, c in controls) and self.record.state == S.RUNNING:
            await self._set_state(S.PAUSING, pause_reason=PauseReason.OPERATOR, control_seen=last)
            self._request_stop(S.PAUSED)
        else:
            self.record = await self.writer.commit(
                lambda txn: m.set_mission_state(txn, self.mission_id, self.record.state, control_seen=last)
            )

    def _request_stop(self, state: MissionState) -> None:
        self._stop_state = state
        for session in self.sessions.values():
            session.stopping = True  # from now on an agent's error or exit means "stopped", not "failed"
        self._stop.set()

    async def wait_for_input(self, question: Question) -> None:
        """A unit needs a person: record the question (waiting_input) and stop the mission there. A question
        a unit's run asks is about the lease it runs under (the answer acts on that lease only)."""
        if self._stop.is_set():
            return
        session = self.sessions.get(question.unit)
        if not question.epoch and session is not None:
            question = msgspec.structs.replace(question, epoch=session.epoch)
        self._request_stop(S.WAITING_INPUT)
        with contextlib.suppress(InvalidTransitionError):
            await self._set_state(S.WAITING_INPUT, pause_reason=PauseReason.WAITING_INPUT, question=question)
        self.progress.event("question", unit=question.unit, text=question.text)

    async def stop(self, reason: PauseReason, message: str) -> None:
        """A unit cannot go on: stop the mission for `reason` (offline when no provider is reachable, else
        paused), with `message` saying why. A full disk is recorded as `_disk_alarm`'s is."""
        if reason == PauseReason.DISK_FULL:
            await self._stop_for_disk_full(message)
            return
        if self._stop.is_set():
            return
        state = stopped_state(reason)
        self._request_stop(state)
        with contextlib.suppress(InvalidTransitionError):
            await self._set_state(state, pause_reason=reason, error=message[:2000])
        self.progress.event(state.value, reason=reason.value, error=message[:300])

    def _disk_alarm(self, message: str) -> None:
        """The journal writer met a full store disk (or committed only in its reserve): stop. Runs before
        the commit's waiters wake up, so that no unit starts another step."""
        if self._note_disk_full(message):
            task = asyncio.create_task(self._record_disk_full())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _stop_for_disk_full(self, message: str) -> None:
        """A filesystem keel writes to is full: stop the mission paused with reason disk_full (the message
        names the filesystem). What is in flight still commits, in the store's reserve; when even that is
        spent the pause is not recorded and the next host finds the mission as after a crash."""
        if self._note_disk_full(message):
            await self._record_disk_full()

    def _note_disk_full(self, message: str) -> bool:
        """Remember why and stop the units; True when the pause is this call's to record."""
        if self.disk_full:
            return False
        self.disk_full = message
        self.progress.event("disk_full", mission=self.mission_id, error=message[:300])
        if self._stop.is_set():
            return False  # already stopping (a person's pause, a question): _stop_all records the reason
        self._request_stop(S.PAUSED)
        return True

    async def _record_disk_full(self) -> None:
        with contextlib.suppress(InvalidTransitionError, DiskFullError):
            await self._set_state(S.PAUSED, pause_reason=PauseReason.DISK_FULL, error=self.disk_full[:2000])

    # -- what a unit's steps ask of the mission ----------------------------------------------------------
    async def plan_add(self, unit: str, units: Sequence[UnitSpec]) -> tuple[list[str], TxnFn]:
        """Add units to the graph; returns their ids and the checkpoint that makes the change durable in
        the transaction of the step's journal entry."""
        async with self.registry.git_lock:
            added = self.graph.add(list(units), unit)
            scan = await asyncio.to_thread(self._files.scan, self.sandbox) if self.sandbox.exists() else None
            return added, self._checkpoint_write(f"plan: {unit} added {len(added)}", None, scan, recording=unit)

    def step_recorded(self, unit: str, method: str, summary: str, wall_ms: float) -> None:
        self._step = f"{unit}: {summary or method}"
        self._draw()
        due = self.policy.record(wall_ms) and not self._stop.is_set()
        if due and (self._snapshot is None or self._snapshot.done()):  # one at a time: it resets the clock
            self._snapshot = asyncio.create_task(self.checkpoint("snapshot"))
            self._snapshot.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _draw(self) -> None:
        counts = self.graph.counts()
        self.progress.status(counts.get("succeeded", 0), len(self.graph.units), sorted(self.sessions), self._step)


def _say(text: str) -> None:
    sys.stderr.write(f"keel host: {text}\n")
    sys.stderr.flush()


def run_host_blocking(
    store_path: Path,
    mission_id: str,
    progress: Progress | None = None,
    store: Store | None = None,
    wait_online: bool = False,
) -> MissionState:
    """Run a mission's host in this process until it completes, fails or pauses. Pass the store this
    process already has open (an LMDB environment is opened once per process)."""
    lock = HostLock(places.lock_path(store_path, mission_id), mission_id)
    lock.acquire()
    own, ended = store is None, None  # ended: the state the host stopped in
    try:
        store = store or Store.open(store_path, create=False, wait=_say)
        store.reserve_owner = True  # this process may spend the store's reserve to record a disk_full pause
        store.wait_out_outages(_say)  # a database away (restart, failover, network) is a pause, never a failure
        lease = store.write(
            lambda t: hostlease.claim(
                t,
                mission_id,
                host_id=uuid.uuid4().hex[:12],
                pid=os.getpid(),
                hostname=os.uname().nodename,
                ttl_s=host_ttl(),
                dead=lease_holder_dead,
            )
        )
        host = MissionHost(store, store_path, mission_id, progress or Progress("plain"), wait_online, lease)
        state = asyncio.run(host.run())
        ended = state
        (progress or Progress("plain")).event("host_exit", mission=mission_id, **host.stats, state=state.value)
        if host.disk_full and store.read(lambda t: m.get_mission(t, mission_id)).state in (S.RUNNING, S.PAUSING):
            raise DiskFullError(
                f"{host.disk_full} (the pause could not be recorded: the mission resumes as after a crash)"
            )
        return state
    finally:
        faultpoints.pause_here("HOST_EXIT")  # tests: a host that has stopped but still holds the lock
        lock.release()
        faultpoints.pause_here("HOST_LET_GO")  # tests: the lock released, the process not yet done with the mission
        if store is not None and ended == S.WAITING_INPUT:
            _hand_on(store, store_path, mission_id)
        if own and store is not None:
            store.close()


def _hand_on(store: Store, store_path: Path, mission_id: str) -> None:
    """An answer that came while this host was stopping (after it last looked at the controls, before it
    let go of the host lock) found the lock held and left the answer to it: start the next host here.
    Looked at after the lock is released, so an answer either sees the lock free and starts a host itself,
    or is seen here (both may: the second host finds the first and stops)."""
    if answered(store, mission_id):
        spawn_host(store_path, mission_id)


def answered(store: Store, mission_id: str) -> bool:
    """Whether the mission waits for an answer that it has been given (a control its host has not seen)."""

    def read(txn: Txn) -> bool:
        record = m.get_mission(txn, mission_id)
        unseen = m.controls_after(txn, mission_id, record.control_seen)
        return record.state == S.WAITING_INPUT and any(c.action == "answer" for _, c in unseen)

    return store.read(read)
