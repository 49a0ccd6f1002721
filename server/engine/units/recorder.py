"""The recorder of one unit's run: the one place a step is journaled, and what the run holds of its lane.

`Recorder.record(step, result)` commits the step's entry (with its evidence, its effect's identity and
files, the snapshot of the files it changed, and any extra) before the agent sees the answer; an effect's
intent renews the lease it starts under, and `hold_lease` lets the effect start only while that lease is
surely still this process's. The recorder holds the lane's entries a page ahead of a numbering agent (and
an index of an appending agent's: `step/lookback.py`), the unit's quiet mark (its last moment with no
change in flight, which a checkpoint takes) and the lock a change of its files holds while it is made and
recorded.
Depends on storage, protocol and the engine's interface, checkpoint, files and step modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec

from keel.protocol.records import JournalEntry, StepCost, UnitLease, sandbox_kept
from keel.server.engine import faultpoints
from keel.server.engine.checkpoint import QuietMark
from keel.server.engine.files.digest import files_digest
from keel.server.engine.files.trees import Scan, Snapshotter
from keel.server.engine.interface import Host, Step, StepResult, answer
from keel.server.engine.step.core import Request
from keel.server.engine.step.lookback import Lookback
from keel.storage import DB, Txn, leases
from keel.storage import missions as m
from keel.storage.keys import unit_prefix
from keel.storage.reach import may_act

PAGE = 1000  # a replay reads a numbering agent's lane this many entries at a time, as the agent gets there


class Recorder:
    def __init__(self, host: Host, unit_id: str, lane: str) -> None:
        self.host = host
        self.unit_id = unit_id
        self.lane = lane
        self.sandbox = host.sandbox
        self.epoch = 0  # the lease epoch of the current worker: fences this run's journal writes
        self.appending = False  # the agent journals by appending (InitializeResult.journal)
        self.entries: dict[int, JournalEntry] = {}
        self.lookback = Lookback()  # an appending agent's history, as its requests are judged against it
        self.top = 0  # the highest seq recorded for this unit (an appending agent's high-water mark)
        self.loaded = 0  # entries 1..loaded were read (into `entries`; an appending agent's into `lookback`)
        self.executed = 0
        self.saved_at = -1  # the lane's newest done `state/save` entry, once `open` found it (0: none)
        self.tree = Snapshotter()  # the sandbox's snapshots, kept with the entries that changed its files
        self._files = Snapshotter()  # an appending agent's sandbox, for its effects' file digests
        self._paging = asyncio.Lock()
        # held while one of this unit's changes (an effectful or idempotent tool call) is being made and
        # recorded; other units' changes never wait for it
        self._change = asyncio.Lock()
        self._lease = ("", "", 0)  # the lease's tree, base_tree and last_checkpoint as this run last wrote them
        self.quiet: QuietMark | None = None  # this unit at its last moment with no change in flight

    # -- the lane as this run holds it ----------------------------------------------------------------
    def granted(self, lease: UnitLease) -> None:
        """A worker starts under `lease`: its epoch fences this run's writes from now on."""
        self.epoch = lease.epoch
        self._lease = (lease.place.tree, lease.place.base_tree, lease.place.last_checkpoint)
        self.note_quiet()

    async def open(self) -> JournalEntry | None:
        """Read the lane's length and its newest done `state/save` entry (for `unit/run`); no other entry is
        read until the run says where its requests start (`start_at`, `load_all`). Where that save is comes
        from the lane's lease (`Placement.saved_at`), so a long lane is not read backwards to find it; a
        lease that does not know (an older keel wrote it, a new lane) has the lane read once, and the run's
        first entry writes what was found."""
        mission_id, unit_id, unit_lane = self.host.mission_id, self.unit_id, self.lane

        def opening(t: Txn) -> tuple[int, JournalEntry | None]:
            top = t.last_seq(DB.JOURNAL, unit_prefix(mission_id, unit_lane))
            held = leases.get(t, mission_id, unit_id)
            if held is not None and held.lane == unit_lane and 0 <= held.place.saved_at <= top:
                at = held.place.saved_at
                saved = m.journal_get(t, mission_id, unit_lane, at) if at else None
                if at == 0 or (saved is not None and saved.kind == "state/save" and saved.phase == "done"):
                    return top, saved
            return top, m.journal_last_done(t, mission_id, unit_lane, "state/save")

        self.top, saved = await asyncio.to_thread(self.host.store.read, opening)
        self.saved_at = saved.seq if saved is not None else 0
        self.entries, self.loaded, self.lookback = {}, 0, Lookback()
        return saved

    async def start_at(self, after: int) -> None:
        """A numbering agent's requests are numbered from `after` + 1 (0: the start of the lane; a resuming
        agent's: its saved state's entry): hold the lane's page from there."""
        self.entries, self.loaded = {}, after
        if after < self.top:
            await self.page_in(after + 1)

    async def load_all(self, words: Callable[[JournalEntry], str]) -> tuple[str, ...]:
        """An appending agent looks back over its whole history: the rest of the lane is read once, a page
        at a time, into its `Lookback` (and its intents, which their outcomes settle); what is returned is
        each entry read in `words`, oldest first. Only a page of entries is held at any moment."""
        said = []
        while self.loaded < self.top:
            upto = min(self.top, self.loaded + PAGE)
            for entry in await self._read(self.loaded + 1, upto):
                self.keep(entry)
                said.append(words(entry))
            self.loaded = upto
        return tuple(said)

    async def _read(self, seq: int, upto: int) -> list[JournalEntry]:
        """The lane's entries `seq`..`upto` as the store holds them."""
        mission_id, unit_lane = self.host.mission_id, self.lane
        return await asyncio.to_thread(
            self.host.store.read, lambda t: m.journal_entries(t, mission_id, unit_lane, after=seq - 1, upto=upto)
        )

    async def page(self, request: Request) -> dict[int, JournalEntry]:
        """What the step core reads of an appending agent's whole journal for `request` (step/lookback.py):
        a model request's earlier answer is read back from the store (not kept), the rest is at hand."""
        seq = self.lookback.answered(request) if request.method == "model/forward" else None
        if seq is None:
            return self.lookback.page(request)
        mission_id, unit_lane = self.host.mission_id, self.lane
        answer = await asyncio.to_thread(self.host.store.read, lambda t: m.journal_get(t, mission_id, unit_lane, seq))
        return self.lookback.page(request, answer)

    async def page_in(self, seq: int) -> None:
        """Read the lane's next entries from `seq` on: a replay holds a page ahead of the agent, never the
        whole history (one request at a time reads; the others wait for its page)."""
        async with self._paging:
            if seq <= self.loaded:
                return
            upto = min(self.top, seq + PAGE - 1)
            self.entries.update((e.seq, e) for e in await self._read(seq, upto))
            self.loaded = upto

    async def read_back(self, seq: int) -> JournalEntry | None:
        """The entry at `seq` as the store holds it now (an earlier run's recording changed it)."""
        mission_id, unit_lane = self.host.mission_id, self.lane
        entry = await asyncio.to_thread(self.host.store.read, lambda t: m.journal_get(t, mission_id, unit_lane, seq))
        if entry is not None:
            self.entries[seq] = entry
        return entry

    def keep(self, entry: JournalEntry) -> None:
        """Hold an entry in memory only while this run may still look it up: an agent numbering its requests
        never asks for a number again (a restarted one has the lane read anew), so only an intent waits
        for its outcome; an appending agent's run looks back over its whole history, through its
        `Lookback`. A long unit's host then holds what is ahead of the agent, never everything behind it."""
        if self.appending:
            self.lookback.add(entry)
        if entry.phase == "intent":
            self.entries[entry.seq] = entry
        else:
            self.entries.pop(entry.seq, None)

    def forget_upto(self, seq: int) -> None:
        """Entries up to `seq` were answered next to the agent (by its worker): never looked up here."""
        for held in [s for s in self.entries if s <= seq]:
            del self.entries[held]

    # -- recording ------------------------------------------------------------------------------------
    async def files_now(self) -> str:
        """The digest of the sandbox's files as an effect starts from or leaves them (files/digest.py)."""
        return await asyncio.to_thread(files_digest, self.sandbox, self._files)

    async def record(self, step: Step, result: StepResult, settles: JournalEntry | None = None) -> Any:
        """Make the step's entry durable (group-committed when cheap), then return its answer. `settles`: an
        earlier intent's outcome (an outside agent's `effect/done`), written in the same transaction."""
        wall_ms = step.wall_ms()
        mark = step.effect
        if mark is not None and result.phase == "done":  # the files the effect left
            mark = msgspec.structs.replace(mark, after=await self.files_now())
        entry = JournalEntry(
            seq=step.seq,
            kind=step.method,
            fingerprint=step.fingerprint,
            phase=result.phase,
            result=result.value,
            error=result.error,
            tool_class=result.tool_class,
            served_model=result.served_model,
            at=time.time(),
            cost=StepCost(wall_ms=round(wall_ms, 3), tokens=result.tokens),
            summary=result.summary,
            rerun_approved=result.rerun,
            effect=mark,
        )
        host = self.host
        # an appending agent's effect in doubt is settled at its earlier entry: the high-water mark stays
        self.top = max(self.top, step.seq)
        hwm = self.top if self.appending else step.seq
        changes: dict[str, Any] = {"last_checkpoint": hwm}
        done = result.phase == "done"
        saved_at = max(step.seq, self.saved_at) if done and step.method == "state/save" else self.saved_at
        changes["saved_at"] = saved_at
        scan: Scan | None = None
        if self.appending:  # an outside agent changes its sandbox between entries: no tree to hold it to
            changes["tree"] = ""
        elif done and result.tool_class in ("effectful", "idempotent"):  # files may have changed
            # the snapshot itself is kept: the sandbox can be made again (another machine, a restore point)
            scan = await asyncio.to_thread(lambda: self.tree.scan(self.sandbox, paths=result.paths))
        write = self._write(entry, result, changes, scan, settles)
        urgent = not done or host.policy.urgent(step.method, result.tool_class, wall_ms, result.tokens)
        await host.writer.commit(write, urgent=urgent)
        self._lease = (changes.get("tree", self._lease[0]), self._lease[1], hwm)
        self.keep(entry)
        if settles is not None:
            self.keep(settles)
        self.saved_at = saved_at
        if done:
            self.executed += 1
            host.stats["executed"] += 1
            host.graph.update(self.unit_id, journal_hwm=hwm)
        self.note_quiet()
        if done:
            host.step_recorded(self.unit_id, step.method, result.summary, wall_ms)
        return answer(entry)

    def _write(
        self, entry: JournalEntry, result: StepResult, changes: dict[str, Any], scan: Scan | None, settles: Any
    ) -> Any:
        """The transaction that records `entry`: fenced by this run's lease epoch, with the lease's place."""
        host, mission_id, unit_id, unit_lane = self.host, self.host.mission_id, self.unit_id, self.lane
        epoch, tree, sandbox = self.epoch, self.tree, self.sandbox

        def write(txn: Txn) -> None:
            if scan is not None:
                changes["tree"] = tree.store_txn(txn, sandbox, scan)
            mark, tree_now, saved_at = changes["last_checkpoint"], changes.get("tree"), changes["saved_at"]
            # the fence: a stale epoch stops here
            leases.recorded(txn, mission_id, unit_id, epoch, mark=mark, tree=tree_now, saved_at=saved_at)
            if entry.phase != "done":  # an effect's intent: the lease it starts under is renewed with it
                host.renew(txn)
            m.journal_put(txn, mission_id, unit_lane, entry)
            if settles is not None:
                m.journal_put(txn, mission_id, unit_lane, settles)
            for item in result.evidence:
                m.add_evidence(txn, mission_id, msgspec.structs.replace(item, lane=unit_lane, seq=entry.seq))
            if result.extra is not None:
                result.extra(txn)

        return write

    async def record_intent(self, step: Step, result: StepResult, tool: str) -> Any:
        """Record an effect's intent, and return once the effect may start: its write renews the lease the
        effect starts under, and `hold_lease` makes sure that lease is still this process's."""
        sent = time.monotonic()
        answered = await self.record(step, result)
        faultpoints.pause_here(f"INTENT_{tool.upper()}")  # tests: the intent durable, the effect not started
        await self.hold_lease(sent)
        return answered

    async def hold_lease(self, renewed: float) -> None:
        """Called just before an effect starts: the lease it starts under must surely still be this process's
        (storage/reach.may_act). `renewed`: when the write that recorded its intent, and renewed that lease,
        was sent. A write answered late (a connection cut while it committed and read back once the link came
        back; a frozen process) is followed by another renewal, fenced, until one is answered in time: once
        another holds the lease it is refused (StaleLeaseError; a host's own lease ends the host), and the
        effect never starts."""
        host = self.host
        while not may_act(renewed, time.monotonic(), host.lease_ttl_s):
            renewed = time.monotonic()
            await host.writer.commit(host.renew)

    # -- quiet marks ----------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def changing(self) -> AsyncIterator[None]:
        """Held while a change of this unit's files is made and recorded (intent, effect, result and the
        snapshot of its sandbox): a checkpoint takes this unit as it was before the change, or after it."""
        try:
            async with self._change:
                yield
        finally:
            self.note_quiet()

    def note_quiet(self) -> None:
        """Remember this unit as it is now, when none of its changes is in flight: every entry up to its mark
        is committed, and its lease's tree is the snapshot of its sandbox after them."""
        if self._change.locked():
            return
        tree, base_tree, lease_hwm = self._lease
        if not sandbox_kept(tree, base_tree):  # an outside agent's sandbox: no snapshot
            self.quiet = None
            return
        hwm = max(self.host.graph.mark(self.unit_id).journal_hwm, lease_hwm)
        self.quiet = QuietMark(lane=self.lane, journal_hwm=hwm, tree=tree, base_tree=base_tree)

    def use_sandbox(self, sandbox: Path, files: Snapshotter | None) -> None:
        """The unit's sandbox, made or found; a fresh one's scanner knows its files already."""
        self.sandbox = sandbox
        self.tree = files or self.tree
