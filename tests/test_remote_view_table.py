"""The mission host's view of a unit it offered to `keel worker`s (engine/units/remoteview.py), as tables:
what the lease says when the host starts the unit's run, and what each look at it says while following."""

from __future__ import annotations

from typing import Any

import pytest

from keel.protocol.records import Placement, UnitLease, WorkerOffer
from keel.protocol.states import LeaseState
from keel.server.engine.units.remoteview import MAX_LAPSES, Act, Next, Seen, on_look, on_start

S = LeaseState
TREE, BASE = "1" * 64, "2" * 64
NOW = 1000.0
TTL = 10.0


def _lease(**fields: Any) -> UnitLease:
    """A lease from flat fields: `worker` and `why` go to its offer, `kept` (default True) gives it snapshots,
    `silent` is how long its heartbeat has been silent."""
    offer = WorkerOffer(worker=fields.pop("worker", ""), why=fields.pop("why", ""))
    place = Placement(tree=TREE, base_tree=BASE) if fields.pop("kept", True) else Placement(tree="d")
    beat = NOW - fields.pop("silent", 1.0)
    own = {"unit": "a", "lane": "a", "epoch": 4, "host_id": "w1", "pid": 7, "hostname": "build-7", "ttl_s": TTL}
    return UnitLease(**(own | fields), heartbeat=beat, place=place, offer=offer)


START = [  # (lease fields, or None for no lease) -> act
    (None, Act.OFFER),
    ({"lane": "a#2"}, Act.OFFER),  # a lane a restore left behind: the run starts afresh
    ({"state": S.DONE, "worker": "w1"}, Act.MERGE),
    ({"state": S.DONE}, Act.OFFER),  # done by the host itself on a lane it keeps: offered from its snapshots
    ({"state": S.RETURNED, "worker": "w1"}, Act.RUN_HERE),
    ({"state": S.OFFERED}, Act.FOLLOW),  # an earlier host's offer
    ({"state": S.RUNNING, "worker": "w1"}, Act.FOLLOW),  # a worker still at it
    ({"state": S.RUNNING}, Act.OFFER),  # the host's own run, with snapshots
    ({"state": S.ORPHANED, "kept": False}, Act.RUN_HERE),  # no snapshot of the lane: it can run only here
    ({"state": S.EXPIRED, "worker": "w1"}, Act.OFFER),
]


@pytest.mark.parametrize(("fields", "act"), START)
def test_on_start_table(fields: dict[str, Any] | None, act: Act) -> None:
    assert on_start(_lease(**fields) if fields is not None else None, "a").act == act


SILENT = "worker w1 (build-7) epoch 4: its heartbeat went silent"
LOOK = [  # (lease fields, or None, what the host saw before) -> next
    (None, Seen("a"), Next(Act.FAIL, why="lease on lane a is gone")),
    ({"lane": "a#2"}, Seen("a", "w1"), Next(Act.FAIL, why="lease on lane a is gone")),  # a restore moved it
    ({"state": S.OFFERED}, Seen("a"), Next(Act.FOLLOW)),
    ({"state": S.OFFERED}, Seen("a", stopping=True), Next(Act.WITHDRAW)),
    ({"state": S.RUNNING, "worker": "w1"}, Seen("a"), Next(Act.CLAIMED)),
    ({"state": S.RUNNING, "worker": "w1"}, Seen("a", "w1"), Next(Act.FOLLOW)),
    ({"state": S.RUNNING, "worker": "w2"}, Seen("a", "w1"), Next(Act.CLAIMED)),  # offered again, taken by another
    ({"state": S.RUNNING, "worker": "w1"}, Seen("a", "w1", stopping=True), Next(Act.FOLLOW)),  # it stops by itself
    ({"state": S.RUNNING, "worker": "w1", "silent": 11}, Seen("a", "w1", stopping=True), Next(Act.STOP)),
    ({"state": S.RUNNING, "worker": "w1", "silent": 11}, Seen("a", "w1"), Next(Act.OFFER, lapse=SILENT)),
    ({"state": S.RUNNING, "worker": "w1", "pid": 0, "silent": 11}, Seen("a", "w1"), Next(Act.FOLLOW)),  # starting
    (
        {"state": S.ORPHANED, "worker": "w1"},
        Seen("a", "w1"),
        Next(Act.OFFER, lapse="worker w1 (build-7) epoch 4: its worker left it orphaned"),
    ),
    ({"state": S.ORPHANED, "worker": "w1"}, Seen("a", "w1", stopping=True), Next(Act.STOP)),
    (
        {"state": S.RUNNING, "worker": "w1", "silent": 11},
        Seen("a", "w1", lapses=MAX_LAPSES - 1),
        Next(Act.RUN_HERE, why=f"{MAX_LAPSES} workers lost it", lapse=SILENT),
    ),
    (
        {"state": S.RUNNING, "worker": "w1", "silent": 11, "kept": False},
        Seen("a", "w1"),
        Next(Act.RUN_HERE, why="worker w1 lost it", lapse=SILENT),
    ),
    ({"state": S.RETURNED, "worker": "w1", "why": "a question"}, Seen("a", "w1"), Next(Act.RUN_HERE)),
    ({"state": S.RETURNED, "worker": "w1"}, Seen("a", "w1", stopping=True), Next(Act.STOP)),
    ({"state": S.DONE, "worker": "w1"}, Seen("a", "w1"), Next(Act.MERGE)),
    ({"state": S.DONE, "worker": "w1"}, Seen("a", "w1", stopping=True), Next(Act.MERGE)),  # finished is finished
]


@pytest.mark.parametrize(("fields", "seen", "expected"), LOOK)
def test_on_look_table(fields: dict[str, Any] | None, seen: Seen, expected: Next) -> None:
    held = _lease(**fields) if fields is not None else None
    assert on_look(held, NOW, 0.0, seen) == expected


def test_a_worker_silent_only_while_the_host_could_not_reach_the_store_is_followed() -> None:
    """Silence counts only from when the host has reached the store without a gap (storage/reach.py): an
    outage silences every worker, and is no evidence of a dead one."""
    held = _lease(state=S.RUNNING, worker="w1", silent=11)
    assert on_look(held, NOW, NOW - 5, Seen("a", "w1")) == Next(Act.FOLLOW)
    assert on_look(held, NOW, NOW - 11, Seen("a", "w1")).act == Act.OFFER
