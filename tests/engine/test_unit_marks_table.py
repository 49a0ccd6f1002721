"""Which moment of each unit a checkpoint records (checkpoint.with_unit_trees), as a table: a unit this host
runs is taken at its own last quiet moment, whatever its lease says now (a change of it may be in flight
there: an intent past the tree); any other unit from its lease in the checkpoint's transaction."""

from __future__ import annotations

import pytest

from keel.protocol.records import Placement, UnitLease, UnitMark
from keel.protocol.states import UnitState
from keel.server.engine.checkpoint import QuietMark, with_unit_trees

T0, T1, T2, B = "0" * 64, "1" * 64, "2" * 64, "b" * 64  # tree digests (snapshot blobs' names)
U = UnitState


def _lease(lane: str = "u", hwm: int = 7, tree: str = T2) -> UnitLease:
    place = Placement(tree=tree, base_tree=B, last_checkpoint=hwm)
    return UnitLease(unit="u", lane=lane, epoch=3, host_id="h", place=place)


# (the graph's mark, the unit's quiet moment, its lease now) -> (journal_hwm, tree) recorded
CASES = [
    (
        "running: its quiet moment, not the change in flight",
        UnitMark(U.RUNNING, 6),
        QuietMark("u", 5, T1, B),
        _lease(),
        (5, T1),
    ),
    ("running, no quiet moment known: its lease", UnitMark(U.RUNNING, 6), None, _lease(), (7, T2)),
    ("graph ahead of the lease: the graph's mark", UnitMark(U.RUNNING, 9), None, _lease(), (9, T2)),
    (
        "quiet moment of an earlier lane: its lease",
        UnitMark(U.RUNNING, 6, epoch=1),
        QuietMark("u", 5, T1, B),
        _lease("u#1"),
        (7, T2),
    ),
    ("not running (suspended): its lease", UnitMark(U.RESUMABLE, 6), QuietMark("u", 5, T1, B), _lease(), (7, T2)),
    ("lease of another lane: no snapshots", UnitMark(U.RUNNING, 6, epoch=2), None, _lease("u#1"), (6, "")),
    ("an outside agent's lease (no tree): no snapshots", UnitMark(U.RUNNING, 6), None, _lease(tree=""), (6, "")),
    ("succeeded: its files are the mission's", UnitMark(U.SUCCEEDED, 8), QuietMark("u", 5, T1, B), _lease(), (8, "")),
    ("quiet at the start (its base): no lease needed", UnitMark(U.RUNNING, 0), QuietMark("u", 0, T0, B), None, (0, T0)),
]


@pytest.mark.parametrize(("why", "mark", "quiet", "lease", "recorded"), CASES, ids=[c[0] for c in CASES])
def test_which_moment_of_a_unit_a_checkpoint_records(
    why: str, mark: UnitMark, quiet: QuietMark | None, lease: UnitLease | None, recorded: tuple[int, str]
) -> None:
    out = with_unit_trees({"u": mark}, [lease] if lease else [], {"u": quiet} if quiet else {})["u"]
    assert (out.journal_hwm, out.tree) == recorded, why
    assert out.base_tree == (B if recorded[1] else ""), why
    assert (out.state, out.epoch) == (mark.state, mark.epoch), why
