"""What an activity item says of a tool call's effect (server/activity/items.py): read from the journal
entry's typed fields, never from its summary, which is words for people."""

from __future__ import annotations

import pytest

from keel.protocol.records import JournalEntry
from keel.server.activity.items import journal_item

DONE = {"ok": True, "output": {"exit_code": 0, "stdout": "ok"}}
SKIPPED = {"ok": True, "output": {"skipped": True, "note": "a person said the effect had already happened"}}

# (summary, skipped, tool class, result) -> the item's effect
TABLE = [
    ("skipped", True, "effectful", SKIPPED, "skipped"),  # as keel's recovery writes it
    ("deploy: already done", True, "effectful", SKIPPED, "skipped"),  # whatever the words, the flag says
    ("skipped", False, "effectful", DONE, "done"),  # a command whose summary happens to read "skipped"
    ("skipped", False, "read_only", DONE, "read-only"),
    ("make", False, "effectful", DONE, "done"),
]


@pytest.mark.parametrize(("summary", "skipped", "tool_class", "result", "effect"), TABLE)
def test_effect_table(summary: str, skipped: bool, tool_class: str, result: dict, effect: str) -> None:
    entry = JournalEntry(
        seq=3, kind="tool/run", fingerprint="f", result=result, tool_class=tool_class, summary=summary, skipped=skipped
    )
    item = journal_item(entry, "a#1", [], copied=False, prices=None)
    assert item is not None
    assert item.effect == effect
