"""One unit's run: its agent subprocess, and the journal-backed answers to the agent's requests.

A step reads as one line: check the recorded result, else run and record. Requests are numbered per
unit in arrival order (the SDK sends them one at a time); a request whose fingerprint does not match the
entry at its number is a NondeterminismError. An effectful tool call records an intent before it runs;
an intent found without a result is reconciled against the sandbox or turned into a question. A full disk
anywhere in a unit (a tool's write, a journal commit, the subagent's completion, its sandbox) stops the
mission paused (disk_full) and the unit as `stopped`: nothing of it is recorded as a failure or a result
(a sandbox that could not be made, a worker that died or an agent that failed the unit while the store
met a full disk or the filesystem had no room: `_full_disk`, over diskspace.failed_for_space); so does
a worker process that could not open the store at each of its starts (reason `store`, with the server's
words).
Each agent method has one handler (`HANDLERS`); every handler hands a StepResult to `record`, the one
place a step is journaled. Depends on storage, protocol and the engine's own modules; sees the host only
through interface.Host, never imports the host module.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from keel.protocol import agent as ap
from keel.protocol import rpc
from keel.protocol.diskspace import disk_full, failed_for_space, free_or_none, says_no_space
from keel.protocol.errors import DiskFullError, KeelError
from keel.protocol.records import Evidence, JournalEntry, Question, StepCost, UnitLease, sandbox_kept
from keel.protocol.spec import UnitSpec
from keel.protocol.states import OutcomeKind, PauseReason
from keel.server.engine import faultpoints
from keel.server.engine.agentproc import AgentError, AgentProcess, HandlerError, RemoteError, resolve_command
from keel.server.engine.checkpoint import QuietMark
from keel.server.engine.files import places
from keel.server.engine.files.sandbox import SandboxError
from keel.server.engine.files.trees import Scan, Snapshotter
from keel.server.engine.interface import Host, Step, StepResult, answer
from keel.server.engine.journal import NondeterminismError, lane, request_fingerprint
from keel.server.engine.step.effects import Effect, decide, effect_of, effect_outcome, files_digest
from keel.server.engine.step.models import ModelCalls
from keel.server.engine.step.replay import REPLAYED, replay_notice, replayed_count
from keel.server.engine.step.toolcalls import ToolCalls, ask_rerun_or_skip
from keel.server.engine.units.placement import PreparedSandbox
from keel.server.engine.units.runtree import TAG_VAR, RunTree, unit_key
from keel.server.engine.units.subagent import EXIT_NO_STORE
from keel.server.tools import TOOLS
from keel.storage import DB, Txn, leases
from keel.storage import missions as m
from keel.storage.keys import unit_prefix
from keel.storage.reach import may_act

OUTPUT_KEPT = 2000  # the end of an outside agent's effect output its journal entry keeps
MAX_AGENT_STARTS = 3  # an agent that dies mid-unit is started again (replaying its journal) this often
PAGE = 1000  # a replay reads a numbering agent's lane this many entries at a time, as the agent gets there
K = OutcomeKind


class Outcome(msgspec.Struct, frozen=True):
    kind: OutcomeKind
    result: Any = None
    error: str = ""


class UnitPlaces(Protocol):
    """Where a unit's session gets its sandbox and its worker's lease: the mission host's registry, or a
    `keel worker`'s claim (workerhost.py)."""

    @property
    def ttl(self) -> float: ...

    async def prepare(self, uid: str) -> PreparedSandbox: ...
    async def grant(self, uid: str, where: PreparedSandbox) -> UnitLease: ...


