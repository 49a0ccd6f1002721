"""One unit's run: its worker process, and the journal-backed answers to its agent's requests.

A step is the step core's decision (step/core.py: answer from the journal, run, ask, refuse, fail) over
the lane as this run holds it, and the I/O around it: `handle` numbers the request, pages the lane in
(`recorder.Recorder`), asks the core, and answers from the journal or hands the step to its handler
(`handlers.HANDLERS`, written against the port this session is), whose result the recorder journals.
The worker process (`workerproc.WorkerProcess`) is started up to MAX_AGENT_STARTS times; how each start
ended becomes the unit's outcome by one pure decision (`ending.ending`). A full disk anywhere in a unit
(a tool's write, a journal commit, the subagent's completion, its sandbox) stops the mission paused
(disk_full) and the unit as `stopped`: nothing of it is recorded as a failure or a result (a sandbox that
could not be made, a worker that died or an agent that failed the unit while the store met a full disk
or the filesystem had no room: `_full_disk`, over diskspace.failed_for_space); so does a worker process
that could not open the store at each of its starts (reason `store`, with the server's words).
Depends on storage, protocol and the engine's own modules; sees the host only through interface.Host,
never imports the host module.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import msgspec

from keel.protocol import agent as ap
from keel.protocol import rpc
from keel.protocol.diskspace import disk_full, failed_for_space, free_or_none, says_no_space
from keel.protocol.errors import DiskFullError, KeelError
from keel.protocol.records import JournalEntry, UnitLease
from keel.protocol.spec import UnitSpec
from keel.protocol.states import OutcomeKind, PauseReason
from keel.server.engine.agentproc import AgentError, AgentProcess, HandlerError, RemoteError
from keel.server.engine.checkpoint import QuietMark
from keel.server.engine.files.sandbox import SandboxError
from keel.server.engine.interface import Host, Step, StepResult, answer
from keel.server.engine.journal import NondeterminismError, lane, request_fingerprint
from keel.server.engine.step.core import Act, Request, next_step
from keel.server.engine.step.effects import Effect, effect_of
from keel.server.engine.step.models import ModelCalls
from keel.server.engine.step.replay import REPLAYED, replayed_count
from keel.server.engine.step.toolcalls import ToolCalls
from keel.server.engine.units.ending import Ended, Raised, Then, Verdict, ending
from keel.server.engine.units.handlers import HANDLERS, WAITS_FOR_A_PERSON, Handler, answer_again
from keel.server.engine.units.placement import PreparedSandbox
from keel.server.engine.units.recorder import PAGE, Recorder
from keel.server.engine.units.workerloop import EXIT_NO_STORE
from keel.server.engine.units.workerproc import WorkerProcess, history_line, saved_state
from keel.server.tools import TOOLS

__all__ = ["HANDLERS", "MAX_AGENT_STARTS", "PAGE", "WAITS_FOR_A_PERSON", "Outcome", "UnitPlaces", "UnitSession"]

MAX_AGENT_STARTS = 3  # an agent that dies mid-unit is started again (replaying its journal) this often
K = OutcomeKind
_KINDS = {Then.EXPIRED: K.EXPIRED, Then.STOPPED: K.STOPPED, Then.FAILED: K.FAILED}


class Outcome(msgspec.Struct, frozen=True):
    kind: OutcomeKind
    result: Any = None
    error: str = ""


class UnitPlaces(Protocol):
    """Where a unit's session gets its sandbox and its worker's lease: the mission host's registry, or a
    `keel worker`'s claim (workerhost.py)."""

    @property
    def ttl(self) -> float: ...

    async def completed(self, uid: str) -> UnitLease | None: ...
    async def prepare(self, uid: str) -> PreparedSandbox: ...
    async def grant(self, uid: str, where: PreparedSandbox) -> UnitLease: ...


