"""Mission and unit lifecycles as explicit state machines: an enum and a transition table each.

`check_mission_transition` and `check_unit_transition` are the only places that decide whether a move is
legal; every component that changes a state goes through them.
"""

from __future__ import annotations

import enum

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


class PauseReason(enum.StrEnum):
    OPERATOR = "operator"
    WAITING_INPUT = "waiting_input"
    OFFLINE = "offline"
    DISK_FULL = "disk_full"
    POLICY = "policy"


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

TERMINAL_MISSION_STATES = frozenset({M.COMPLETED, M.FAILED, M.CANCELLED})
PAUSED_MISSION_STATES = frozenset({M.PAUSED, M.WAITING_INPUT, M.OFFLINE})


def check_mission_transition(old: MissionState, new: MissionState) -> None:
    if new not in MISSION_TRANSITIONS[old]:
        raise InvalidTransitionError(f"mission cannot go from {old.value} to {new.value}")


def check_unit_transition(old: UnitState, new: UnitState) -> None:
    if old != new and new not in UNIT_TRANSITIONS[old]:
        raise InvalidTransitionError(f"unit cannot go from {old.value} to {new.value}")
