"""Rewind a mission to a restore point by writing a NEW checkpoint; history is never rewritten.

The new checkpoint takes the point's task graph and unit marks. A unit that had not finished at the
point gets a fresh journal lane (a new epoch) holding copies of its entries up to the point's mark, so
entries recorded after the point are never used on replay; the old lane stays as it was. The mission
becomes paused: `keel resume` continues from there. Workspace files are not rewound here.
Depends on storage and the engine's checkpoint and journal modules.
"""

from __future__ import annotations

import msgspec

from keel.protocol.errors import InvalidTransitionError
from keel.protocol.records import RestorePoint, UnitMark
from keel.protocol.states import MissionState, PauseReason, UnitState
from keel.server.engine import checkpoint
from keel.server.engine.journal import lane
from keel.storage import Txn
from keel.storage import missions as m


def restore_txn(txn: Txn, mission_id: str, point_id: str) -> RestorePoint:
    record = m.get_mission(txn, mission_id)
    if record.state in (MissionState.RUNNING, MissionState.PAUSING, MissionState.CREATED):
        raise InvalidTransitionError(f"mission {mission_id} is {record.state.value}; pause it before a restore")
    point = m.get_point(txn, mission_id, point_id)
    target = m.get_checkpoint(txn, point.checkpoint)
    current = m.head_checkpoint(txn, mission_id)
    marks: dict[str, UnitMark] = {}
    for unit_id, mark in target.units.items():
        if mark.state == UnitState.SUCCEEDED:
            marks[unit_id] = mark
            continue
        latest = current.units.get(unit_id) if current else None
        epoch = max(mark.epoch, latest.epoch if latest else 0) + 1
        old_lane, new_lane = lane(unit_id, mark.epoch), lane(unit_id, epoch)
        for entry in m.journal_entries(txn, mission_id, old_lane, upto=mark.journal_hwm):
            m.journal_put(txn, mission_id, new_lane, entry)
        state = UnitState.RESUMABLE if mark.journal_hwm else UnitState.PENDING
        marks[unit_id] = msgspec.structs.replace(mark, state=state, epoch=epoch, error="")
    m.set_mission_state(txn, mission_id, MissionState.PAUSED, pause_reason=PauseReason.OPERATOR, question=None,
                        error="")
    units = checkpoint.load_graph(txn, target.graph)
    config = txn.get_object(target.config, dict) or checkpoint.config_of(record.spec)
    return checkpoint.commit(txn, mission_id, reason=f"restored to {point.id}", units=units, marks=marks,
                             config=config, state=MissionState.PAUSED, sandbox_tree=target.sandbox_tree,
                             label=f"restore of {point.id}")
