"""The step core: what to do with one agent request, decided from the unit's journal alone.

    next_step(journal, request, appending) -> Next: answer / run / ask / refuse / fail
    by_position(recorded, fingerprint) -> Act: the replay rule, for the host and the worker alike

Nothing here reads the store, the disk or a clock, so every case is a row of a table test
(tests/engine/test_step_core_table.py). The I/O around it numbers requests, pages the journal in, records,
runs, asks and holds the lease (`units/unitrun.py` on the host, `replay.WorkerReplay` in the worker).

A numbering agent's request *n* meets the entry at *n* (`by_position`): none (run it), one with another
fingerprint (fail: nondeterminism), a done one (answer from it), an intent (run it at that number: its tool
settles the intent, `effects.decide` with what the sandbox shows). The worker holds only leading done
entries without an error, so where the rule says anything but "answer" it hands over to the host. An
appending agent's effect is judged over its whole journal (`effects.decide`), and a model request it
already paid for is answered from that entry; anything else it sends runs as the next entry. What those
rules read of the whole journal is what `lookback.Lookback.page` gives for the request, which is what the
host feeds in (tests/engine/test_lookback_table.py).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from keel.protocol.records import EffectMark, JournalEntry
from keel.server.engine.step.effects import Effect, decide


class Act(enum.StrEnum):
    ANSWER = "answer"  # from `Next.entry`: nothing runs
    RUN = "run"  # the handler runs it (`Next.entry`: the intent it settles at that number)
    ASK = "ask"  # a repeat of an effect in doubt (`Next.entry`, its intent): its handler asks a person
    REFUSE = "refuse"  # the mission's permissions refuse the effect: its handler records the refusal
    FAIL = "fail"  # the request is not the one recorded at its number: the unit fails (nondeterminism)


class Recorded(Protocol):
    """What the replay rule needs of an entry: a journal entry, or a row of the worker's table."""

    @property
    def fingerprint(self) -> str: ...
    @property
    def phase(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Request:
    """One agent request as the core sees it; `seq` is the number a new entry for it takes."""

    seq: int
    method: str
    fingerprint: str
    effect: Effect | None = None  # an appending agent's effect (effects.effect_of)
    files: str = ""  # the sandbox's files digest, for an effect
    refusal: str = ""  # why the mission's permissions refuse the effect ("": allowed)
    ordinal: Any = None  # a `model/forward`'s place in its conversation


@dataclass(frozen=True, slots=True)
class Next:
    """What to do: `seq` is the number the step is recorded at (an effect in doubt: its intent's);
    `mark` is the effect's identity to record with it; `reason` says why, in words."""

    act: Act
    seq: int
    entry: JournalEntry | None = None
    mark: EffectMark | None = None
    reason: str = ""


def by_position(recorded: Recorded | None, fingerprint: str) -> Act:
    """The replay rule: what a numbering agent's request gets from the entry recorded at its number."""
    if recorded is None:
        return Act.RUN
    if recorded.fingerprint != fingerprint:
        return Act.FAIL
    return Act.ANSWER if recorded.phase == "done" else Act.RUN


def next_step(journal: Mapping[int, JournalEntry], request: Request, appending: bool) -> Next:
    """What to do with `request`, given the unit's journal as this run holds it (a numbering agent's: at
    least the entry at `request.seq`; an appending agent's: all of it, or its page for the request)."""
    if not appending:
        entry = journal.get(request.seq)
        act = by_position(entry, request.fingerprint)
        if act is Act.FAIL:
            assert entry is not None
            return Next(act, request.seq, entry, reason=f"the journal has {entry.kind} at entry {request.seq}")
        return Next(act, request.seq, entry if act is Act.ANSWER or entry is not None else None)
    if request.effect is not None:
        return _effect_step(journal.values(), request, request.effect)
    if request.method == "model/forward" and (paid := forwarded(journal.values(), request)) is not None:
        return Next(Act.ANSWER, request.seq, paid, reason=f"answered from entry {paid.seq}: no request made")
    return Next(Act.RUN, request.seq)


def _effect_step(journal: Iterable[JournalEntry], request: Request, effect: Effect) -> Next:
    decision = decide(journal, effect, request.files, request.refusal)
    earlier = decision.entry
    if decision.kind == "refuse":
        return Next(Act.REFUSE, request.seq, reason=decision.reason)
    if decision.kind == "answer" and earlier is not None:
        return Next(Act.ANSWER, request.seq, earlier, reason=decision.reason)
    if earlier is None:
        return Next(Act.RUN, request.seq, mark=effect.mark(request.files))
    if decision.kind == "ask":  # settled at its own intent
        return Next(Act.ASK, earlier.seq, earlier, earlier.effect, decision.reason)
    return Next(Act.RUN, earlier.seq, earlier, effect.mark(request.files), decision.reason)


def forwarded(journal: Iterable[JournalEntry], request: Request) -> JournalEntry | None:
    """The recorded answer to this very model request (same normalised fingerprint, same place in its
    conversation), if the unit paid for it already: in this run or an earlier one, in any of the outside
    agent's sessions (Gemini CLI starts a new one on every run, and asks what the last one asked)."""
    for entry in journal:
        if (
            entry.fingerprint == request.fingerprint
            and paid_for(entry)
            and entry.result.get("ordinal") == request.ordinal
        ):
            return entry
    return None


def paid_for(entry: JournalEntry) -> bool:
    """Whether the entry is a model request's answer, paid for and whole (one a repeat may be answered from)."""
    result = entry.result
    return (
        entry.kind == "model/forward"
        and entry.phase == "done"
        and not entry.error
        and isinstance(result, dict)
        and bool(result.get("body"))
    )
