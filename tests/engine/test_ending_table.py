"""How one start of a unit's worker ended, as the unit's outcome (server/engine/units/ending.py), case by
case: start it again, or expired, stopped, failed, a full disk, a store its worker could not open."""

from __future__ import annotations

import pytest

from keel.protocol import agent as ap
from keel.server.engine.units.ending import Ended, Raised, Then, Verdict, ending

DIED = Ended(Raised.AGENT, "agent exited with code 1", died=True)
GARBAGE = Ended(Raised.AGENT, "agent wrote garbage")
REFUSED = Ended(Raised.REMOTE, "the unit failed", rpc_code=-32000)
NO_STORE = Ended(Raised.AGENT, "worker exited", died=True, no_store=True, last_words="role refused")
FULL = "the disk at /tmp is full"


def _with(e: Ended, **facts: object) -> Ended:
    return Ended(**{**{f: getattr(e, f) for f in e.__slots__}, **facts})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ended", "verdict"),
    [
        (DIED, Verdict(Then.AGAIN, DIED.message)),  # it died: started again, replaying its journal
        (_with(DIED, start=3), Verdict(Then.AGAIN, DIED.message)),  # the caller gives up after the last start
        (GARBAGE, Verdict(Then.FAILED, GARBAGE.message)),  # it misbehaved: the unit fails
        (_with(DIED, expired=True), Verdict(Then.EXPIRED)),  # its lease is another's
        (_with(DIED, stopping=True), Verdict(Then.STOPPED)),  # the mission stops: a death is the stop's doing
        (_with(DIED, fatal="nondeterminism at entry 4"), Verdict(Then.FAILED, "nondeterminism at entry 4")),
        (_with(DIED, full=FULL), Verdict(Then.DISK_FULL, FULL)),  # it died for want of space
        (_with(DIED, full=FULL, stopping=True), Verdict(Then.STOPPED)),
        (NO_STORE, Verdict(Then.AGAIN, NO_STORE.message)),  # a store it could not open: tried again
        (_with(NO_STORE, start=3), Verdict(Then.NO_STORE, "role refused")),  # at the last start: the mission pauses
        (_with(NO_STORE, start=3, last_words=""), Verdict(Then.NO_STORE, "worker exited")),
        (REFUSED, Verdict(Then.FAILED, "agent failed the unit: the unit failed")),
        (_with(REFUSED, rpc_code=ap.ERR_DISK_FULL), Verdict(Then.DISK_FULL, "the unit failed")),  # its completion
        (_with(REFUSED, rpc_code=ap.ERR_DISK_FULL, stopping=True), Verdict(Then.DISK_FULL, "the unit failed")),
        (_with(REFUSED, stopping=True), Verdict(Then.STOPPED)),
        (_with(REFUSED, expired=True, rpc_code=ap.ERR_DISK_FULL), Verdict(Then.EXPIRED)),
        (_with(REFUSED, fatal="its sandbox is gone"), Verdict(Then.FAILED, "its sandbox is gone")),
        (_with(REFUSED, full=FULL), Verdict(Then.DISK_FULL, FULL)),  # the filesystem is full: not the agent's doing
        (_with(REFUSED, full=FULL, fatal="timeout"), Verdict(Then.FAILED, "timeout")),
        (Ended(Raised.GARBLED, "no answer", expired=True), Verdict(Then.FAILED, "no answer")),  # a timeout
        (Ended(Raised.DISK_FULL, FULL, expired=True, stopping=True), Verdict(Then.DISK_FULL, FULL)),
    ],
)
def test_ending(ended: Ended, verdict: Verdict) -> None:
    assert ending(ended) == verdict