class UnitSession:
    def __init__(self, host: Host, registry: UnitPlaces, models: ModelCalls, unit: UnitSpec) -> None:
        self.host = host
        self.registry = registry
        self.models = models
        self.unit = unit
        mark = host.graph.mark(unit.id)
        self.lane = lane(unit.id, mark.epoch)
        self.entries: dict[int, JournalEntry] = {}
        self.seq = 0
        self.agent_run = 0  # how many times this session has started the unit's worker and agent
        self.replayed = 0
        self.executed = 0
        self.inflight = 0
        self.stopping = False
        self.expired = False
        self.epoch = 0  # the lease epoch of the current worker: fences this session's journal writes
        self.sandbox = host.sandbox
        self._tree = Snapshotter()
        self._files = Snapshotter()  # an appending agent's sandbox, for its effects' file digests
        self.fatal: Exception | None = None
        self.appending = False  # the agent journals by appending (InitializeResult.journal)
        self.asked: dict[str, int] = {}  # an allowed effect's call id -> its intent's seq, until effect/done
        self.top = 0  # the highest seq recorded for this unit (an appending agent's high-water mark)
        self.spent = (0, 0)  # model requests and tokens paid for in this run of the unit ([budget])
        self.handed = 0  # entries 1..handed were sent to the worker to answer (replay.py), until it reports
        self.loaded = 0  # entries 1..loaded of the lane were read into `entries` (the rest when asked for)
        self._paging = asyncio.Lock()
        self.proc: AgentProcess | None = None
        self.tree = RunTree(unit_key(host.store_path, host.mission_id, unit.id), 0)  # the worker's run's processes
        self.tools = ToolCalls(self)
        # held while one of this unit's changes (an effectful or idempotent tool call) is being made and
        # recorded; other units' changes never wait for it
        self._change = asyncio.Lock()
        self._lease = ("", "", 0)  # the lease's tree, base_tree and last_checkpoint as this session last wrote them
        self.quiet: QuietMark | None = None  # this unit at its last moment with no change in flight
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle ----------------------------------------------------------------------------------
    async def run(self) -> Outcome:
        error = ""
        try:
            self.sandbox = Path((placement := await self.registry.prepare(self.unit.id)).sandbox)
            self._tree = placement.files or self._tree  # a fresh sandbox's scanner knows its files already
        except DiskFullError as exc:
            return await self._disk_full(exc.message)
        except (KeelError, OSError) as exc:
            return await self._unmade(exc.message if isinstance(exc, KeelError) else str(exc))
        for start in range(1, MAX_AGENT_STARTS + 1):
            try:
                granted = await self.registry.grant(self.unit.id, placement)
                self.epoch = granted.epoch
                self._lease = (granted.place.tree, granted.place.base_tree, granted.place.last_checkpoint)
                self._note_quiet()
                placement = msgspec.structs.replace(placement, scan=None)  # a fresh sandbox's base: stored once
                return await self._run_once(start)
            except DiskFullError as exc:
                return await self._disk_full(exc.message)
            except AgentError as exc:
                if self.expired:
                    return Outcome(K.EXPIRED)
                if self.stopping:
                    return Outcome(K.STOPPED)
                if self.fatal is not None:
                    return Outcome(K.FAILED, error=str(self.fatal))
                if full := self._full_disk("worker stopped"):  # it died or could not start for want of space
                    return await self._disk_full(full)
                if not exc.died:
                    return Outcome(K.FAILED, error=exc.message)
                error = exc.message
                if exc.exit_code == EXIT_NO_STORE and start == MAX_AGENT_STARTS:  # no start will do better
                    why = exc.last_words or error
                    await self.host.stop(
                        PauseReason.STORE, f"unit {self.unit.id}'s worker process, {start} times: {why}"
                    )
                    return Outcome(K.STOPPED)
                self.host.progress.line(f"unit {self.unit.id}: {error}; starting it again ({start}/{MAX_AGENT_STARTS})")
            except RemoteError as exc:
                if self.expired:
                    return Outcome(K.EXPIRED)
                if exc.rpc_code == ap.ERR_DISK_FULL:  # the subagent could not record the unit's completion
                    return await self._disk_full(exc.message)
                if self.stopping:
                    return Outcome(K.STOPPED)
                if self.fatal is None and (full := self._full_disk("agent failed the unit")):
                    return await self._disk_full(full)
                return Outcome(K.FAILED, error=str(self.fatal or f"agent failed the unit: {exc.message}"))
            except (TimeoutError, msgspec.ValidationError) as exc:
                return Outcome(K.FAILED, error=f"agent {self.unit.id} did not answer properly: {exc!r}")
            except OSError as exc:  # the unit's home or its agent's log could not be made
                if not says_no_space(exc):
                    raise
                where = exc.filename or self.sandbox
                return await self._disk_full(disk_full(where, str(exc), f"unit {self.unit.id}'s files at").message)
            finally:
                await self._close()
        return Outcome(K.FAILED, error=f"{error} (gave up after {MAX_AGENT_STARTS} starts)")

    async def _run_once(self, start: int) -> Outcome:
        mission_id, unit_lane = self.host.mission_id, self.lane

        def opening(t: Txn) -> tuple[int, dict[int, JournalEntry], JournalEntry | None]:
            top = t.last_seq(DB.JOURNAL, unit_prefix(mission_id, unit_lane))
            saved = m.journal_last_done(t, mission_id, unit_lane, "state/save")
            return top, {e.seq: e for e in m.journal_entries(t, mission_id, unit_lane, upto=PAGE)}, saved

        self.top, self.entries, saved = await asyncio.to_thread(self.host.store.read, opening)
        self.loaded = min(self.top, PAGE)
        self.seq = 0
        self.agent_run += 1
        host = self.host
        self.tree = RunTree(self.tree.key, self.epoch)
        cgroup = await asyncio.to_thread(self.tree.prepare)
        worker = (
            sys.executable,
            "-m",
            "keel.server.engine.units.subagent",
            "--store",
            str(host.store_path),
            "--mission",
            host.mission_id,
            "--unit",
            self.unit.id,
            "--epoch",
            str(self.epoch),
            "--sandbox",
            str(self.sandbox),
            "--ttl",
            str(self.registry.ttl),
            "--cgroup",
            str(cgroup or ""),
            "--",
            *resolve_command(host.spec.agent),
        )
        proc = self.proc = await AgentProcess.start(
            worker,
            cwd=self.sandbox,
            env={**host.spec.env, TAG_VAR: self.tree.tag},
            handler=self.handle,
            name=self.unit.id,
            hide_env=self.models.hidden_env,
            opens_store=True,
            log=places.agent_log_path(host.store_path, host.mission_id, self.unit.id),
            on_notice=self._notice,
        )
        if self.stopping:
            return Outcome(K.STOPPED)
        init = ap.InitializeParams(
            protocol_version=ap.PROTOCOL_VERSION,
            mission_id=host.mission_id,
            goal=host.spec.goal,
            sandbox=str(self.sandbox),
        )
        hello = msgspec.convert(
            await asyncio.wait_for(proc.request("initialize", init), timeout=60), ap.InitializeResult
        )
        self.appending = hello.journal == "append"
        if self.appending and self.loaded < self.top:  # it looks back over its whole history
            rest = await asyncio.to_thread(
                self.host.store.read, lambda t: m.journal_entries(t, mission_id, unit_lane, after=self.loaded)
            )
            self.entries.update((e.seq, e) for e in rest)
            self.loaded = self.top
        if self.appending:  # carry on after the last entry; nothing is answered by position
            self.seq = self.top
            self.asked = {}
        self.handed = 0
        if not self.appending and self.entries:  # the worker answers what it can of the replay (replay.py)
            await self._hand_replay(proc)
        home = places.unit_home_path(host.store_path, host.mission_id, self.lane)
        await asyncio.to_thread(home.mkdir, parents=True, exist_ok=True)
        params = ap.UnitRunParams(
            unit=self.unit,
            attempt=start,
            state=_saved_state(saved),
            replaying=self.top > 0,
            home=str(home),
            history=tuple(_history_line(e) for e in sorted(self.entries.values(), key=lambda e: e.seq))
            if self.appending
            else (),
            tools=tuple(host.spec.permissions.tools),
        )
        try:
            result = await asyncio.wait_for(proc.request("unit/run", params), timeout=self.unit.timeout_s)
        except TimeoutError:
            limit = self.unit.timeout_s
            self.fatal = TimeoutError(f"unit {self.unit.id} took longer than its timeout_s of {limit} s")
            return Outcome(K.FAILED, error=str(self.fatal))
        if self.fatal is not None:
            return Outcome(K.FAILED, error=str(self.fatal))
        decoded = msgspec.convert(result or {}, ap.UnitRunResult)
        return Outcome(K.SUCCEEDED, result=decoded.result)

    async def _hand_replay(self, proc: AgentProcess) -> None:
        """Send the worker the table of answers it may give the agent itself (replay.py); the table's bytes
        are not held past the send."""
        notice, handed = await asyncio.to_thread(replay_notice, list(self.entries.values()))
        if notice and self.seq == 0:  # else the agent's requests are already being numbered here
            self.handed = handed
            proc.send_body(notice)

    async def _disk_full(self, message: str) -> Outcome:
        await self.host.stop(PauseReason.DISK_FULL, message)
        return Outcome(K.STOPPED)

    async def _unmade(self, words: str) -> Outcome:
        """The unit's sandbox could not be made (`words`: the error's own): for want of space the mission
        pauses; while the mission stops the unit is left to the resume; otherwise the unit fails."""
        if full := self._full_disk("sandbox could not be made", words):
            return await self._disk_full(full)
        if self.stopping:
            return Outcome(K.STOPPED)
        return Outcome(K.FAILED, error=f"cannot make the sandbox of unit {self.unit.id}: {words}")

    def _full_disk(self, doing: str, words: str = "") -> str:
        """Why the store's or this unit's sandbox's filesystem counts as full now, or "": a write of the
        store's met a full disk, or what failed (`doing`; its own `words`, never an agent's, which a replay
        would repeat) failed for want of space there (diskspace.failed_for_space)."""
        if full := self.host.store.full_disk():
            return full
        for path, what in ((self.sandbox, "the sandbox"), (self.host.store.path, "the store at")):
            if why := failed_for_space(words, free_or_none(path)):
                cause = f"unit {self.unit.id}'s {doing}: {words[:200] + '; ' if words else ''}{why}"
                return disk_full(path, cause, what).message
        return ""

    async def stop(self) -> None:
        """Reach a consistent point: no new step starts, the running ones finish recording; then stop."""
        self.stopping = True
        await self._idle.wait()
        await self._close()

    def expire(self) -> AgentProcess | None:
        """The lease was taken over: stop waiting for this worker (it is fenced, not killed); the caller
        keeps the returned process to kill when the host stops."""
        self.expired = True
        proc, self.proc = self.proc, None
        if proc is not None:
            proc._fail(AgentError(f"the lease of unit {self.unit.id} expired", died=True))
        return proc

    async def _close(self) -> None:
        """Stop the worker, and every process of its run with it (runtree.py): whatever its agent started,
        also what left the agent's process group or session, is gone before the unit goes on or is judged."""
        if self.proc is not None:
            proc, self.proc = self.proc, None
            await proc.close(grace=1.0)
            await asyncio.to_thread(self.tree.end)

    async def end_earlier_runs(self) -> None:
        """Before an effect in doubt is judged or made again: every process of the unit's other runs on this
        machine (an earlier worker's leftovers, a fenced worker's) is gone, so none makes it afterwards."""
        await asyncio.to_thread(self.tree.end_others)

    # -- requests from the agent ----------------------------------------------------------------------
    async def handle(self, method: str, params: Any) -> Any:
        handler = HANDLERS.get(method)
        if handler is None:
            raise HandlerError(rpc.METHOD_NOT_FOUND, f"unknown method {method!r}")
        if self.stopping or self.expired or self.fatal is not None:
            await asyncio.Event().wait()  # never answered: the agent is about to be stopped
        fp = request_fingerprint(method, params)
        if method in WAITS_FOR_A_PERSON:  # not in flight: a stop does not wait for it
            return await self._answer(handler, method, params, fp)
        self.inflight += 1
        self._idle.clear()
        try:
            return await self._answer(handler, method, params, fp)
        except DiskFullError as exc:  # never the step's result: its intent (if any) stays for the resume
            await self.host.stop(PauseReason.DISK_FULL, exc.message)
            raise HandlerError(ap.ERR_PAUSING, f"the mission pauses: {exc.message}") from None
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    async def _page_in(self, seq: int) -> None:
        """Read the lane's next entries from `seq` on: a replay holds a page ahead of the agent, never the
        whole history (one request at a time reads; the others wait for its page)."""
        async with self._paging:
            if seq <= self.loaded:
                return
            upto = min(self.top, seq + PAGE - 1)
            mission_id, unit_lane = self.host.mission_id, self.lane
            page = await asyncio.to_thread(
                self.host.store.read, lambda t: m.journal_entries(t, mission_id, unit_lane, after=seq - 1, upto=upto)
            )
            self.entries.update((e.seq, e) for e in page)
            self.loaded = upto

    async def _answer(self, handler: Handler, method: str, params: Any, fp: str) -> Any:
        """Number the request and answer it: from its recorded entry (a replay), else by its handler. An
        appending agent's effect is numbered by the effect decision instead (`_effect`)."""
        if self.appending and (effect := self._effect_of(method, params)) is not None:
            return await self._effect(handler, method, params, fp, effect)
        self.seq += 1
        seq = self.seq
        if not self.appending and self.loaded < seq <= self.top:
            await self._page_in(seq)
        entry = None if self.appending else await self._recorded(seq)  # an appending agent: nothing by position
        if entry is not None:
            if entry.fingerprint != fp:
                self._nondeterminism(seq, entry, method)
            if entry.phase == "done":
                self.note_replay(entry)
                return answer(entry)
        if method == "tool/run" and not self.sandbox.is_dir():
            self._sandbox_gone(seq)
        return await handler(self, Step(seq, method, fp, time.monotonic(), intent=entry), params)

    async def _recorded(self, seq: int) -> JournalEntry | None:
        """The entry recorded at `seq` as this run of the agent must see it. A change an earlier run asked for
        (its worker died mid-call) is still being made or recorded: wait for its outcome, then read the entry
        back, since that run's recording changes what this one holds in memory. An entry not held but within
        the lane is read back too."""
        entry = self.entries.get(seq)
        if entry is not None and entry.phase == "done":
            return entry
        if not await self.tools.settle_earlier(self.agent_run) and (entry is not None or seq > self.top):
            return entry
        mission_id, unit_lane = self.host.mission_id, self.lane
        return await asyncio.to_thread(self.host.store.read, lambda t: m.journal_get(t, mission_id, unit_lane, seq))

    def _effect_of(self, method: str, params: Any) -> Effect | None:
        """The effect an appending agent's request asks for: `effect/ask`, or a `tool/run` of an effectful tool."""
        if method == "tool/run":
            tool = TOOLS.get(str(params.get("tool", ""))) if isinstance(params, dict) else None
            if tool is None or tool.klass != "effectful":
                return None
        elif method != "effect/ask":
            return None
        return effect_of(method, params, str(self.sandbox))

    async def _effect(self, handler: Handler, method: str, params: Any, fp: str, effect: Effect) -> Any:
        """An appending agent's effect, decided over its whole journal (effects.decide) whenever it comes: at
        a unit run's start, after its agent alone was started again, after a resume or a restore."""
        if not self.sandbox.is_dir():
            self.seq += 1
            self._sandbox_gone(self.seq)
        files = await self.files_now()
        allowed = self.host.spec.permissions.tools
        refusal = "" if effect.tool in allowed else f"{effect.tool!r} is not allowed by this mission's permissions"
        decision = decide(self.entries.values(), effect, files, refusal)
        now = time.monotonic()
        earlier = decision.entry
        if decision.kind == "answer" and earlier is not None:
            self.seq += 1
            return await self._repeat(Step(self.seq, method, fp, now), earlier, decision.reason)
        if earlier is not None:  # in doubt, or a person said rerun: settled at its own intent
            mark = effect.mark(files) if decision.kind == "run" else earlier.effect
            step = Step(earlier.seq, method, earlier.fingerprint, now, intent=earlier, effect=mark)
            return await handler(self, step, params)
        self.seq += 1
        mark = None if decision.kind == "refuse" else effect.mark(files)
        return await handler(self, Step(self.seq, method, fp, now, effect=mark), params)

    async def _repeat(self, step: Step, earlier: JournalEntry, reason: str) -> Any:
        """A repeat of a completed effect (or one a person said had happened): answered from its entry, and
        nothing runs. The agent's own effect is denied with the reason and the recorded outcome."""
        summary = f"answered from entry {earlier.seq}, nothing ran: {reason}"[:200]
        if step.method == "effect/ask":
            told = f"keel did not make this effect again: {reason}. {effect_outcome(earlier)}".strip()
            value = msgspec.to_builtins(ap.EffectAskResult(allow=False, reason=told))
            return await self.record(step, StepResult(value, summary=summary))
        recorded = StepResult(earlier.result, error=earlier.error, tool_class=earlier.tool_class, summary=summary)
        return await self.record(step, recorded)

    async def within_budget(self) -> None:
        """Before a model request is paid: a unit that spent its budget in this run ([budget]) pauses the
        mission, naming the limit, and the request is not made."""
        budget, (requests, tokens) = self.host.spec.budget, self.spent
        over = ""
        if budget.model_requests and requests >= budget.model_requests:
            over = f"{requests} model requests (budget.model_requests = {budget.model_requests})"
        elif budget.tokens and tokens >= budget.tokens:
            over = f"{tokens} tokens (budget.tokens = {budget.tokens})"
        if over:
            message = (
                f"unit {self.unit.id} spent its budget in this run: {over}; `keel resume` gives it a new one "
                "(or raise [budget] in the mission file)"
            )
            await self.host.stop(PauseReason.BUDGET, message)
            raise HandlerError(ap.ERR_PAUSING, f"the mission pauses: {message}")

    async def files_now(self) -> str:
        """The digest of the sandbox's files as an effect starts from or leaves them (effects.files_digest)."""
        return await asyncio.to_thread(files_digest, self.sandbox, self._files)

    def paid(self, result: StepResult) -> StepResult:
        """Count a model request served by a provider against the unit's budget."""
        requests, tokens = self.spent
        self.spent = (requests + 1, tokens + result.tokens)
        return result

    def forwarded(self, params: Any, fp: str) -> JournalEntry | None:
        """The recorded answer to this very model request (same normalised fingerprint, same place in its
        conversation), if this unit paid for it already: in this run or an earlier one, in any of the outside
        agent's sessions (Gemini CLI starts a new one on every run, and asks what the last one asked)."""
        if not self.appending or not isinstance(params, dict):
            return None
        for entry in self.entries.values():
            result = entry.result if isinstance(entry.result, dict) else {}
            if (
                entry.kind == "model/forward"
                and entry.phase == "done"
                and not entry.error
                and entry.fingerprint == fp
                and result.get("body")
                and result.get("ordinal") == params.get("ordinal")
            ):
                return entry
        return None

    def _nondeterminism(self, seq: int, entry: JournalEntry, method: str) -> None:
        error = NondeterminismError(
            f"nondeterminism in mission {self.host.mission_id} unit {self.unit.id} entry {seq}: "
            f"the journal has {entry.kind} ({entry.summary or entry.fingerprint[:12]}), the agent sent "
            f"{method} with different params"
        )
        self.fatal = error
        raise HandlerError(ap.ERR_NONDETERMINISM, error.message)

    def _sandbox_gone(self, seq: int) -> None:
        """The unit's sandbox folder was removed under it: a tool call there would fail for a reason that is
        not the call's, so nothing is recorded for entry `seq` and the unit fails; its journal stays as it
        was, for a run in a sandbox made again."""
        error = SandboxError(
            f"unit {self.unit.id}'s sandbox {self.sandbox} is gone: its tool call (entry {seq}) was not run "
            "and nothing was recorded for it"
        )
        self.fatal = error
        raise HandlerError(rpc.INTERNAL_ERROR, error.message)

    def _notice(self, method: str, params: Any) -> None:
        if method == REPLAYED:
            self.replayed_by_worker(replayed_count(params))

    def replayed_by_worker(self, count: int) -> None:
        """The worker answered the agent's first `count` requests from the entries it was handed; the next
        request is number count + 1. A report that cannot be true fails the unit."""
        handed, self.handed = self.handed, 0
        if self.seq != 0 or not 0 < count <= handed:
            error = AgentError(
                f"unit {self.unit.id}'s worker reported {count} replayed requests, but it was handed "
                f"{handed} entries and the host had numbered {self.seq} requests"
            )
            self.fatal = error
            if self.proc is not None:
                self.proc._fail(error)
            return
        self.seq = count
        for seq in range(1, count + 1):  # answered next to the agent: never looked up here
            self.entries.pop(seq, None)
        self.replayed += count
        self.host.stats["replayed"] += count

    @property
    def unit_id(self) -> str:
        return self.unit.id

    @contextlib.asynccontextmanager
    async def changing(self) -> AsyncIterator[None]:
        """Held while a change of this unit's files is made and recorded (intent, effect, result and the
        snapshot of its sandbox): a checkpoint takes this unit as it was before the change, or after it."""
        try:
            async with self._change:
                yield
        finally:
            self._note_quiet()

    def _note_quiet(self) -> None:
        """Remember this unit as it is now, when none of its changes is in flight: every entry up to its mark
        is committed, and its lease's tree is the snapshot of its sandbox after them."""
        if self._change.locked():
            return
        tree, base_tree, lease_hwm = self._lease
        if not sandbox_kept(tree, base_tree):  # an outside agent's sandbox: no snapshot
            self.quiet = None
            return
        hwm = max(self.host.graph.mark(self.unit.id).journal_hwm, lease_hwm)
        self.quiet = QuietMark(lane=self.lane, journal_hwm=hwm, tree=tree, base_tree=base_tree)

    def note_replay(self, entry: JournalEntry) -> None:
        """A step answered from its recorded entry."""
        self._keep(entry)
        self.replayed += 1
        self.host.stats["replayed"] += 1

    def _keep(self, entry: JournalEntry) -> None:
        """Hold an entry in memory only while this run may still look it up: an agent numbering its requests
        never asks for a number again (a restarted one has the lane read anew), so only an intent waits
        for its outcome; an appending agent's run looks back over its whole history. A long unit's host
        then holds what is ahead of the agent, never everything behind it."""
        if self.appending or entry.phase == "intent":
            self.entries[entry.seq] = entry
        else:
            self.entries.pop(entry.seq, None)

    async def record(self, step: Step, result: StepResult) -> Any:
        """Make the step's entry durable (group-committed when cheap), then return its answer."""
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
        mission_id = host.mission_id
        epoch = self.epoch
        # an appending agent's effect in doubt is settled at its earlier entry: the high-water mark stays
        self.top = max(self.top, step.seq)
        hwm = self.top if self.appending else step.seq
        tree: str | None = None  # None: the entry changed no files, the lane's snapshot stays
        done = result.phase == "done"
        scan: Scan | None = None
        if self.appending:  # an outside agent changes its sandbox between entries: no tree to hold it to
            tree = ""
        elif done and result.tool_class in ("effectful", "idempotent"):  # files may have changed
            # the snapshot itself is kept: the sandbox can be made again (another machine, a restore point)
            scan = await asyncio.to_thread(lambda: self._tree.scan(self.sandbox, paths=result.paths))

        def write(txn: Txn) -> None:
            nonlocal tree
            if scan is not None:
                tree = self._tree.store_txn(txn, self.sandbox, scan)
            leases.recorded(txn, mission_id, self.unit.id, epoch, mark=hwm, tree=tree)  # the fence: stale stops here
            if not done:  # an effect's intent: the lease it starts under is renewed with it (hold_lease)
                host.renew(txn)
            m.journal_put(txn, mission_id, self.lane, entry)
            for item in result.evidence:
                m.add_evidence(txn, mission_id, msgspec.structs.replace(item, lane=self.lane, seq=step.seq))
            if result.extra is not None:
                result.extra(txn)

        urgent = not done or host.policy.urgent(step.method, result.tool_class, wall_ms, result.tokens)
        await host.writer.commit(write, urgent=urgent)
        self._lease = (self._lease[0] if tree is None else tree, self._lease[1], hwm)
        self._keep(entry)
        if done:
            self.executed += 1
            host.stats["executed"] += 1
            host.graph.update(self.unit.id, journal_hwm=hwm)
        self._note_quiet()
        if done:
            host.step_recorded(self.unit.id, step.method, result.summary, wall_ms)
        return answer(entry)

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


