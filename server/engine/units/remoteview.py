"""The mission host's view of a unit it offered to `keel worker`s: one pure decision per look at the unit's
lease (the lease record, the store's clock, what the host saw before) -> what the host does next.
remote.py reads the lease and acts; every rule about what a lease means to its host is here.

Depends on protocol and storage/leases' `expired` only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from keel.protocol.records import UnitLease
from keel.protocol.states import LeaseState
from keel.storage.leases import expired

L = LeaseState
MAX_LAPSES = 3  # workers lost with the unit in one run of it; after that the host runs it itself


class Act(enum.StrEnum):
    OFFER = "offer"  # offer the unit (again) under the next epoch
    FOLLOW = "follow"  # an offer nobody took yet, or a worker at it: read the lease again later
    CLAIMED = "claimed"  # a worker (another than the one seen) runs it: say so, and follow it
    MERGE = "merge"  # the worker's completion: its files come here for the host's merge
    RUN_HERE = "run_here"  # the unit runs on its mission host (handed back, lost too often, no snapshot)
    WITHDRAW = "withdraw"  # the host stops and nobody took the offer: withdraw it, then stop
    STOP = "stop"  # the host stops, and no worker runs the unit any more
    FAIL = "fail"  # the unit's lease on its lane is gone


@dataclass(frozen=True, slots=True)
class Seen:
    """What the host saw of the unit before this look."""

    lane: str  # the unit's journal lane in this run
    worker: str = ""  # the worker the host saw running it ("" = none yet)
    lapses: int = 0  # workers lost with the unit in this run of it
    stopping: bool = False  # the host stops (a pause, a question, a cancel)


@dataclass(frozen=True, slots=True)
class Next:
    act: Act
    why: str = ""  # RUN_HERE: why the host runs it (kept on its lease); FAIL: what went wrong
    lapse: str = ""  # the worker was lost (its heartbeat went silent, or it left the unit): what to say


def on_start(held: UnitLease | None, lane: str) -> Next:
    """A host starting the unit's run: what the lease an earlier host (or this one) left says to do."""
    if held is None or held.lane != lane:
        return Next(Act.OFFER)
    if held.state == L.DONE and held.worker:
        return Next(Act.MERGE)
    if held.state == L.RETURNED:
        return Next(Act.RUN_HERE)
    if held.state == L.OFFERED or (held.worker and held.state == L.RUNNING):
        return Next(Act.FOLLOW)  # an earlier host's offer, or a worker still at it: followed as it is
    if not held.place.kept():  # work on this lane the store holds no snapshot of
        return Next(Act.RUN_HERE)
    return Next(Act.OFFER)


def on_look(held: UnitLease | None, now: float, since: float, seen: Seen) -> Next:
    """One look at the lease while following it: `now` is the store's clock read with it, `since` the store's
    clock since which the host has reached the store without a gap (a worker's silence counts from then)."""
    if held is None or held.lane != seen.lane:
        return Next(Act.FAIL, why=f"lease on lane {seen.lane} is gone")
    if held.state == L.DONE:
        return Next(Act.MERGE)
    if held.state == L.RETURNED:
        return Next(Act.STOP if seen.stopping else Act.RUN_HERE)
    running = held.state == L.RUNNING and not expired(held, now, since)
    if seen.stopping:
        if held.state == L.OFFERED:
            return Next(Act.WITHDRAW)
        return Next(Act.FOLLOW if running else Act.STOP)  # a worker stops by itself: the mission no longer runs
    if running:
        return Next(Act.CLAIMED if held.worker != seen.worker else Act.FOLLOW)
    if held.state == L.OFFERED:
        return Next(Act.FOLLOW)
    why = "its heartbeat went silent" if held.state == L.RUNNING else f"its worker left it {held.state}"
    lapse = f"worker {held.worker} ({held.hostname}) epoch {held.epoch}: {why}"
    if seen.lapses + 1 >= MAX_LAPSES:  # a unit that workers keep losing (or that keeps killing them)
        return Next(Act.RUN_HERE, why=f"{seen.lapses + 1} workers lost it", lapse=lapse)
    if not held.place.kept():  # an appending agent's sandbox: no snapshot to offer again
        return Next(Act.RUN_HERE, why=f"worker {held.worker} lost it", lapse=lapse)
    return Next(Act.OFFER, lapse=lapse)
