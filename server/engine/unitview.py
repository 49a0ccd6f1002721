"""What a view shows of a mission's units (`keel status`, the editor): HEAD's marks, with the units a live host
started since shown running. Kept apart from control.py so that a read verb imports no sandbox or merge code.
Depends on protocol, storage and hostlock only.
"""

from __future__ import annotations

from keel.protocol.states import MissionState
from keel.server.engine.hostlock import host_alive
from keel.storage import Txn
from keel.storage import missions as m


def unit_states(txn: Txn, mission_id: str) -> dict[str, str]:
    """Each unit's state for a view (CLI status, the editor): the HEAD checkpoint's marks, with units a
    live host has started since then shown as running (from the mission's event log)."""
    record = m.get_mission(txn, mission_id)
    manifest = m.head_checkpoint(txn, mission_id)
    states = {uid: mark.state.value for uid, mark in (manifest.units.items() if manifest else ())}
    for unit in record.spec.units:
        states.setdefault(unit.id, "pending")
    if record.state not in (MissionState.RUNNING, MissionState.PAUSING) or not host_alive(record):
        return states
    since, after = (manifest.created_at, manifest.events_hwm) if manifest else (0.0, 0)
    for _, event in m.events_after(txn, mission_id, after):  # the events since HEAD, not the whole history
        if (
            event.kind == "unit"
            and event.at >= since
            and event.state == "running"
            and states.get(event.unit) not in (None, "succeeded", "failed")
        ):
            states[event.unit] = "running"
    return states
