"""What a starting host does with each unit's lease: pure decisions over plain facts.

`registry.recover` gathers a `LeaseFacts` for each lease, asks `recovery` what to do, and acts; a unit
whose sandbox must be checked is judged again by `checked` once the check is made. Nothing here reads the
store or the disk, so every case is a row of a table test (tests/engine/test_recovery_table.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from keel.protocol.records import UnitLease
from keel.protocol.states import LeaseState, Resolution


class Recovery(enum.StrEnum):
    LEAVE = "leave"  # nothing to recover: succeeded, unknown to the graph, or a lane a restore left behind
    FOLLOW = "follow"  # offered to `keel worker`s or held by one: remote.py follows it
    BRING_HERE = "bring-here"  # its files are in the store, not here: make its sandbox here, then decide again
    RERUN = "rerun"  # run it again from scratch on a new lane (a person chose to, or it made no effect)
    FINISHED = "finished"  # its completion is recorded and its files are at hand: merge it
    FAIL = "fail"  # a person chose to fail it (its sandbox is lost)
    CONTINUE = "continue"  # a person chose to go on from its journal with the sandbox as it is
    CHECK = "check"  # resume it if its sandbox is as its lease recorded (`checked` says, once looked at)
    RESUME = "resume"  # its sandbox is as recorded: it goes on from its journal
    ASK = "ask"  # its sandbox is lost or changed and its journal holds effects: a person decides


@dataclass(frozen=True)
class LeaseFacts:
    """What the decision needs of one unit's lease, read by the caller."""

    lease: UnitLease
    succeeded: bool  # the graph has the unit succeeded, or does not know the unit
    current_lane: bool  # the lease is on the lane the graph runs the unit on
    sandbox_exists: bool  # its sandbox folder is on this machine's disk


def files_elsewhere(lease: UnitLease) -> bool:
    """Its files are only in the store: completed by a `keel worker` (possibly on another machine), or
    reopened by a restore with the point's snapshots and no sandbox yet."""
    if lease.worker:
        return True
    return not lease.place.sandbox and lease.place.kept()


def recovery(facts: LeaseFacts) -> Recovery:
    held = facts.lease
    if facts.succeeded or not facts.current_lane:
        return Recovery.LEAVE
    if held.state == LeaseState.OFFERED or (held.worker and held.state != LeaseState.DONE):
        return Recovery.FOLLOW
    if files_elsewhere(held):
        return Recovery.BRING_HERE
    if held.resolution == Resolution.RERUN:
        return Recovery.RERUN
    if held.state == LeaseState.DONE and (held.place.commit or held.place.merged or facts.sandbox_exists):
        return Recovery.FINISHED
    if held.resolution == Resolution.FAIL:
        return Recovery.FAIL
    if held.resolution == Resolution.CONTINUE:
        return Recovery.CONTINUE
    return Recovery.CHECK


def checked(problem: str, effects: int) -> Recovery:
    """After CHECK (or for a sandbox found lost elsewhere): `problem` is what is wrong with its sandbox
    ("" when nothing is), `effects` how many effects its journal holds. A unit that made no effect starts
    again by itself; one that did is never run again without a person's word."""
    if not problem:
        return Recovery.RESUME
    return Recovery.RERUN if effects == 0 else Recovery.ASK


def ask_choices(sandbox_exists: bool) -> tuple[Resolution, Resolution]:
    """The answers a person is offered for a unit that cannot resume where it was: a lost sandbox can only
    be failed or run again; a changed one can also be gone on with as it is."""
    return (Resolution.CONTINUE, Resolution.RERUN) if sandbox_exists else (Resolution.RERUN, Resolution.FAIL)
