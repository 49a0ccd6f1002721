"""How keel's bridge says "no" to an outside agent's permission request, and whether that "no" ends the
agent's turn (then keel answers in the next one): the options Gemini CLI and Codex (codex-acp 0.16) offer,
as their requests carry them."""

from __future__ import annotations

from typing import Any

import pytest

from keel.agents.acp.bridge import _refusal

GEMINI = [
    {"optionId": "proceed_always", "name": "Allow for this session", "kind": "allow_always"},
    {"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
]
CODEX_EXEC = [
    {"optionId": "approved", "name": "Yes, proceed", "kind": "allow_once"},
    {
        "optionId": "approved-execpolicy-amendment",
        "name": "Yes, and remember this command pattern",
        "kind": "allow_always",
    },
    {"optionId": "abort", "name": "No, and tell Codex what to do differently", "kind": "reject_once"},
]
CODEX_PATCH = [
    {"optionId": "approved", "name": "Yes", "kind": "allow_once"},
    {"optionId": "abort", "name": "No", "kind": "reject_once"},
]
# were Codex's core to list ReviewDecision::Denied, codex-acp would offer it as "denied"
CODEX_WITH_DENIED = [*CODEX_EXEC, {"optionId": "denied", "name": "No, continue without it", "kind": "reject_once"}]
LASTING_FIRST = [
    {"optionId": "never", "name": "Never", "kind": "reject_always"},
    {"optionId": "not-now", "name": "No", "kind": "reject_once"},
]


@pytest.mark.parametrize(
    ("options", "chosen", "ends_turn"),
    [
        (GEMINI, "cancel", False),
        (CODEX_EXEC, "abort", True),
        (CODEX_PATCH, "abort", True),
        (CODEX_WITH_DENIED, "denied", False),  # a "no" that lets the turn go on comes first
        (LASTING_FIRST, "not-now", False),  # a single "no" over a lasting one
        ([{"optionId": "ok", "name": "Yes", "kind": "allow_once"}], None, True),  # no "no" offered: cancelled
        ([], None, True),
    ],
)
def test_refusal_table(options: list[dict[str, Any]], chosen: str | None, ends_turn: bool) -> None:
    answer, ends = _refusal({"options": options, "toolCall": {"toolCallId": "c1"}})
    outcome = answer["outcome"]
    if chosen is None:
        assert outcome == {"outcome": "cancelled"}
    else:
        assert outcome == {"outcome": "selected", "optionId": chosen}
    assert ends is ends_turn
