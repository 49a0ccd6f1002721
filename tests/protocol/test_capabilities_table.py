"""What may be asked of a mission in each state (protocol/states.MISSION_CAPABILITIES), as a table: the one
place the engine, the language server and the extension (generated into protocol.ts) take it from; and the
state a unit's stop leaves its mission in for each reason (states.stopped_state)."""

from __future__ import annotations

import pytest

from keel.protocol.states import (
    MISSION_TRANSITIONS,
    TERMINAL_MISSION_STATES,
    Capabilities,
    MissionState,
    PauseReason,
    can,
    stopped_state,
)

M = MissionState
# state -> pause, resume, host, cancel, restore, terminal
TABLE = {
    M.CREATED: (True, False, True, True, False, False),
    M.RUNNING: (True, False, True, True, False, False),
    M.PAUSING: (True, False, True, True, False, False),
    M.PAUSED: (False, True, True, True, True, False),
    M.WAITING_INPUT: (False, False, True, True, True, False),  # an answer resumes it
    M.OFFLINE: (True, True, True, True, True, False),
    M.COMPLETED: (False, False, True, False, True, True),
    M.FAILED: (False, True, True, False, True, True),  # a resume runs its failed units again
    M.CANCELLED: (False, False, False, False, False, True),
}


@pytest.mark.parametrize("state", list(MissionState))
def test_capabilities_table(state: MissionState) -> None:
    assert can(state) == Capabilities(*TABLE[state])


@pytest.mark.parametrize("state", list(MissionState))
def test_what_a_state_allows_its_transitions_allow(state: MissionState) -> None:
    """A capability never promises a move the mission's transition table refuses."""
    allowed = MISSION_TRANSITIONS[state]
    if can(state).cancel:
        assert M.CANCELLED in allowed
    if can(state).restore:
        assert M.PAUSED in allowed  # a restore leaves the mission paused
    if can(state).resume:
        assert M.RUNNING in allowed
    assert (state in TERMINAL_MISSION_STATES) == can(state).terminal


@pytest.mark.parametrize(
    ("reason", "state"),
    [
        (PauseReason.OFFLINE, M.OFFLINE),
        (PauseReason.WAITING_INPUT, M.WAITING_INPUT),
        (PauseReason.DISK_FULL, M.PAUSED),
        (PauseReason.POLICY, M.PAUSED),
        (PauseReason.STORE, M.PAUSED),
        (PauseReason.BUDGET, M.PAUSED),
        (PauseReason.OPERATOR, M.PAUSED),
    ],
)
def test_stopped_state_table(reason: PauseReason, state: MissionState) -> None:
    assert stopped_state(reason) == state