# -- one handler per agent method --------------------------------------------------------------------
Handler = Callable[[UnitSession, Step, Any], Awaitable[Any]]


async def _human_ask(session: UnitSession, step: Step, params: Any) -> Any:
    """A question without a recorded answer: the mission waits for a person; the answer arrives by
    replay when it resumes (recovery.apply_answer writes it into this unit's journal)."""
    ask = msgspec.convert(params, ap.HumanAskParams)
    question = Question(
        unit=session.unit.id,
        seq=step.seq,
        text=ask.question,
        choices=ask.choices,
        fingerprint=step.fingerprint,
        lane=session.lane,
    )
    await session.host.wait_for_input(question)
    await asyncio.Event().wait()  # never answered here: the host stops this agent


async def _now(session: UnitSession, step: Step, params: Any) -> Any:
    return await session.record(step, StepResult({"time": time.time()}))


async def _random(session: UnitSession, step: Step, params: Any) -> Any:
    return await session.record(step, StepResult({"value": random.random()}))


async def _evidence_add(session: UnitSession, step: Step, params: Any) -> Any:
    ev = msgspec.convert(params or {}, ap.EvidenceAddParams)
    item = Evidence(kind=ev.kind, at=time.time(), unit=session.unit.id, summary=ev.summary, data=ev.data)
    return await session.record(step, StepResult({}, evidence=(item,)))


