"""protocol.modelwire: a proxied request's body masked of what differs between identical runs, with the masked
form of long texts remembered, so that a conversation's request costs what is new in it."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from keel.protocol import modelwire
from keel.protocol.modelwire import normalise

VOLATILE = [
    "Today's date is 2026-12-07. ",
    "Ran 3 tests in 0.004s",
    "took 12 ms",
    "Process Group PGID: 4242",
    "Chunk ID: 9f3a",
    "Wall time: 1.2 seconds",
    "x * 2",
    "turn 17: ",
    "",
]


def _masked_directly(text: str) -> str:
    for pattern, replacement in modelwire._VOLATILE_TEXT:
        text = pattern.sub(replacement, text)
    return text


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(VOLATILE) + "word " * rng.randrange(0, 90) for _ in range(rng.randrange(1, 6)))


def test_the_combined_search_finds_a_text_exactly_when_masking_changes_it() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        text = _text(rng)
        assert (modelwire._ANY_VOLATILE.search(text) is None) <= (_masked_directly(text) == text)
        assert modelwire._mask(text) == _masked_directly(text)


def test_a_growing_conversation_is_masked_as_each_text_alone_would_be_with_a_memory_that_evicts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    texts = modelwire._Texts(limit=4000, least=64)  # a few long texts: evicted as the conversation grows
    monkeypatch.setattr(modelwire, "_TEXTS", texts)
    rng = random.Random(11)
    messages: list[dict[str, Any]] = []
    for turn in range(60):
        messages.append({"role": "user", "content": [{"type": "text", "text": _text(rng)}]})
        body = {"model": "m", "metadata": {"user_id": str(turn)}, "messages": messages}
        want = [
            {"role": "user", "content": [{"type": "text", "text": _masked_directly(m["content"][0]["text"])}]}
            for m in messages
        ]
        assert normalise(body) == {"model": "m", "messages": want}
        assert texts.size == sum(len(t) for t in texts._known) <= max(texts.limit, max(map(len, texts._known)))


def test_a_request_masks_only_the_texts_it_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modelwire, "_TEXTS", modelwire._Texts())
    masked: list[str] = []
    real = modelwire._mask
    monkeypatch.setattr(modelwire, "_mask", lambda text: masked.append(text) or real(text))
    turn = "Here is the file you asked for (read in 0.2s):\n" + "def f(x):\n    return x * 2\n" * 20
    history = [{"role": "user", "content": f"Today's date is 2026-12-07. turn {i}: {turn}"} for i in range(40)]
    normalise({"messages": history[:39]})
    masked.clear()
    out = normalise({"messages": history})
    assert [text for text in masked if len(text) >= modelwire._TEXTS.least] == [history[-1]["content"]]
    expected = r"Today's date is <date>\. turn 39: Here is the file you asked for \(read in <time>\):\n.*"
    assert re.fullmatch(expected, out["messages"][-1]["content"], re.S)
