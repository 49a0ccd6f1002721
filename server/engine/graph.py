"""The task graph: units, their dependencies and their lifecycle marks; which units are ready.

Unit states move only through `_set_state` (protocol/states.py's table). Pure data: no I/O, no
processes; the host persists `marks()` in checkpoints. Depends on protocol only.
"""

from __future__ import annotations

import msgspec

from keel.protocol.diskspace import says_no_space
from keel.protocol.errors import MissionFileError
from keel.protocol.records import UnitMark
from keel.protocol.spec import UnitSpec
from keel.protocol.states import UnitState, check_unit_transition

U = UnitState


def retried_on_resume(mark: UnitMark, mission_failed: bool) -> bool:
    """Whether a resume runs the unit again: a failed unit of a failed mission (`keel resume` retries them),
    and a failed unit whose failure says there was no space left, whatever the mission's state (a full disk
    is a pause, never a result: such a mark is only left by an older keel, which recorded a sandbox that
    could not be made for want of space as the unit's failure while the mission paused disk_full)."""
    return mark.state == U.FAILED and (mission_failed or says_no_space(mark.error))


class Graph:
    def __init__(self, units: list[UnitSpec], marks: dict[str, UnitMark]) -> None:
        self.units: dict[str, UnitSpec] = {}
        self._marks: dict[str, UnitMark] = {}
        for unit in units:
            self.units[unit.id] = unit
            self._marks[unit.id] = marks.get(unit.id, UnitMark(state=U.PENDING))

    # -- lifecycle --------------------------------------------------------------------------------
    def mark(self, unit_id: str) -> UnitMark:
        return self._marks[unit_id]

    def _set_state(self, unit_id: str, state: UnitState, **changes: object) -> UnitMark:
        old = self._marks[unit_id]
        check_unit_transition(old.state, state)
        new = msgspec.structs.replace(old, state=state, **changes)
        self._marks[unit_id] = new
        return new

    def update(self, unit_id: str, **changes: object) -> UnitMark:
        """Change a mark's data (journal high-water mark, agent state) without a state move."""
        new = msgspec.structs.replace(self._marks[unit_id], **changes)
        self._marks[unit_id] = new
        return new

    def start(self, unit_id: str) -> UnitMark:
        mark = self._marks[unit_id]
        if mark.state == U.PENDING:
            self._set_state(unit_id, U.READY)
        return self._set_state(unit_id, U.RUNNING, attempts=mark.attempts + 1)

    def succeed(self, unit_id: str, result: object) -> UnitMark:
        return self._set_state(unit_id, U.SUCCEEDED, result=result, error="")

    def fail(self, unit_id: str, error: str) -> UnitMark:
        return self._set_state(unit_id, U.FAILED, error=error)

    def suspend(self, unit_id: str) -> UnitMark:
        """A running unit stopped by a pause or a crash: it resumes from its journal."""
        return self._set_state(unit_id, U.RESUMABLE)

    def reopen_after_crash(self) -> list[str]:
        """Units a dead host left running become resumable; returns their ids."""
        ids = [uid for uid, mk in self._marks.items() if mk.state == U.RUNNING]
        for uid in ids:
            self.suspend(uid)
        return ids

    def retry_failed(self, mission_failed: bool) -> list[str]:
        """The failed units a resume runs again (`retried_on_resume`); returns their ids."""
        ids = [uid for uid, mk in self._marks.items() if retried_on_resume(mk, mission_failed)]
        for uid in ids:
            self._set_state(uid, U.PENDING, error="", attempts=0)
        return ids

    # -- structure --------------------------------------------------------------------------------
    def add(self, units: list[UnitSpec], parent: str) -> list[str]:
        """Units an agent planned: new ids, dependencies on known units only."""
        added = []
        for unit in units:
            if unit.id in self.units:
                raise MissionFileError(f"unit {parent} planned unit {unit.id!r}, but that id already exists")
            missing = [d for d in unit.after if d not in self.units and d not in {u.id for u in units}]
            if missing:
                raise MissionFileError(f"unit {parent} planned unit {unit.id!r} after unknown {missing}")
        for unit in units:
            self.units[unit.id] = unit
            self._marks[unit.id] = UnitMark(state=U.PENDING)
            added.append(unit.id)
        return added

    def ready(self) -> list[str]:
        done = {uid for uid, mk in self._marks.items() if mk.state == U.SUCCEEDED}
        return [
            uid
            for uid, unit in self.units.items()
            if self._marks[uid].state in (U.PENDING, U.READY, U.RESUMABLE) and set(unit.after) <= done
        ]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for mk in self._marks.values():
            out[mk.state.value] = out.get(mk.state.value, 0) + 1
        return out

    def all_succeeded(self) -> bool:
        return all(mk.state == U.SUCCEEDED for mk in self._marks.values())

    def any_failed(self) -> bool:
        return any(mk.state == U.FAILED for mk in self._marks.values())

    def marks(self) -> dict[str, UnitMark]:
        return dict(self._marks)

    def unit_list(self) -> list[UnitSpec]:
        return list(self.units.values())