async def _state_save(session: UnitSession, step: Step, params: Any) -> Any:
    state = msgspec.convert(params or {}, ap.StateSaveParams).state
    digest: list[str] = []  # the agent state as a shared blob, named in the next checkpoint
    result = await session.record(
        step, StepResult({"state": state}, extra=lambda txn: digest.append(txn.put_object(state)))
    )
    session.host.graph.update(session.unit.id, agent_state=digest[-1])
    return result


async def _plan_add(session: UnitSession, step: Step, params: Any) -> Any:
    units = msgspec.convert(params, ap.PlanAddParams).units
    added, commit = await session.host.plan_add(session.unit.id, units)  # durable with the entry
    return await session.record(step, StepResult({"added": added}, extra=commit, summary=f"added {', '.join(added)}"))


async def _model_complete(session: UnitSession, step: Step, params: Any) -> Any:
    await session.within_budget()
    return await session.record(step, session.paid(await session.models.complete(session.unit.id, params)))


async def _tool_run(session: UnitSession, step: Step, params: Any) -> Any:
    return await session.tools.run(msgspec.convert(params, ap.ToolRunParams), step)


async def _model_forward(session: UnitSession, step: Step, params: Any) -> Any:
    if (earlier := session.forwarded(params, step.fingerprint)) is not None:
        return await _replay_forward(session, step, earlier)
    await session.within_budget()
    return await session.record(step, session.paid(await session.models.forward(session.unit.id, params)))


