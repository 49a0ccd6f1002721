"""What an appending agent's requests are judged against, held as an index of its lane instead of the lane.

An appending agent (an outside agent through keel.agents.acp) is not replayed by position: the step core
judges each effect it asks for over its whole journal (`effects.decide`) and answers a model request it
already paid for from that entry (`core.forwarded`). Of a whole journal those two rules read only
- for an effect: the newest entry of the same effect (its key), and whether a completed effect changed
  the files after it, which the newest such change says;
- for a model request: the first entry that answered the same normalised request (its fingerprint) at
  the same place in its conversation (its ordinal).
`Lookback` keeps exactly that as the lane is read and recorded, so a request costs a few dictionary
lookups, not a walk of a history that grows all mission long, and the host holds no model answers: a
paid request is kept as its entry's number, read back only when the same request comes again.
`page(request, answer)` gives the core the entries it would have found in the whole journal;
`tests/engine/test_lookback_table.py` checks it decides as the whole journal does. Pure: reads nothing.
"""

from __future__ import annotations

from typing import Any

from keel.protocol.records import JournalEntry
from keel.server.engine.step.core import Request, paid_for
from keel.server.engine.step.effects import changed_files


class Lookback:
    def __init__(self) -> None:
        self._forwards: dict[str, list[tuple[int, Any]]] = {}  # fingerprint -> (number, ordinal) of its answers
        self._effects: dict[str, JournalEntry] = {}  # effect key -> its newest entry
        self._changes: dict[int, JournalEntry] = {}  # completed effects that changed the files, by number
        self._newest_change = 0

    def add(self, entry: JournalEntry) -> None:
        """Take in an entry as it is read or recorded. An entry written again at its number is the same
        effect in another state (its intent's outcome, a person's answer), which replaces it here too."""
        if paid_for(entry):
            answers = [a for a in self._forwards.get(entry.fingerprint, ()) if a[0] != entry.seq]
            answers.append((entry.seq, entry.result.get("ordinal")))
            answers.sort(key=lambda a: a[0])
            self._forwards[entry.fingerprint] = answers
        mark = entry.effect
        if mark is None:
            return
        newest = self._effects.get(mark.key)
        if newest is None or newest.seq <= entry.seq:
            self._effects[mark.key] = entry
        if changed_files(entry):
            self._changes[entry.seq] = entry
            self._newest_change = max(self._newest_change, entry.seq)
        elif self._changes.pop(entry.seq, None) is not None and entry.seq == self._newest_change:
            self._newest_change = max(self._changes, default=0)

    def answered(self, request: Request) -> int | None:
        """The number of the first entry that answered this very model request (its fingerprint, its place
        in its conversation), if one did: the one entry `page` needs read back."""
        answers = self._forwards.get(request.fingerprint, ())
        return next((seq for seq, ordinal in answers if ordinal == request.ordinal), None)

    def page(self, request: Request, answer: JournalEntry | None = None) -> dict[int, JournalEntry]:
        """The entries `core.next_step` reads of the whole journal for `request`; `answer`: the entry
        `answered(request)` numbers, read back by the caller."""
        page: dict[int, JournalEntry] = {}
        if request.effect is not None:
            newest = self._effects.get(request.effect.key)
            if newest is not None:
                page[newest.seq] = newest
                change = self._changes.get(self._newest_change)
                if change is not None and change.seq > newest.seq:
                    page[change.seq] = change
        elif request.method == "model/forward" and answer is not None:
            page[answer.seq] = answer
        return page