class UnitSession:
    def __init__(self, host: Host, registry: UnitPlaces, models: ModelCalls, unit: UnitSpec) -> None:
        self.host = host
        self.registry = registry
        self.models = models
        self.unit = unit
        self.lane = lane(unit.id, host.graph.mark(unit.id).epoch)
        self.journal = Recorder(host, unit.id, self.lane)
        self.worker = WorkerProcess(host, unit, self.lane)
        self.tools = ToolCalls(self)
        self.seq = 0  # the number of the agent's last request in this start of its worker
        self.resumed_at = 0  # a resuming agent's first request in this start is number resumed_at + 1
        self.agent_run = 0  # how many times this session has started the unit's worker and agent
        self.replayed = 0
        self.inflight = 0
        self.stopping = False
        self.expired = False
        self.fatal: Exception | None = None
        self.asked: dict[str, int] = {}  # an allowed effect's call id -> its intent's seq, until effect/done
        self.spent = (0, 0)  # model requests and tokens paid for in this run of the unit ([budget])
        self._idle = asyncio.Event()
        self._idle.set()

    # -- what the host and the registry read --------------------------------------------------------
    @property
    def unit_id(self) -> str:
        return self.unit.id

    @property
    def epoch(self) -> int:
        return self.journal.epoch

    @property
    def quiet(self) -> QuietMark | None:
        return self.journal.quiet

    @property
    def executed(self) -> int:
        return self.journal.executed

    @property
    def proc(self) -> AgentProcess | None:
        return self.worker.proc

    @property
    def sandbox(self) -> Path:
        return self.journal.sandbox

    @property
    def entries(self) -> Mapping[int, JournalEntry]:
        return self.journal.entries

    # -- lifecycle ----------------------------------------------------------------------------------
    async def run(self) -> Outcome:
        if (done := await self.registry.completed(self.unit.id)) is not None:
            return Outcome(K.SUCCEEDED, result=done.place.result)
        try:
            placement = await self.registry.prepare(self.unit.id)
            self.journal.use_sandbox(Path(placement.sandbox), placement.files)
        except DiskFullError as exc:
            return await self._disk_full(exc.message)
        except (KeelError, OSError) as exc:
            return await self._unmade(exc.message if isinstance(exc, KeelError) else str(exc))
        error = ""
        for start in range(1, MAX_AGENT_STARTS + 1):
            try:
                self.journal.granted(await self.registry.grant(self.unit.id, placement))
                placement = msgspec.structs.replace(placement, scan=None)  # a fresh sandbox's base: stored once
                return await self._run_once(start)
            except (DiskFullError, AgentError, RemoteError, TimeoutError, msgspec.ValidationError, OSError) as exc:
                verdict = ending(self._ended(exc, start))
                if verdict.then is not Then.AGAIN:
                    return await self._outcome(verdict)
                error = verdict.message
                self.host.progress.line(f"unit {self.unit.id}: {error}; starting it again ({start}/{MAX_AGENT_STARTS})")
            finally:
                await self.worker.close()
        return Outcome(K.FAILED, error=f"{error} (gave up after {MAX_AGENT_STARTS} starts)")

    def _ended(self, exc: Exception, start: int) -> Ended:
        """The facts of how a start ended, for `ending`: the error's own, and this run's state."""
        fatal = str(self.fatal or "")
        run = Ended(Raised.GARBLED, "", expired=self.expired, stopping=self.stopping, fatal=fatal)
        run = replace(run, start=start, starts=MAX_AGENT_STARTS)
        if isinstance(exc, DiskFullError):
            return replace(run, raised=Raised.DISK_FULL, message=exc.message)
        if isinstance(exc, AgentError):  # it died or could not start: for want of space?
            full = self._full_disk("worker stopped")
            run = replace(run, raised=Raised.AGENT, died=exc.died, no_store=exc.exit_code == EXIT_NO_STORE)
            return replace(run, message=exc.message, last_words=exc.last_words, full=full)
        if isinstance(exc, RemoteError):
            full = self._full_disk("agent failed the unit")
            return replace(run, raised=Raised.REMOTE, message=exc.message, rpc_code=exc.rpc_code, full=full)
        if isinstance(exc, (TimeoutError, msgspec.ValidationError)):
            return replace(run, message=f"agent {self.unit.id} did not answer properly: {exc!r}")
        if not isinstance(exc, OSError) or not says_no_space(exc):  # the unit's home or its agent's log
            raise exc
        where = exc.filename or self.sandbox
        message = disk_full(where, str(exc), f"unit {self.unit.id}'s files at").message
        return replace(run, raised=Raised.DISK_FULL, message=message)

    async def _outcome(self, verdict: Verdict) -> Outcome:
        if verdict.then is Then.DISK_FULL:
            return await self._disk_full(verdict.message)
        if verdict.then is Then.NO_STORE:
            why = f"unit {self.unit.id}'s worker process, {MAX_AGENT_STARTS} times: {verdict.message}"
            await self.host.stop(PauseReason.STORE, why)
            return Outcome(K.STOPPED)
        return Outcome(_KINDS[verdict.then], error=verdict.message)

    async def _run_once(self, start: int) -> Outcome:
        journal, worker = self.journal, self.worker
        saved = await journal.open()
        self.seq = self.resumed_at = 0
        self.agent_run += 1
        hide = self.models.hidden_env
        proc = await worker.start(journal.epoch, self.sandbox, self.registry.ttl, self.handle, self._notice, hide)
        if self.stopping:
            return Outcome(K.STOPPED)
        hello = await worker.initialize(proc, self.sandbox)
        journal.appending = hello.journal == "append"
        # a resuming agent carries on from its saved state: what it did before that save is not replayed
        self.resumed_at = saved.seq if saved is not None and hello.resumes and not journal.appending else 0
        history: tuple[str, ...] = ()
        if journal.appending:  # it looks back over its whole history, and carries on after its last entry
            history = await journal.load_all(history_line)
            self.seq = journal.top
            self.asked = {}
        else:
            self.seq = self.resumed_at
            await journal.start_at(self.resumed_at)
            if journal.entries:  # the worker answers what it can of the replay (replay.py)
                await worker.hand_replay(proc, list(journal.entries.values()), self.resumed_at, self._numbered)
        try:
            result = await worker.run_unit(proc, start, saved_state(saved), journal.top, history, self.resumed_at)
        except TimeoutError:
            limit = self.unit.timeout_s
            self.fatal = TimeoutError(f"unit {self.unit.id} took longer than its timeout_s of {limit} s")
            return Outcome(K.FAILED, error=str(self.fatal))
        if self.fatal is not None:
            return Outcome(K.FAILED, error=str(self.fatal))
        return Outcome(K.SUCCEEDED, result=msgspec.convert(result or {}, ap.UnitRunResult).result)

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
        await self.worker.close()

    def expire(self) -> AgentProcess | None:
        """The lease was taken over: stop waiting for this worker (it is fenced, not killed); the caller
        keeps the returned process to kill when the host stops."""
        self.expired = True
        return self.worker.expire()

    async def end_earlier_runs(self) -> None:
        await self.worker.end_others()

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

    async def _answer(self, handler: Handler, method: str, params: Any, fp: str) -> Any:
        """Number the request, ask the step core what to do with it (step/core.py), and do that."""
        journal, seq = self.journal, self.seq + 1
        effect = self._effect_of(method, params) if journal.appending else None
        if not journal.appending:  # numbered by position: the entry at its number is at hand
            self.seq = seq
            await self._recorded(seq)
        elif effect is not None and not self.sandbox.is_dir():
            self.seq = seq
            self._sandbox_gone(seq)
        request = Request(
            seq,
            method,
            fp,
            effect,
            files=await journal.files_now() if effect is not None else "",
            refusal=self._refusal(effect),
            ordinal=params.get("ordinal") if isinstance(params, dict) else None,
        )
        todo = next_step(
            await journal.page(request) if journal.appending else journal.entries, request, journal.appending
        )
        if todo.act is Act.FAIL and todo.entry is not None:
            self._nondeterminism(seq, todo.entry, method)
        self.seq = max(self.seq, todo.seq)  # an effect in doubt is settled at its intent's number
        if todo.act is Act.ANSWER and todo.entry is not None:
            if not journal.appending:
                self.note_replay(todo.entry)
                return answer(todo.entry)
            return await answer_again(self, Step(seq, method, fp, time.monotonic()), todo.entry, todo.reason)
        if method == "tool/run" and not self.sandbox.is_dir():
            self._sandbox_gone(todo.seq)
        intent = todo.entry if todo.entry is not None and todo.entry.phase == "intent" else None
        recorded_fp = intent.fingerprint if intent is not None and journal.appending else fp
        step = Step(todo.seq, method, recorded_fp, time.monotonic(), intent=intent, effect=todo.mark)
        return await handler(self, step, params)

    async def _recorded(self, seq: int) -> None:
        """Have the entry recorded at `seq` at hand as this run of the agent must see it. A change an earlier
        run asked for (its worker died mid-call) is still being made or recorded: wait for its outcome, then
        read the entry back, since that run's recording changes what this one holds in memory. An entry not
        held but within the lane is read back too."""
        journal = self.journal
        if journal.loaded < seq <= journal.top:
            await journal.page_in(seq)
        entry = journal.entries.get(seq)
        if entry is not None and entry.phase == "done":
            return
        if await self.tools.settle_earlier(self.agent_run) or (entry is None and seq <= journal.top):
            await journal.read_back(seq)

    def _effect_of(self, method: str, params: Any) -> Effect | None:
        """The effect an appending agent's request asks for: `effect/ask`, or a `tool/run` of an effectful tool."""
        if method == "tool/run":
            tool = TOOLS.get(str(params.get("tool", ""))) if isinstance(params, dict) else None
            if tool is None or tool.klass != "effectful":
                return None
        elif method != "effect/ask":
            return None
        return effect_of(method, params, str(self.sandbox))

    def _refusal(self, effect: Effect | None) -> str:
        if effect is None or effect.tool in self.host.spec.permissions.tools:
            return ""
        return f"{effect.tool!r} is not allowed by this mission's permissions"

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

    def paid(self, result: StepResult) -> StepResult:
        """Count a model request served by a provider against the unit's budget."""
        requests, tokens = self.spent
        self.spent = (requests + 1, tokens + result.tokens)
        return result

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

    def _numbered(self) -> int:
        """How many of the agent's requests this start has numbered here."""
        return self.seq - self.resumed_at

    def replayed_by_worker(self, count: int) -> None:
        """The worker answered the agent's first `count` requests (of this start) from the entries it was
        handed; the next request is number resumed_at + count + 1. A report that cannot be true fails the unit."""
        handed, self.worker.handed = self.worker.handed, 0
        if self._numbered() != 0 or not 0 < count <= handed:
            error = AgentError(
                f"unit {self.unit.id}'s worker reported {count} replayed requests, but it was handed "
                f"{handed} entries and the host had numbered {self._numbered()} requests"
            )
            self.fatal = error
            self.worker.fail(error)
            return
        self.seq = self.resumed_at + count
        self.journal.forget_upto(self.seq)  # answered next to the agent: never looked up here
        self.count_replayed(count)

    # -- the port the handlers and tool calls use (handlers.UnitPort, interface.UnitSteps) --------------
    def changing(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.journal.changing()

    async def record(self, step: Step, result: StepResult) -> Any:
        return await self.journal.record(step, result)

    async def record_intent(self, step: Step, result: StepResult, tool: str) -> Any:
        return await self.journal.record_intent(step, result, tool)

    async def hold_lease(self, renewed: float) -> None:
        await self.journal.hold_lease(renewed)

    async def files_now(self) -> str:
        return await self.journal.files_now()

    def note_replay(self, entry: JournalEntry) -> None:
        """A step answered from its recorded entry."""
        self.journal.keep(entry)
        self.count_replayed(1)

    def count_replayed(self, count: int) -> None:
        self.replayed += count
        self.host.stats["replayed"] += count

    async def record_settling(self, step: Step, result: StepResult, settles: JournalEntry | None) -> Any:
        return await self.journal.record(step, result, settles)