async def _replay_forward(session: UnitSession, step: Step, earlier: JournalEntry) -> Any:
    """A model request an earlier run already paid for: answered from that entry; the new entry names it."""
    value = dict(earlier.result, replayed_from=earlier.seq)
    note = {k: v for k, v in value.items() if k not in ("body", "usage")}  # nothing paid for this one
    await session.record(step, StepResult(note, summary=f"answered from entry {earlier.seq}: no request made"))
    session.replayed += 1
    session.host.stats["replayed"] += 1
    return value


async def _effect_ask(session: UnitSession, step: Step, params: Any) -> Any:
    """An outside agent's effect, asked before it is made: allowed when the mission's permissions allow the
    keel tool it counts as. An allowed effect is recorded as an intent until the agent reports its outcome
    (`effect/done`). The same effect asked again after a crash while its intent has no outcome (`step.intent`)
    is in doubt: a question for a person (rerun or skip), as an uncertain tool call is."""
    ask = msgspec.convert(params, ap.EffectAskParams)
    allowed = session.host.spec.permissions.tools
    allow = ask.tool in allowed
    reason = (
        "" if allow else f"{ask.tool!r} is not allowed by this mission's permissions (allowed: {', '.join(allowed)})"
    )
    summary = f"{'allowed' if allow else 'denied'} {ask.tool}: {ask.title}"[:200]
    intent = step.intent
    if intent is not None:  # the run that asked first makes nothing after it is judged or made again
        await session.end_earlier_runs()
    if intent is not None and not intent.rerun_approved:
        await ask_rerun_or_skip(
            session,
            step,
            f"unit {session.unit.id}: the agent's {ask.tool} {ask.title[:120]!r} may or may not have happened "
            "before keel stopped (the agent never reported its outcome). Let it run again (rerun), or keep going "
            "without it because it did happen (skip)?",
        )
    result = StepResult(
        msgspec.to_builtins(ap.EffectAskResult(allow=allow, reason=reason)),
        phase="intent" if allow else "done",
        summary=summary if intent is None else f"{summary} (again: a person said rerun)"[:200],
    )
    if not allow:
        return await session.record(step, result)
    answered = await session.record_intent(step, result, ask.tool)  # the agent makes the effect once answered
    if ask.call_id:
        session.asked[ask.call_id] = step.seq
    return answered


