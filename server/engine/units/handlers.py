"""One handler per agent method, written against the narrow port of a unit's run (`UnitPort`).

A handler runs a step the step core (step/core.py) said to run, and hands its `StepResult` to
`port.record`, the one place a step is journaled; `answer_again` answers a repeat the core found in the
journal (an appending agent's effect, or a model request it already paid for), recording that it did.
Nothing here starts processes or reads the lane: `unitrun.UnitSession` is the port.
Depends on protocol and the engine's interface and step modules.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import msgspec

from keel.protocol import agent as ap
from keel.protocol.records import Evidence, JournalEntry, Question
from keel.server.engine.interface import Step, StepResult, UnitSteps
from keel.server.engine.step.effects import decide, effect_of, effect_outcome
from keel.server.engine.step.models import ModelCalls
from keel.server.engine.step.toolcalls import ToolCalls, ask_rerun_or_skip

OUTPUT_KEPT = 2000  # the end of an outside agent's effect output its journal entry keeps


class UnitPort(UnitSteps, Protocol):
    """What a handler needs of its unit's run, besides what its tool calls need (interface.UnitSteps)."""

    @property
    def models(self) -> ModelCalls: ...
    @property
    def tools(self) -> ToolCalls: ...
    @property
    def asked(self) -> dict[str, int]: ...  # an allowed effect's call id -> its intent's seq, until effect/done
    @property
    def entries(self) -> Mapping[int, JournalEntry]: ...

    async def files_now(self) -> str: ...
    async def within_budget(self) -> None: ...
    def paid(self, result: StepResult) -> StepResult: ...
    async def record_settling(self, step: Step, result: StepResult, settles: JournalEntry | None) -> Any: ...
    def count_replayed(self, count: int) -> None: ...


Handler = Callable[[UnitPort, Step, Any], Awaitable[Any]]


async def _human_ask(port: UnitPort, step: Step, params: Any) -> Any:
    """A question without a recorded answer: the mission waits for a person; the answer arrives by
    replay when it resumes (recovery.apply_answer writes it into this unit's journal)."""
    ask = msgspec.convert(params, ap.HumanAskParams)
    question = Question(
        unit=port.unit_id,
        seq=step.seq,
        text=ask.question,
        choices=ask.choices,
        fingerprint=step.fingerprint,
        lane=port.lane,
    )
    await port.host.wait_for_input(question)
    await asyncio.Event().wait()  # never answered here: the host stops this agent


async def _now(port: UnitPort, step: Step, params: Any) -> Any:
    return await port.record(step, StepResult({"time": time.time()}))


async def _random(port: UnitPort, step: Step, params: Any) -> Any:
    return await port.record(step, StepResult({"value": random.random()}))


async def _evidence_add(port: UnitPort, step: Step, params: Any) -> Any:
    ev = msgspec.convert(params or {}, ap.EvidenceAddParams)
    item = Evidence(kind=ev.kind, at=time.time(), unit=port.unit_id, summary=ev.summary, data=ev.data)
    return await port.record(step, StepResult({}, evidence=(item,)))


async def _state_save(port: UnitPort, step: Step, params: Any) -> Any:
    state = msgspec.convert(params or {}, ap.StateSaveParams).state
    digest: list[str] = []  # the agent state as a shared blob, named in the next checkpoint
    result = await port.record(
        step, StepResult({"state": state}, extra=lambda txn: digest.append(txn.put_object(state)))
    )
    port.host.graph.update(port.unit_id, agent_state=digest[-1])
    return result


async def _plan_add(port: UnitPort, step: Step, params: Any) -> Any:
    units = msgspec.convert(params, ap.PlanAddParams).units
    added, commit = await port.host.plan_add(port.unit_id, units)  # durable with the entry
    return await port.record(step, StepResult({"added": added}, extra=commit, summary=f"added {', '.join(added)}"))


async def _model_complete(port: UnitPort, step: Step, params: Any) -> Any:
    await port.within_budget()
    return await port.record(step, port.paid(await port.models.complete(port.unit_id, params)))


async def _tool_run(port: UnitPort, step: Step, params: Any) -> Any:
    return await port.tools.run(msgspec.convert(params, ap.ToolRunParams), step)


async def _model_forward(port: UnitPort, step: Step, params: Any) -> Any:
    await port.within_budget()
    return await port.record(step, port.paid(await port.models.forward(port.unit_id, params)))


