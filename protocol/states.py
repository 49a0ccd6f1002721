"""Lifecycles as explicit state machines (an enum and a transition table each), and the engine's other
closed sets of outcomes as enums.

Lifecycles: a mission, a unit in its task graph, a subagent's lease. What may be asked of a mission in each
state (pause, resume, cancel, restore...) is one table, `MISSION_CAPABILITIES`. `check_mission_transition`,
`check_unit_transition` and `check_lease_transition` are the only places that decide whether a move is
legal; every component that changes a state goes through them (storage/missions.set_mission_state,
engine/graph.py, storage/leases.py's operations). `OutcomeKind` (how a unit's run ended) and `StartDecision` (what a
starting host does) are results, not lifecycles: they have no moves. Depends on protocol/errors only.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from keel.protocol.errors import InvalidTransitionError


class MissionState(enum.StrEnum):
    CREATED = "created"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    WAITING_INPUT = "waiting_input"
    OFFLINE = "offline"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class UnitState(enum.StrEnum):
    PENDING = "pending"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RESUMABLE = "resumable"


class LeaseState(enum.StrEnum):
    """A subagent lease (records.UnitLease). A new worker gets a new lease (a new epoch), `running`."""

    OFFERED = "offered"  # waiting for a `keel worker` on any machine to claim it (a new epoch, running)
    RUNNING = "running"  # its worker heartbeats
    RETURNED = "returned"  # a `keel worker` handed the unit back: it needs its mission host (`why` says for what)
    ORPHANED = "orphaned"  # the worker saw its parent die and stopped
    EXPIRED = "expired"  # the heartbeat went stale: the host took the unit over
    DONE = "done"  # the unit's completion is recorded


class OutcomeKind(enum.StrEnum):
    """How one run of a unit ended (engine/unitrun.Outcome)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the mission stops (pause, question, full disk): the unit resumes later
    EXPIRED = "expired"  # its lease was taken over: the unit starts again under a new epoch


class StartDecision(enum.StrEnum):
    """What a starting host does after taking the mission over (engine/recovery.apply_controls)."""

    RUN = "run"
    PAUSED = "paused"  # a pause was requested: checkpoint and stop
    WAITING = "waiting"  # a question is still unanswered
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class QuestionKind(enum.StrEnum):
    """What a question to a person is about (records.Question.kind), and so what acts on the answer."""

    ASK = "human/ask"  # an agent asked: the answer is the journal entry its request replays
    UNCERTAIN_EFFECT = "uncertain-effect"  # an effect whose outcome a crash left unknown: rerun or skip
    MERGE_CONFLICT = "merge-conflict"  # a unit's files did not merge into the mission's: rerun or skip
    REEXECUTE = "reexecute"  # a unit cannot resume where it was: rerun, or fail / continue


class Resolution(enum.StrEnum):
    """A person's answer about a unit's run (records.UnitLease.resolution), acted on when the unit is
    next recovered (engine/units/unitrecovery.py) and cleared once it is."""

    NONE = ""
    RERUN = "rerun"  # run the unit again from scratch, on a new lane
    SKIP = "skip"  # leave its files out of the mission's (a merge conflict)
    FAIL = "fail"  # fail the unit (its sandbox is lost)
    CONTINUE = "continue"  # go on from its journal with the sandbox as it is


class PauseReason(enum.StrEnum):
    OPERATOR = "operator"
    WAITING_INPUT = "waiting_input"
    OFFLINE = "offline"
    DISK_FULL = "disk_full"
    POLICY = "policy"
    STORE = "store"  # a unit's worker process could not open the store (its error says why)
    BUDGET = "budget"  # a unit spent its budget of model requests or tokens ([budget])


def stopped_state(reason: PauseReason) -> MissionState:
    """The state a mission stops in for `reason`: offline while no provider is reachable, waiting for a
    person's answer, else paused."""
    if reason == PauseReason.OFFLINE:
        return MissionState.OFFLINE
    return MissionState.WAITING_INPUT if reason == PauseReason.WAITING_INPUT else MissionState.PAUSED


