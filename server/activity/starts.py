"""Why a unit starts: the first time, again after its host was lost, after a person answered its question,
or after its mission was resumed (a pause, an answer to another unit's question, a restore).

Only a start again with no stop of the mission since the unit's previous start is a host loss: a state
change is logged only when the state moves, so a host that ran the mission and vanished logged none.
Depends on protocol only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from keel.protocol.records import Event

Why = Literal["first", "host-lost", "answered", "resumed"]


def why_started(before: Iterable[Event], unit: str, answered_at: Iterable[float]) -> Why:
    """`before`: the mission's events logged before this start, oldest first; `answered_at`: when the
    person's answers to this unit's questions were recorded."""
    previous: float | None = None  # the unit's previous start
    stopped = False  # the mission stopped after it
    for event in before:
        if event.kind == "unit" and event.unit == unit and event.state == "running":
            previous, stopped = event.at, False
        elif event.kind == "state" and event.state != "running" and previous is not None:
            stopped = True
    if previous is None:
        return "first"
    if not stopped:
        return "host-lost"
    return "answered" if any(at >= previous for at in answered_at) else "resumed"