async def answer_again(port: UnitPort, step: Step, earlier: JournalEntry, reason: str) -> Any:
    """A request the journal already answered at `earlier` (the step core's ANSWER for an appending
    agent): nothing runs or is paid; the new entry says where the answer came from. A repeated effect of
    the agent's own is denied with the reason and the recorded outcome; a model request gets the body it
    was paid for."""
    if step.method == "model/forward":
        value = dict(earlier.result, replayed_from=earlier.seq)
        note = {k: v for k, v in value.items() if k not in ("body", "usage")}  # nothing paid for this one
        await port.record(step, StepResult(note, summary=f"answered from entry {earlier.seq}: no request made"))
        port.count_replayed(1)
        return value
    summary = f"answered from entry {earlier.seq}, nothing ran: {reason}"[:200]
    if step.method == "effect/ask":
        told = f"keel did not make this effect again: {reason}. {effect_outcome(earlier)}".strip()
        value = msgspec.to_builtins(ap.EffectAskResult(allow=False, reason=told))
        return await port.record(step, StepResult(value, summary=summary))
    recorded = StepResult(earlier.result, error=earlier.error, tool_class=earlier.tool_class, summary=summary)
    return await port.record(step, recorded)


async def _effect_ask(port: UnitPort, step: Step, params: Any) -> Any:
    """An outside agent's effect, asked before it is made: allowed when the mission's permissions allow the
    keel tool it counts as. An allowed effect is recorded as an intent until the agent reports its outcome
    (`effect/done`). The same effect asked again after a crash while its intent has no outcome (`step.intent`)
    is decided as every effect in doubt is (effects.decide): a question for a person (rerun or skip), as an
    uncertain tool call is, unless a person already said to run it again."""
    ask = msgspec.convert(params, ap.EffectAskParams)
    allowed = port.host.spec.permissions.tools
    allow = ask.tool in allowed
    reason = (
        "" if allow else f"{ask.tool!r} is not allowed by this mission's permissions (allowed: {', '.join(allowed)})"
    )
    summary = f"{'allowed' if allow else 'denied'} {ask.tool}: {ask.title}"[:200]
    intent = step.intent
    if intent is not None:  # the run that asked first makes nothing after it is judged or made again
        await port.end_earlier_runs()
        effect = effect_of("effect/ask", params, str(port.sandbox))
        if effect is not None and decide((), effect, "", at=intent).kind == "ask":
            await ask_rerun_or_skip(
                port,
                step,
                f"unit {port.unit_id}: the agent's {ask.tool} {ask.title[:120]!r} may or may not have happened "
                "before keel stopped (the agent never reported its outcome). Let it run again (rerun), or keep "
                "going without it because it did happen (skip)?",
            )
    result = StepResult(
        msgspec.to_builtins(ap.EffectAskResult(allow=allow, reason=reason)),
        phase="intent" if allow else "done",
        summary=summary if intent is None else f"{summary} (again: a person said rerun)"[:200],
    )
    if not allow:
        return await port.record(step, result)
    answered = await port.record_intent(step, result, ask.tool)  # the agent makes the effect once answered
    if ask.call_id:
        port.asked[ask.call_id] = step.seq
    return answered


async def _effect_done(port: UnitPort, step: Step, params: Any) -> Any:
    """The outcome of an allowed effect: its intent becomes done, in the same transaction as this entry."""
    done = msgspec.convert(params, ap.EffectDoneParams)
    seq = port.asked.pop(done.call_id, 0)
    intent = port.entries.get(seq)
    settled = None
    if intent is not None and intent.phase == "intent":
        mark = intent.effect
        if mark is not None:  # the files the effect left
            mark = msgspec.structs.replace(mark, after=await port.files_now())
        outcome = {**(intent.result if isinstance(intent.result, dict) else {}), "outcome": done.status}
        if done.output:
            outcome["output"] = done.output[-OUTPUT_KEPT:]
        settled = msgspec.structs.replace(
            intent, phase="done", result=outcome, effect=mark, summary=f"{intent.summary} ({done.status})"[:200]
        )
    summary = f"{done.status}: the effect of entry {seq}" if settled else f"{done.status}: {done.call_id}"
    return await port.record_settling(step, StepResult({}, summary=summary[:200]), settled)


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
