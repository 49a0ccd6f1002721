"""What a starting host does first: take the mission over and act on the controls it has not seen.

One transaction: record this host (the fencing token), fold the unseen Control records (a pause
requested before a crash is honoured; an answer becomes the journal entry the waiting unit will
replay), and decide whether there is anything to run. Depends on storage only.
"""

from __future__ import annotations

import contextlib
import time

import msgspec

from keel.protocol.agent import ToolRunResult
from keel.protocol.records import Evidence, HostInfo, JournalEntry, MissionRecord, Question
from keel.protocol.states import MissionState, PauseReason, QuestionKind, Resolution, StartDecision, can
from keel.storage import Txn, leases
from keel.storage import missions as m

S = MissionState


def apply_controls(txn: Txn, mission_id: str, host: HostInfo) -> tuple[StartDecision, MissionRecord]:
    """Returns what the host does next and the updated record."""
    record = m.get_mission(txn, mission_id)
    pause = record.state == S.PAUSING
    question = record.question
    last = record.control_seen
    cancel = False
    for seq, control in m.controls_after(txn, mission_id, record.control_seen):
        last = seq
        if control.action == "cancel" and can(record.state).cancel:
            cancel = True
        elif control.action == "pause" and can(record.state).pause:
            pause = True
        elif control.action == "answer" and question is not None:
            apply_answer(txn, mission_id, question, control.text)
            question = None
    record = msgspec.structs.replace(record, control_seen=last, question=question)
    m.put_mission(txn, record)
    if record.state == S.COMPLETED:
        return StartDecision.COMPLETED, record
    if record.state == S.CANCELLED:
        return StartDecision.CANCELLED, record
    if cancel:  # asked while no host ran, or before this one took over
        record = m.set_mission_state(txn, mission_id, S.CANCELLED, question=None, pause_reason=None, host=None)
        return StartDecision.CANCELLED, record
    if pause:
        return StartDecision.PAUSED, m.set_mission_state(
            txn, mission_id, S.PAUSED, pause_reason=PauseReason.OPERATOR, host=host
        )
    if record.state == S.WAITING_INPUT:
        if question is not None:
            return StartDecision.WAITING, record
        # answered: running from this very transaction, so a crash before the host's next write never
        # leaves a mission that waits for input with no question to answer
        return StartDecision.RUN, m.set_mission_state(txn, mission_id, S.RUNNING, host=host, pause_reason=None)
    return StartDecision.RUN, m.set_mission_state(txn, mission_id, record.state, host=host)


def apply_answer(txn: Txn, mission_id: str, question: Question, text: str) -> None:
    """Turn the person's answer into the journal entry the unit's agent will receive by replay."""
    lane = question.lane or question.unit
    now = time.time()
    m.add_evidence(txn, mission_id, _answered(question, text, lane, now))
    if question.kind in (QuestionKind.MERGE_CONFLICT, QuestionKind.REEXECUTE):  # acted on when the unit is recovered
        with contextlib.suppress(leases.StaleLeaseError):  # the run it was about was replaced: nothing to act on
            leases.resolve(txn, mission_id, question.unit, _asked_about(txn, mission_id, question), Resolution(text))
        return
    if question.kind == QuestionKind.UNCERTAIN_EFFECT:
        intent = m.journal_get(txn, mission_id, lane, question.seq)
        if intent is None:
            return
        if text == "skip":
            result = ToolRunResult(
                ok=True, output={"skipped": True, "note": "a person said the effect had already happened"}
            )
            m.journal_put(
                txn,
                mission_id,
                lane,
                msgspec.structs.replace(
                    intent, phase="done", result=msgspec.to_builtins(result), at=now, summary="skipped", skipped=True
                ),
            )
            with contextlib.suppress(leases.StaleLeaseError):  # replaced since: its sandbox is not this one
                leases.forget_tree(txn, mission_id, question.unit, _asked_about(txn, mission_id, question))
        else:
            m.journal_put(txn, mission_id, lane, msgspec.structs.replace(intent, rerun_approved=True))
        return
    m.journal_put(
        txn,
        mission_id,
        lane,
        JournalEntry(
            seq=question.seq,
            kind="human/ask",
            fingerprint=question.fingerprint,
            result={"answer": text},
            at=now,
            summary="answered",
        ),
    )


def _asked_about(txn: Txn, mission_id: str, question: Question) -> int:
    """The epoch of the unit's lease the question is about: the one it names; a question an older keel
    asked names none: the unit's current lease, when it is of the question's lane."""
    if question.epoch:
        return question.epoch
    held = leases.get(txn, mission_id, question.unit)
    return held.epoch if held is not None and held.lane == (question.lane or held.lane) else 0


def _answered(question: Question, text: str, lane: str, now: float) -> Evidence:
    """The question and its answer, kept together for the activity view (the question leaves the record)."""
    return Evidence(
        kind="answer",
        at=now,
        unit=question.unit,
        summary=f"{question.text} -> {text}"[:500],
        data={"question": question.text, "answer": text, "kind": question.kind, "choices": list(question.choices)},
        lane=lane,
        seq=question.seq,
    )