async def _effect_done(session: UnitSession, step: Step, params: Any) -> Any:
    """The outcome of an allowed effect: its intent becomes done, in the same transaction as this entry."""
    done = msgspec.convert(params, ap.EffectDoneParams)
    seq = session.asked.pop(done.call_id, 0)
    intent = session.entries.get(seq)
    settled = None
    if intent is not None and intent.phase == "intent":
        mark = intent.effect
        if mark is not None:  # the files the effect left
            mark = msgspec.structs.replace(mark, after=await session.files_now())
        outcome = {**(intent.result if isinstance(intent.result, dict) else {}), "outcome": done.status}
        if done.output:
            outcome["output"] = done.output[-OUTPUT_KEPT:]
        settled = msgspec.structs.replace(
            intent, phase="done", result=outcome, effect=mark, summary=f"{intent.summary} ({done.status})"[:200]
        )
    mission, lane_ = session.host.mission_id, session.lane

    def settle(txn: Txn) -> None:
        if settled is not None:
            m.journal_put(txn, mission, lane_, settled)

    summary = f"{done.status}: the effect of entry {seq}" if settled else f"{done.status}: {done.call_id}"
    answered = await session.record(step, StepResult({}, summary=summary[:200], extra=settle))
    if settled is not None:
        session.entries[seq] = settled
    return answered


def _saved_state(saved: JournalEntry | None) -> Any:
    """The agent state the newest `state/save` entry holds, for `unit/run`."""
    return saved.result.get("state") if saved is not None and isinstance(saved.result, dict) else None


def _history_line(entry: JournalEntry) -> str:
    """One journal entry in words, for an appending agent picking up its unit again; an effect with its
    outcome as recorded."""
    if entry.effect is not None:
        return f"{entry.seq} {entry.kind}: {entry.effect.text} - {effect_outcome(entry)}"
    state = "" if entry.phase == "done" else " (started, no result recorded)"
    return f"{entry.seq} {entry.kind}: {entry.summary or entry.error or ''}{state}".strip()


HANDLERS: dict[str, Handler] = {
    "human/ask": _human_ask,
    "now": _now,
    "random": _random,
    "evidence/add": _evidence_add,
    "state/save": _state_save,
    "plan/add": _plan_add,
    "model/complete": _model_complete,
    "tool/run": _tool_run,
    "model/forward": _model_forward,
    "effect/ask": _effect_ask,
    "effect/done": _effect_done,
}
WAITS_FOR_A_PERSON = frozenset({"human/ask"})