M = MissionState
MISSION_TRANSITIONS: dict[MissionState, frozenset[MissionState]] = {
    M.CREATED: frozenset({M.RUNNING, M.PAUSED, M.CANCELLED, M.FAILED}),
    M.RUNNING: frozenset({M.PAUSING, M.PAUSED, M.WAITING_INPUT, M.OFFLINE, M.COMPLETED, M.FAILED, M.CANCELLED}),
    M.PAUSING: frozenset({M.PAUSED, M.RUNNING, M.COMPLETED, M.FAILED, M.CANCELLED}),
    M.PAUSED: frozenset({M.RUNNING, M.CANCELLED, M.PAUSED}),
    M.WAITING_INPUT: frozenset({M.RUNNING, M.PAUSED, M.CANCELLED}),
    M.OFFLINE: frozenset({M.RUNNING, M.PAUSED, M.CANCELLED}),
    M.COMPLETED: frozenset({M.RUNNING, M.PAUSED}),  # a restore to an earlier point reopens it (paused)
    M.FAILED: frozenset({M.RUNNING, M.PAUSED}),  # resume retries failed units; a restore reopens it
    M.CANCELLED: frozenset(),
}

U = UnitState
UNIT_TRANSITIONS: dict[UnitState, frozenset[UnitState]] = {
    U.PENDING: frozenset({U.READY}),
    U.READY: frozenset({U.RUNNING, U.PENDING}),
    U.RUNNING: frozenset({U.SUCCEEDED, U.FAILED, U.RESUMABLE}),
    U.RESUMABLE: frozenset({U.RUNNING, U.READY, U.PENDING, U.FAILED}),  # failed: a person's answer
    U.SUCCEEDED: frozenset({U.PENDING, U.READY}),  # only through a restore
    U.FAILED: frozenset({U.READY, U.PENDING}),  # retry on resume, or a restore
}

L = LeaseState
LEASE_TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    # a fenced worker whose lease expired may still record its completion or its orphaning until a new
    # epoch is granted; nothing leaves `done`, and nothing returns to `running` (that is a new lease)
    L.OFFERED: frozenset({L.EXPIRED}),  # withdrawn (a claim is a new lease)
    L.RUNNING: frozenset({L.ORPHANED, L.EXPIRED, L.DONE, L.RETURNED}),
    L.RETURNED: frozenset({L.EXPIRED}),
    L.ORPHANED: frozenset({L.EXPIRED, L.DONE, L.RETURNED}),
    L.EXPIRED: frozenset({L.ORPHANED, L.DONE}),
    L.DONE: frozenset(),
}


class Capabilities(NamedTuple):
    """What may be asked of a mission in a state: the one table the engine, the language server and the
    extension (client-vscode/src/protocol.ts, generated from it by scripts/protocol_ts.py) go by."""

    pause: bool  # a pause takes effect (its host stops at a consistent point, or it is marked paused)
    resume: bool  # it waits for a person's resume (what the editors offer to resume)
    host: bool  # `keel resume` may start a host for it (one that crashed while running, too)
    cancel: bool  # it can be cancelled
    restore: bool  # a restore to an earlier point may be made: no host runs it, and it was not cancelled
    terminal: bool  # it is finished (completed, failed, cancelled): it may be deleted


def _capabilities(state: MissionState) -> Capabilities:
    terminal = state in (M.COMPLETED, M.FAILED, M.CANCELLED)
    return Capabilities(
        pause=state in (M.CREATED, M.RUNNING, M.PAUSING, M.OFFLINE),
        resume=state in (M.PAUSED, M.OFFLINE, M.FAILED),
        host=state != M.CANCELLED,
        cancel=not terminal,
        restore=state not in (M.CREATED, M.RUNNING, M.PAUSING, M.CANCELLED),
        terminal=terminal,
    )


MISSION_CAPABILITIES: dict[MissionState, Capabilities] = {state: _capabilities(state) for state in MissionState}


def can(state: MissionState) -> Capabilities:
    """What may be asked of a mission in `state`."""
    return MISSION_CAPABILITIES[state]


TERMINAL_MISSION_STATES = frozenset(state for state in MissionState if can(state).terminal)


def check_mission_transition(old: MissionState, new: MissionState) -> None:
    if new not in MISSION_TRANSITIONS[old]:
        raise InvalidTransitionError(f"mission cannot go from {old.value} to {new.value}")


def check_unit_transition(old: UnitState, new: UnitState) -> None:
    if old != new and new not in UNIT_TRANSITIONS[old]:
        raise InvalidTransitionError(f"unit cannot go from {old.value} to {new.value}")


def check_lease_transition(old: LeaseState, new: LeaseState) -> None:
    if old != new and new not in LEASE_TRANSITIONS[old]:
        raise InvalidTransitionError(f"lease cannot go from {old.value} to {new.value}")
