"""What the step code of a mission needs from its host, and the values a step is made of.

`Host` is the narrow, typed interface that `unitrun`, `toolcalls`, `models` and `registry` use of the
mission host; `MissionHost` (host.py) implements it. A `Step` is one agent request being answered: its
number, fingerprint, start time and the intent an earlier run left at that number; a `StepResult` is what
the step's handler hands to the unit's recorder (`units/recorder.py`), the one place a step is journaled.
`UnitSteps` is what a unit's tool calls need of their unit's session.

Depends on protocol, storage and the engine's leaf modules (graph, journal, checkpoint, progress,
agentproc); never on host, unitrun, toolcalls, models or registry, which all depend on this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from keel.protocol.records import EffectMark, Evidence, JournalEntry, MissionRecord, Question, ToolClass
from keel.protocol.spec import MissionSpec, UnitSpec
from keel.protocol.states import PauseReason
from keel.server.engine.agentproc import AgentProcess, HandlerError
from keel.server.engine.graph import Graph
from keel.server.engine.journal import JournalWriter
from keel.server.engine.step.policy import Policy
from keel.server.engine.step.progress import Progress
from keel.storage import Store, Txn

TxnFn = Callable[[Txn], object]  # more work for the transaction that records a step or a checkpoint


@dataclass(frozen=True, slots=True)
class Step:
    """One agent request being answered: what it is recorded under, and since when it runs."""

    seq: int  # its number in the unit's journal lane
    method: str  # the agent method, the journal entry's kind
    fingerprint: str  # of method and canonical params; a replay must match it
    begin: float  # time.monotonic() when the request was taken up
    intent: JournalEntry | None = None  # an intent an earlier run recorded at this number, without a result
    effect: EffectMark | None = None  # an outside agent's effect: recorded with its entry (engine/step/effects.py)

    def wall_ms(self) -> float:
        return (time.monotonic() - self.begin) * 1000


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a handler hands to `record`: the answer for the agent and what goes into its journal entry."""

    value: Any  # the result the agent receives (an error's payload when `error` is set)
    error: str = ""  # the agent receives an error with this message (and value["code"])
    phase: Literal["intent", "done"] = "done"
    tool_class: ToolClass | None = None
    tokens: int = 0
    served_model: str = ""
    summary: str = ""
    evidence: tuple[Evidence, ...] = ()
    extra: TxnFn | None = None  # written in the same transaction as the entry
    paths: tuple[str, ...] | None = None  # the only sandbox paths the step changed, when keel's tool knows them
    rerun: bool = False  # an intent to be run again on resume (JournalEntry.rerun_approved)


def answer(entry: JournalEntry) -> Any:
    """The answer a recorded entry gives the agent: its result, or its error raised."""
    if entry.error:
        code = entry.result.get("code", -32000) if isinstance(entry.result, dict) else -32000
        raise HandlerError(code, entry.error)
    return entry.result


class LeasedWorker(Protocol):
    """A running unit as the registry's lease watch sees it."""

    @property
    def epoch(self) -> int: ...

    @property
    def proc(self) -> AgentProcess | None: ...

    def expire(self) -> AgentProcess | None: ...


class Host(Protocol):
    """The mission host as the engine's step code sees it."""

    @property
    def store(self) -> Store: ...
    @property
    def store_path(self) -> Path: ...
    @property
    def mission_id(self) -> str: ...
    @property
    def host_id(self) -> str: ...
    @property
    def spec(self) -> MissionSpec: ...
    @property
    def record(self) -> MissionRecord: ...
    @property
    def graph(self) -> Graph: ...
    @property
    def sandbox(self) -> Path: ...
    @property
    def writer(self) -> JournalWriter: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def progress(self) -> Progress: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def tool_env(self) -> Mapping[str, str]: ...
    @property
    def sessions(self) -> Mapping[str, LeasedWorker]: ...
    @property
    def lease_ttl_s(self) -> float: ...  # of the lease that lets this process start effects (storage/reach.may_act)

    def renew(self, txn: Txn) -> None: ...  # renew that lease in `txn`, fenced: refused once another holds it

    async def checkpoint(self, reason: str, *, tree: bool = True, extra: TxnFn | None = None) -> None: ...
    def checkpoint_soon(self, reason: str, extra: TxnFn | None = None) -> None: ...
    async def plan_add(self, unit: str, units: Sequence[UnitSpec]) -> tuple[list[str], TxnFn]: ...
    def step_recorded(self, unit: str, method: str, summary: str, wall_ms: float) -> None: ...
    async def wait_for_input(self, question: Question) -> None: ...
    # a unit cannot go on: the mission stops (states.stopped_state: offline, else paused) for `reason`, which
    # `message` explains (a full disk, a store the worker cannot open, no provider, a spent budget)
    async def stop(self, reason: PauseReason, message: str) -> None: ...


class UnitSteps(Protocol):
    """A unit's session as its tool calls see it."""

    @property
    def host(self) -> Host: ...
    @property
    def unit_id(self) -> str: ...
    @property
    def lane(self) -> str: ...
    @property
    def sandbox(self) -> Path: ...
    @property
    def agent_run(self) -> int: ...

    def changing(self) -> AbstractAsyncContextManager[None]: ...
    async def record(self, step: Step, result: StepResult) -> Any: ...
    async def record_intent(self, step: Step, result: StepResult, tool: str) -> Any: ...
    async def hold_lease(self, renewed: float) -> None: ...
    async def end_earlier_runs(self) -> None: ...  # every process of the unit's other runs here is gone
    def note_replay(self, entry: JournalEntry) -> None: ...
