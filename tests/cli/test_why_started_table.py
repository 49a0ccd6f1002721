"""Why a unit starts, from the events before its start and the times its questions were answered: only a
start again with no stop of the mission since the unit's previous start is a host loss."""

from __future__ import annotations

import pytest

from keel.protocol.records import Event
from keel.server.activity.starts import why_started


def start(unit: str, at: float) -> Event:
    return Event(kind="unit", at=at, unit=unit, state="running", message="attempt")


def state(name: str, at: float) -> Event:
    return Event(kind="state", at=at, state=name, message=f"-> {name}")


CASES = [
    # (events before the start, when the unit's questions were answered, why)
    ([], [], "first"),
    ([state("running", 1)], [], "first"),
    ([start("b", 1)], [], "first"),  # another unit's start
    ([start("u", 1)], [], "host-lost"),
    ([start("u", 1), start("b", 2), state("running", 3)], [], "host-lost"),  # "running" is no stop
    ([start("u", 1), state("waiting_input", 2), state("running", 4)], [3.0], "answered"),
    ([start("u", 1), state("waiting_input", 2), state("running", 4)], [], "resumed"),  # another unit asked
    ([start("u", 1), state("paused", 2), state("running", 3)], [], "resumed"),
    ([start("u", 1), state("paused", 2), state("running", 3)], [0.5], "resumed"),  # answered before that start
    # answered, went on, then its host was lost: the start after the answer is the previous start
    ([start("u", 1), state("waiting_input", 2), state("running", 4), start("u", 5)], [3.0], "host-lost"),
    ([start("u", 1), state("waiting_input", 2), start("u", 5), state("paused", 6)], [3.0], "resumed"),
    ([start("u", 1), state("waiting_input", 2), start("u", 5), state("waiting_input", 6)], [5.5], "answered"),
]


@pytest.mark.parametrize(("before", "answered", "why"), CASES)
def test_why_started(before: list[Event], answered: list[float], why: str) -> None:
    assert why_started(before, "u", answered) == why
