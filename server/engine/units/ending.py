"""How one start of a unit's worker ended, as the unit's outcome: one pure decision.

    ending(Ended) -> Verdict: start again, or the run's outcome (expired, stopped, failed, a full disk,
    a store the worker could not open)

`UnitSession.run` catches what a start raised, gathers the facts here (the error's own, and the run's:
its lease taken, a stop under way, a failure it recorded, the full disk it sees) and acts on the verdict.
Nothing here reads the store, the disk or a clock (tests/engine/test_ending_table.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from keel.protocol import agent as ap


class Raised(enum.StrEnum):
    AGENT = "agent"  # AgentError: the worker or its agent died, wrote garbage, or could not start
    REMOTE = "remote"  # RemoteError: the agent answered `unit/run` with an error
    GARBLED = "garbled"  # TimeoutError or a validation error: it did not answer properly
    DISK_FULL = "disk-full"  # DiskFullError, or an OSError for want of space (the unit's home, its log)


class Then(enum.StrEnum):
    AGAIN = "again"  # start the worker again (its agent replays the journal)
    EXPIRED = "expired"  # the lease is another's: nothing of this run counts
    STOPPED = "stopped"  # the mission stops: the unit resumes later
    FAILED = "failed"  # the unit fails with `message`
    DISK_FULL = "disk-full"  # the mission pauses disk_full with `message`
    NO_STORE = "no-store"  # the mission pauses for its store, with `message`


@dataclass(frozen=True, slots=True)
class Ended:
    """What one start raised, and the run's state when it did."""

    raised: Raised
    message: str  # the error's own words
    died: bool = False  # AgentError: the process ended (rather than misbehaved)
    no_store: bool = False  # the worker exited saying it could not open the store (workerloop.EXIT_NO_STORE)
    last_words: str = ""  # the worker's last line on stderr
    rpc_code: int = 0  # RemoteError's JSON-RPC code
    expired: bool = False  # the unit's lease was taken over
    stopping: bool = False  # the mission is stopping
    fatal: str = ""  # a failure this run recorded itself (nondeterminism, a timeout, a sandbox gone)
    full: str = ""  # why the store's or the sandbox's filesystem counts as full now ("" when it does not)
    start: int = 1
    starts: int = 3  # how many starts a unit run may take (unitrun.MAX_AGENT_STARTS)


@dataclass(frozen=True, slots=True)
class Verdict:
    then: Then
    message: str = ""


def ending(e: Ended) -> Verdict:
    """What the unit's run does after a start of its worker ended with `e`."""
    if e.raised is Raised.DISK_FULL:
        return Verdict(Then.DISK_FULL, e.message)
    if e.raised is Raised.GARBLED:
        return Verdict(Then.FAILED, e.message)
    if e.expired:
        return Verdict(Then.EXPIRED)
    if e.raised is Raised.REMOTE:
        return _remote(e)
    if e.stopping:
        return Verdict(Then.STOPPED)
    if e.fatal:
        return Verdict(Then.FAILED, e.fatal)
    if e.full:  # it died or could not start for want of space
        return Verdict(Then.DISK_FULL, e.full)
    if not e.died:
        return Verdict(Then.FAILED, e.message)
    if e.no_store and e.start >= e.starts:  # no start will do better
        return Verdict(Then.NO_STORE, e.last_words or e.message)
    return Verdict(Then.AGAIN, e.message)


def _remote(e: Ended) -> Verdict:
    if e.rpc_code == ap.ERR_DISK_FULL:  # the worker could not record the unit's completion
        return Verdict(Then.DISK_FULL, e.message)
    if e.stopping:
        return Verdict(Then.STOPPED)
    if e.fatal:
        return Verdict(Then.FAILED, e.fatal)
    if e.full:
        return Verdict(Then.DISK_FULL, e.full)
    return Verdict(Then.FAILED, f"agent failed the unit: {e.message}")
