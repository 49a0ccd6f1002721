"""An appending agent's lookback (server/engine/step/lookback.py): the step core, fed the page the index gives
for a request, decides exactly as it does over the whole journal; and a request's cost does not grow with it."""

from __future__ import annotations

import random

import msgspec

from keel.protocol.records import JournalEntry
from keel.server.engine.step.core import Request, next_step
from keel.server.engine.step.effects import Effect
from keel.server.engine.step.lookback import Lookback

EFFECTS = [Effect("run", f"make {name}", ".") for name in ("a", "b", "c")] + [Effect("write_file", "x.py", ".")]
FILES = ["f0", "f1", "f2", "f3"]
FINGERPRINTS = ["fp-a", "fp-b", "fp-c"]


def _forward(rng: random.Random, seq: int) -> JournalEntry:
    body = rng.choice(["", "event: message_stop"])
    return JournalEntry(
        seq=seq,
        kind="model/forward",
        fingerprint=rng.choice(FINGERPRINTS),
        phase=rng.choice(["done", "done", "done", "intent"]),
        error=rng.choice(["", "", "", "HTTP 529"]),
        result={"session": "s", "ordinal": rng.randrange(3), "body": body},
    )


def _effect(rng: random.Random, seq: int) -> JournalEntry:
    effect = rng.choice(EFFECTS)
    mark = effect.mark(rng.choice(FILES))
    phase = rng.choice(["done", "intent"])
    if phase == "done":
        mark = msgspec.structs.replace(mark, after=rng.choice([mark.before, *FILES]))
    return JournalEntry(
        seq=seq,
        kind="effect/ask",
        fingerprint=f"e{seq}",
        phase=phase,
        result={"ok": True},
        effect=mark,
        skipped=rng.random() < 0.1,
        rerun_approved=phase == "intent" and rng.random() < 0.1,
    )


def _history(rng: random.Random, length: int) -> list[JournalEntry]:
    """Entries as a run records them; an intent is sometimes settled later, at its own number, and now
    and then an effect's entry is written again in another state (an entry is only ever written again as
    the same effect)."""
    recorded: list[JournalEntry] = []
    for seq in range(1, length + 1):
        kind = rng.random()
        recorded.append(_forward(rng, seq) if kind < 0.4 else _effect(rng, seq) if kind < 0.8 else _other(seq))
        intents = [e for e in recorded if e.phase == "intent" and e.effect is not None]
        if intents and rng.random() < 0.3:
            intent = rng.choice(intents)
            assert intent.effect is not None
            after = msgspec.structs.replace(intent.effect, after=rng.choice(FILES))
            recorded.append(msgspec.structs.replace(intent, phase="done", effect=after))
        effects = [e for e in recorded if e.effect is not None]
        if effects and rng.random() < 0.3:  # a person's answer: the same effect, written again in another state
            earlier = rng.choice(effects)
            assert earlier.effect is not None
            again = _effect(rng, earlier.seq)
            assert again.effect is not None
            recorded.append(
                msgspec.structs.replace(again, effect=msgspec.structs.replace(again.effect, key=earlier.effect.key))
            )
    return recorded


def _other(seq: int) -> JournalEntry:
    return JournalEntry(seq=seq, kind="now", fingerprint="now", result=1.0)


def _requests(rng: random.Random, seq: int) -> list[Request]:
    effect = rng.choice(EFFECTS)
    return [
        Request(seq, "effect/ask", "new", effect, files=rng.choice(FILES), refusal=rng.choice(["", "", "denied"])),
        Request(seq, "model/forward", rng.choice(FINGERPRINTS), ordinal=rng.randrange(3)),
        Request(seq, "now", "now"),
    ]


def test_the_page_decides_every_request_as_the_whole_journal_does() -> None:
    rng = random.Random(37)
    checked = 0
    for _ in range(1000):
        recorded = _history(rng, rng.randrange(0, 30))
        whole: dict[int, JournalEntry] = {}
        lookback = Lookback()
        for entry in recorded:
            whole[entry.seq] = entry
            lookback.add(entry)
        seq = max(whole, default=0) + 1
        for request in _requests(rng, seq):
            seq = lookback.answered(request)
            page = lookback.page(request, None if seq is None else whole[seq])
            assert next_step(page, request, True) == next_step(whole, request, True), (recorded, request)
            checked += 1
    assert checked == 3000


def test_a_request_costs_the_same_after_a_long_history() -> None:
    """The page of a request holds what it is judged by, never the history: 20,000 entries in, the page
    for an effect is two entries at most and a new model request's is empty (benchmarks/lookback.py
    prints what a request costs)."""
    rng = random.Random(5)
    lookback = Lookback()
    for seq in range(1, 20_001):
        lookback.add(_forward(rng, seq) if seq % 2 else _effect(rng, seq))
    effect = Request(20_001, "effect/ask", "new", EFFECTS[0], files="f9")
    assert len(lookback.page(effect)) <= 2
    assert lookback.page(Request(20_001, "model/forward", "never-asked", ordinal=0)) == {}
    asked = Request(20_001, "model/forward", "fp-a", ordinal=1)
    assert lookback.answered(asked) is not None  # of the thousands of answers to fp-a: the one to read back


def test_a_change_written_again_as_no_change_leaves_the_change_before_it_in_the_page() -> None:
    """An intent in doubt, then two effects that changed the files, the second written again as having
    changed nothing: the files still changed after the intent, so a repeat runs rather than asks."""
    doubt, first, second = (effect.mark("f0") for effect in EFFECTS[:3])
    entries = [
        JournalEntry(seq=1, kind="effect/ask", fingerprint="e1", phase="intent", effect=doubt),
        JournalEntry(seq=2, kind="effect/ask", fingerprint="e2", effect=msgspec.structs.replace(first, after="f1")),
        JournalEntry(seq=3, kind="effect/ask", fingerprint="e3", effect=msgspec.structs.replace(second, after="f2")),
        JournalEntry(seq=3, kind="effect/ask", fingerprint="e3", effect=msgspec.structs.replace(second, after="f0")),
    ]
    lookback, whole = Lookback(), {}
    for entry in entries:
        lookback.add(entry)
        whole[entry.seq] = entry
    request = Request(4, "effect/ask", "new", EFFECTS[0], files="f2")
    assert next_step(whole, request, True).act.value == "run"
    assert next_step(lookback.page(request), request, True) == next_step(whole, request, True)
