"""What a starting host does with each unit's lease (engine/units/unitrecovery.py), as a table."""

from __future__ import annotations

from typing import Any

import pytest

from keel.protocol.records import Placement, UnitLease, WorkerOffer
from keel.protocol.states import LeaseState, Resolution
from keel.server.engine.units.unitrecovery import LeaseFacts, Recovery, ask_choices, checked, files_elsewhere, recovery

TREE = "t" + "1" * 63  # snapshot refs (protocol/records.is_tree_ref)
BASE = "t" + "2" * 63
S = LeaseState
R = Resolution


def _lease(**fields: Any) -> UnitLease:
    """A lease from flat fields: those of its placement go to `place`, `worker` to its offer."""
    place = {"sandbox": "/sb/a"} | {k: v for k, v in fields.items() if k in Placement.__struct_fields__}
    offer = WorkerOffer(worker=fields["worker"]) if "worker" in fields else None
    own = {k: v for k, v in fields.items() if k not in place and k != "worker"}
    return UnitLease(unit="a", lane="a", epoch=3, host_id="h", place=Placement(**place), offer=offer, **own)


# (lease fields, succeeded, current lane, sandbox on disk) -> decision
ROWS = [
    ({}, True, True, True, Recovery.LEAVE),  # succeeded (or unknown to the graph)
    ({}, False, False, True, Recovery.LEAVE),  # a lane a restore left behind
    ({"state": S.DONE}, True, False, False, Recovery.LEAVE),
    ({"state": S.OFFERED, "sandbox": ""}, False, True, False, Recovery.FOLLOW),  # waiting for a `keel worker`
    ({"worker": "w1"}, False, True, False, Recovery.FOLLOW),  # a worker holds it
    ({"worker": "w1", "state": S.EXPIRED}, False, True, False, Recovery.FOLLOW),
    ({"worker": "w1", "state": S.DONE}, False, True, False, Recovery.BRING_HERE),  # its files are in the store
    ({"sandbox": "", "tree": TREE, "base_tree": BASE}, False, True, False, Recovery.BRING_HERE),  # reopened
    ({"sandbox": "", "tree": TREE}, False, True, False, Recovery.CHECK),  # no base: nothing to make it from
    ({"resolution": R.RERUN}, False, True, True, Recovery.RERUN),
    ({"resolution": R.RERUN, "state": S.DONE, "commit": "c1"}, False, True, True, Recovery.RERUN),  # a conflict
    ({"state": S.DONE, "commit": "c1"}, False, True, False, Recovery.FINISHED),
    ({"state": S.DONE, "merged": True}, False, True, False, Recovery.FINISHED),
    ({"state": S.DONE}, False, True, True, Recovery.FINISHED),
    ({"state": S.DONE}, False, True, False, Recovery.CHECK),  # done, but its files are nowhere
    ({"resolution": R.FAIL, "sandbox": "/gone"}, False, True, False, Recovery.FAIL),
    ({"resolution": R.CONTINUE}, False, True, True, Recovery.CONTINUE),
    ({"resolution": R.SKIP}, False, True, True, Recovery.CHECK),  # skip is the merge's to act on
    ({"state": S.ORPHANED}, False, True, True, Recovery.CHECK),
    ({"state": S.EXPIRED}, False, True, True, Recovery.CHECK),
    ({"state": S.RUNNING}, False, True, True, Recovery.CHECK),
    ({"state": S.RETURNED}, False, True, True, Recovery.CHECK),
]


@pytest.mark.parametrize(("fields", "succeeded", "current", "exists", "expected"), ROWS)
def test_recovery(fields: dict[str, Any], succeeded: bool, current: bool, exists: bool, expected: Recovery) -> None:
    facts = LeaseFacts(_lease(**fields), succeeded=succeeded, current_lane=current, sandbox_exists=exists)
    assert recovery(facts) == expected


@pytest.mark.parametrize(
    ("problem", "effects", "expected"),
    [
        ("", 0, Recovery.RESUME),
        ("", 4, Recovery.RESUME),
        ("its sandbox /sb/a is missing", 0, Recovery.RERUN),  # nothing it did can be repeated
        ("its sandbox /sb/a is missing", 1, Recovery.ASK),  # never run again without a person's word
        ("its sandbox no longer matches the tree digest", 7, Recovery.ASK),
    ],
)
def test_checked(problem: str, effects: int, expected: Recovery) -> None:
    assert checked(problem, effects) == expected


def test_a_lost_sandbox_offers_rerun_or_fail_and_a_changed_one_continue_or_rerun() -> None:
    assert ask_choices(sandbox_exists=False) == (R.RERUN, R.FAIL)
    assert ask_choices(sandbox_exists=True) == (R.CONTINUE, R.RERUN)


def test_after_its_files_are_brought_here_a_unit_is_decided_by_its_lease_alone() -> None:
    """BRING_HERE never repeats: the lease it leaves names a sandbox and no worker."""
    for fields in ({"worker": "w1", "state": S.DONE}, {"sandbox": "", "tree": TREE, "base_tree": BASE}):
        brought = _lease(**{**fields, "worker": "", "sandbox": "/here/a"})
        assert files_elsewhere(_lease(**fields)) and not files_elsewhere(brought)
        assert recovery(LeaseFacts(brought, succeeded=False, current_lane=True, sandbox_exists=True)) in (
            Recovery.FINISHED,
            Recovery.CHECK,
        )
