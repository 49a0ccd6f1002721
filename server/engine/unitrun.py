"""One unit's run: its agent subprocess, and the journal-backed answers to the agent's requests.

A step reads as one line: check the recorded result, else run and record. Requests are numbered per
unit in arrival order (the SDK sends them one at a time); a request whose fingerprint does not match the
entry at its number is a NondeterminismError. An effectful tool call records an intent before it runs;
an intent found without a result is reconciled against the sandbox or turned into a question. A full disk
anywhere in a unit (a tool's write, a journal commit, the subagent's completion, its sandbox) stops the
mission paused (disk_full) and the unit as `stopped`: nothing of it is recorded as a failure or a result.
Depends on storage, protocol and the engine's own modules.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from keel.protocol import agent as ap
from keel.protocol import rpc
from keel.protocol.diskspace import disk_full, nearly_full
from keel.protocol.errors import DiskFullError, KeelError
from keel.protocol.records import Evidence, JournalEntry, Question, StepCost
from keel.protocol.spec import UnitSpec
from keel.server.engine import places
from keel.server.engine.agentproc import AgentError, AgentProcess, HandlerError, RemoteError, resolve_command
from keel.server.engine.checkpoint import TreeDigest
from keel.server.engine.journal import NondeterminismError, fingerprint, lane
from keel.server.engine.toolcalls import ToolCalls
from keel.storage import Txn, leases
from keel.storage import missions as m

if TYPE_CHECKING:
    from keel.server.engine.host import MissionHost

MAX_AGENT_STARTS = 3  # an agent that dies mid-unit is started again (replaying its journal) this often


class Outcome(msgspec.Struct, frozen=True):
    kind: str  # "succeeded" | "failed" | "stopped" | "expired" (its lease was taken over)
    result: Any = None
    error: str = ""


class UnitSession:
    def __init__(self, host: MissionHost, unit: UnitSpec) -> None:
        self.host = host
        self.unit = unit
        mark = host.graph.mark(unit.id)
        self.lane = lane(unit.id, mark.epoch)
        self.entries: dict[int, JournalEntry] = {}
        self.seq = 0
        self.replayed = 0
        self.executed = 0
        self.inflight = 0
        self.stopping = False
        self.expired = False
        self.epoch = 0  # the lease epoch of the current worker: fences this session's journal writes
        self.sandbox = host.sandbox
        self._tree = TreeDigest()
        self.fatal: Exception | None = None
        self.proc: AgentProcess | None = None
        self.tools = ToolCalls(self)
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle ----------------------------------------------------------------------------------
    async def run(self) -> Outcome:
        error = ""
        try:
            self.sandbox = Path((placement := await self.host.registry.prepare(self.unit.id)).sandbox)
        except DiskFullError as exc:
            return await self._disk_full(exc.message)
        except KeelError as exc:
            return Outcome("failed", error=f"cannot make the sandbox of unit {self.unit.id}: {exc.message}")
        for start in range(1, MAX_AGENT_STARTS + 1):
            try:
                self.epoch = (await self.host.registry.grant(self.unit.id, placement)).epoch
                return await self._run_once(start)
            except DiskFullError as exc:
                return await self._disk_full(exc.message)
            except AgentError as exc:
                if self.expired:
                    return Outcome("expired")
                if self.stopping:
                    return Outcome("stopped")
                if self.fatal is not None:
                    return Outcome("failed", error=str(self.fatal))
                if full := self._full_disk():  # a worker that died or could not start for want of space
                    return await self._disk_full(full)
                if not exc.died:
                    return Outcome("failed", error=exc.message)
                error = exc.message
                self.host.progress.line(f"unit {self.unit.id}: {error}; starting it again ({start}/{MAX_AGENT_STARTS})")
            except RemoteError as exc:
                if self.expired:
                    return Outcome("expired")
                if exc.rpc_code == ap.ERR_DISK_FULL:  # the subagent could not record the unit's completion
                    return await self._disk_full(exc.message)
                if self.stopping:
                    return Outcome("stopped")
                return Outcome("failed", error=str(self.fatal or f"agent failed the unit: {exc.message}"))
            except (TimeoutError, msgspec.ValidationError) as exc:
                return Outcome("failed", error=f"agent {self.unit.id} did not answer properly: {exc!r}")
            finally:
                await self._close()
        return Outcome("failed", error=f"{error} (gave up after {MAX_AGENT_STARTS} starts)")

    async def _run_once(self, start: int) -> Outcome:
        entries = await asyncio.to_thread(
            self.host.store.read, lambda t: m.journal_entries(t, self.host.mission_id, self.lane)
        )
        self.entries = {e.seq: e for e in entries}
        self.seq = 0
        host = self.host
        worker = (
            sys.executable,
            "-m",
            "keel.server.engine.subagent",
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
            str(host.registry.ttl),
            "--",
            *resolve_command(host.spec.agent),
        )
        proc = self.proc = await AgentProcess.start(
            worker,
            cwd=self.sandbox,
            env=host.spec.env,
            handler=self.handle,
            name=self.unit.id,
            hide_env=host.models.hidden_env,
            log=places.agent_log_path(host.store_path, host.mission_id, self.unit.id),
        )
        if self.stopping:
            return Outcome("stopped")
        init = ap.InitializeParams(
            protocol_version=ap.PROTOCOL_VERSION,
            mission_id=host.mission_id,
            goal=host.spec.goal,
            sandbox=str(self.sandbox),
        )
        await asyncio.wait_for(proc.request("initialize", init), timeout=30)
        params = ap.UnitRunParams(
            unit=self.unit, attempt=start, state=self._saved_state(), replaying=bool(self.entries)
        )
        try:
            result = await asyncio.wait_for(proc.request("unit/run", params), timeout=self.unit.timeout_s)
        except TimeoutError:
            limit = self.unit.timeout_s
            self.fatal = TimeoutError(f"unit {self.unit.id} took longer than its timeout_s of {limit} s")
            return Outcome("failed", error=str(self.fatal))
        if self.fatal is not None:
            return Outcome("failed", error=str(self.fatal))
        decoded = msgspec.convert(result or {}, ap.UnitRunResult)
        return Outcome("succeeded", result=decoded.result)

    async def _disk_full(self, message: str) -> Outcome:
        await self.host.stop_for_disk_full(message)
        return Outcome("stopped")

    def _full_disk(self) -> str:
        """Why the store's or this unit's sandbox's filesystem counts as full now, or ""."""
        if full := self.host.store.full_disk():
            return full
        for path, what in ((self.host.store.path, "the store at"), (self.sandbox, "the sandbox")):
            if nearly_full(path):
                return disk_full(
                    path, f"unit {self.unit.id}'s worker stopped while the filesystem was full", what
                ).message
        return ""

    def _saved_state(self) -> Any:
        saved = [e for e in self.entries.values() if e.kind == "state/save" and e.phase == "done"]
        return saved[-1].result.get("state") if saved and isinstance(saved[-1].result, dict) else None

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
        if self.proc is not None:
            proc, self.proc = self.proc, None
            await proc.close(grace=1.0)

    # -- requests from the agent ----------------------------------------------------------------------
    async def handle(self, method: str, params: Any) -> Any:
        if method not in ap.AGENT_METHODS:
            raise HandlerError(rpc.METHOD_NOT_FOUND, f"unknown method {method!r}")
        if self.stopping or self.expired or self.fatal is not None:
            await asyncio.Event().wait()  # never answered: the agent is about to be stopped
        self.seq += 1
        seq = self.seq
        fp = fingerprint(method, params)
        entry = self.entries.get(seq)
        if entry is not None:
            if entry.fingerprint != fp:
                self._nondeterminism(seq, entry, method)
            if entry.phase == "done":
                self.replayed += 1
                self.host.stats["replayed"] += 1
                return _answer(entry)
        if method == "human/ask":
            return await self._ask(params, seq, fp)
        self.inflight += 1
        self._idle.clear()
        try:
            return await self._execute(method, params, seq, fp, entry)
        except DiskFullError as exc:  # never the step's result: its intent (if any) stays for the resume
            await self.host.stop_for_disk_full(exc.message)
            raise HandlerError(ap.ERR_PAUSING, f"the mission pauses: {exc.message}") from None
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    async def _ask(self, params: Any, seq: int, fp: str) -> Any:
        """A question without a recorded answer: the mission waits for a person; the answer arrives by
        replay when it resumes (recovery.apply_answer writes it into this unit's journal)."""
        ask = msgspec.convert(params, ap.HumanAskParams)
        question = Question(
            unit=self.unit.id, seq=seq, text=ask.question, choices=ask.choices, fingerprint=fp, lane=self.lane
        )
        await self.host.wait_for_input(question)
        await asyncio.Event().wait()  # never answered here: the host stops this agent

    def _nondeterminism(self, seq: int, entry: JournalEntry, method: str) -> None:
        error = NondeterminismError(
            f"nondeterminism in mission {self.host.mission_id} unit {self.unit.id} entry {seq}: "
            f"the journal has {entry.kind} ({entry.summary or entry.fingerprint[:12]}), the agent sent "
            f"{method} with different params"
        )
        self.fatal = error
        raise HandlerError(ap.ERR_NONDETERMINISM, error.message)

    async def _execute(self, method: str, params: Any, seq: int, fp: str, intent: JournalEntry | None) -> Any:
        begin = time.monotonic()
        match method:
            case "now":
                return await self.record(seq, method, fp, {"time": time.time()}, begin)
            case "random":
                return await self.record(seq, method, fp, {"value": random.random()}, begin)
            case "evidence/add":
                ev = msgspec.convert(params or {}, ap.EvidenceAddParams)
                item = Evidence(kind=ev.kind, at=time.time(), unit=self.unit.id, summary=ev.summary, data=ev.data)
                return await self.record(seq, method, fp, {}, begin, evidence=[item])
            case "state/save":
                state = msgspec.convert(params or {}, ap.StateSaveParams).state
                digest: list[str] = []  # the agent state as a shared blob, named in the next checkpoint
                result = await self.record(
                    seq, method, fp, {"state": state}, begin, extra=lambda txn: digest.append(txn.put_object(state))
                )
                self.host.graph.update(self.unit.id, agent_state=digest[-1])
                return result
            case "plan/add":
                return await self.host.plan_add(self, seq, fp, msgspec.convert(params, ap.PlanAddParams), begin)
            case "model/complete":
                return await self.host.model_complete(self, seq, fp, params, begin)
            case "tool/run":
                return await self.tools.run(msgspec.convert(params, ap.ToolRunParams), seq, fp, intent, begin)
        raise HandlerError(rpc.METHOD_NOT_FOUND, f"unknown method {method!r}")

    async def record(
        self,
        seq: int,
        method: str,
        fp: str,
        result: Any,
        begin: float,
        *,
        error: str = "",
        tool_class: str | None = None,
        tokens: int = 0,
        served_model: str = "",
        summary: str = "",
        evidence: list[Evidence] | None = None,
        phase: str = "done",
        extra: Any = None,
    ) -> Any:
        """Make the entry durable (group-committed when cheap), then return the result to the agent."""
        wall_ms = (time.monotonic() - begin) * 1000
        entry = JournalEntry(
            seq=seq,
            kind=method,
            fingerprint=fp,
            phase=phase,  # type: ignore[arg-type]
            result=result,
            error=error,
            tool_class=tool_class,  # type: ignore[arg-type]
            served_model=served_model,
            at=time.time(),
            cost=StepCost(wall_ms=round(wall_ms, 3), tokens=tokens),
            summary=summary,
        )
        host = self.host
        mission_id = host.mission_id
        epoch = self.epoch
        changes: dict[str, Any] = {"last_checkpoint": seq}
        if phase == "done" and tool_class in ("effectful", "idempotent"):  # files may have changed
            changes["tree"] = await asyncio.to_thread(self._tree, self.sandbox)

        def write(txn: Txn) -> None:
            leases.update(txn, mission_id, self.unit.id, epoch, **changes)  # the fence: a stale worker stops here
            m.journal_put(txn, mission_id, self.lane, entry)
            for item in evidence or ():
                m.add_evidence(txn, mission_id, msgspec.structs.replace(item, lane=self.lane, seq=seq))
            if extra is not None:
                extra(txn)

        urgent = phase == "intent" or host.policy.urgent(method, tool_class, wall_ms, tokens)
        await host.writer.commit(write, urgent=urgent)
        self.entries[seq] = entry
        if phase == "done":
            self.executed += 1
            host.stats["executed"] += 1
            host.graph.update(self.unit.id, journal_hwm=seq)
            host.step_recorded(self, method, summary, wall_ms)
        if error:
            code = result.get("code", -32000) if isinstance(result, dict) else -32000
            raise HandlerError(code, error)
        return result


def _answer(entry: JournalEntry) -> Any:
    if entry.error:
        code = entry.result.get("code", -32000) if isinstance(entry.result, dict) else -32000
        raise HandlerError(code, entry.error)
    return entry.result
