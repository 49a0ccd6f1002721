"""The effect decision (server/engine/step/effects.py), case by case: what an outside agent's request is, and
whether keel runs it, answers it from the journal, asks a person, or refuses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from keel.protocol.records import EffectMark, JournalEntry
from keel.server.engine.files.digest import files_digest
from keel.server.engine.step.effects import Effect, decide, effect_of

SANDBOX = "/work/sandbox"
BEFORE, AFTER, EDITED = "f0", "f1", "f2"  # the files a command starts from, leaves, and after an edit


def _codex(call: str, turn: str, started: int) -> dict[str, Any]:
    raw = {
        "call_id": call,
        "turn_id": turn,
        "started_at_ms": started,
        "command": ["bash", "-lc", "python  -m pytest -q"],
        "cwd": SANDBOX,
    }
    return {
        "tool": "run",
        "title": "python -m pytest -q",
        "call_id": call,
        "detail": {"kind": "execute", "rawInput": raw},
    }


def _gemini(call: str) -> dict[str, Any]:
    raw = {"command": "python -m pytest -q", "dir_path": SANDBOX}
    return {
        "tool": "run",
        "title": "python -m pytest -q",
        "call_id": call,
        "detail": {"kind": "execute", "rawInput": raw},
    }


TEST = effect_of("effect/ask", _codex("call_1", "turn_1", 1), SANDBOX)
assert TEST is not None


def _entry(seq: int, effect: Effect, phase: str = "done", after: str = AFTER, **fields: Any) -> JournalEntry:
    mark = EffectMark(key=effect.key, before=BEFORE, after=after if phase == "done" else "")
    return JournalEntry(seq=seq, kind="effect/ask", fingerprint=f"fp{seq}", phase=phase, effect=mark, **fields)  # type: ignore[arg-type]


EDIT = Effect("write_file", '{"path":"a.py"}')
DONE = _entry(3, TEST)
DOUBT = _entry(3, TEST, phase="intent")
SKIPPED = _entry(3, TEST, summary="skipped", skipped=True, after="")
RERUN = _entry(3, TEST, phase="intent", rerun_approved=True)
EDIT_AFTER = JournalEntry(seq=5, kind="tool/run", fingerprint="e", effect=EffectMark(EDIT.key, AFTER, EDITED))


@pytest.mark.parametrize(
    ("journal", "files", "refusal", "kind", "entry"),
    [
        ([], BEFORE, "", "run", None),  # a new effect
        ([DONE], BEFORE, "", "answer", DONE),  # same command, same files it started from: answered
        ([DONE], AFTER, "", "answer", DONE),  # same command on the files it left: answered
        ([DOUBT], BEFORE, "", "ask", DOUBT),  # same command, in doubt: asked
        ([DOUBT], "partly", "", "ask", DOUBT),  # cut mid-way, files changed by it alone: still asked
        ([DONE, EDIT_AFTER], EDITED, "", "run", None),  # same command after an edit: a new effect
        ([DOUBT, EDIT_AFTER], EDITED, "", "run", None),  # in doubt, but files changed by an edit since: runs
        ([SKIPPED], BEFORE, "", "answer", SKIPPED),  # a person said skip, retried: answered, not run
        ([SKIPPED], "partly", "", "answer", SKIPPED),
        ([RERUN], BEFORE, "", "run", RERUN),  # a person said rerun: runs at its intent
        ([DONE], BEFORE, "not allowed", "refuse", None),  # refused by the permissions
        ([_entry(1, EDIT), DONE], BEFORE, "", "answer", DONE),  # another effect's entry does not count
    ],
)
def test_decision(journal: list[JournalEntry], files: str, refusal: str, kind: str, entry: JournalEntry | None) -> None:
    assert TEST is not None
    decision = decide(journal, TEST, files, refusal)
    assert (decision.kind, decision.entry) == (kind, entry)
    if kind in ("answer", "refuse"):
        assert decision.reason  # the agent is told why nothing ran


def test_refused_then_retried_is_refused_again() -> None:
    assert TEST is not None
    first = decide([DONE], TEST, BEFORE, "run is not allowed")
    again = decide([DONE], TEST, BEFORE, "run is not allowed")
    assert first.kind == again.kind == "refuse" and "not allowed" in again.reason


def test_skip_answer_names_the_person() -> None:
    assert TEST is not None
    assert "a person said" in decide([SKIPPED], TEST, BEFORE).reason


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (_codex("call_1", "turn_1", 1), _codex("call_9", "turn_7", 99999)),  # Codex ids and times only
        (_gemini("run_shell_command-1"), _gemini("run_shell_command-2")),  # Gemini's toolCallId only
        (
            {"tool": "run", "args": {"cmd": "python -m pytest -q"}},
            {"tool": "run", "args": {"cmd": "python  -m  pytest -q ", "cwd": "."}},
        ),  # keel's run: white space, the default folder
    ],
)
def test_ids_and_times_an_agent_mints_are_not_the_effect(a: dict[str, Any], b: dict[str, Any]) -> None:
    method = "tool/run" if "args" in a else "effect/ask"
    assert effect_of(method, a, SANDBOX) == effect_of(method, b, SANDBOX)


def test_codex_and_gemini_name_the_same_command_alike() -> None:
    assert effect_of("effect/ask", _gemini("x"), SANDBOX) == TEST


@pytest.mark.parametrize(
    "other",
    [
        {"tool": "run", "args": {"cmd": "python -m pytest -q tests/a.py"}},  # another command
        {"tool": "run", "args": {"cmd": "python -m pytest -q", "cwd": "sub"}},  # another folder
        {"tool": "write_file", "args": {"path": "a.py", "content": "x"}},  # another tool
    ],
)
def test_what_it_does_is_the_effect(other: dict[str, Any]) -> None:
    base = effect_of("tool/run", {"tool": "run", "args": {"cmd": "python -m pytest -q"}}, SANDBOX)
    assert effect_of("tool/run", other, SANDBOX) != base


def test_edits_are_named_by_their_diff() -> None:
    def edit(new: str, call: str) -> dict[str, Any]:
        content = [{"type": "diff", "path": f"{SANDBOX}/a.py", "oldText": "x = 1\n", "newText": new}]
        return {
            "tool": "write_file",
            "title": "Edit a.py",
            "call_id": call,
            "detail": {"kind": "edit", "content": content},
        }

    assert effect_of("effect/ask", edit("x = 2\n", "1"), SANDBOX) == effect_of(
        "effect/ask", edit("x = 2\n", "2"), SANDBOX
    )
    assert effect_of("effect/ask", edit("x = 2\n", "1"), SANDBOX) != effect_of(
        "effect/ask", edit("x = 3\n", "1"), SANDBOX
    )


def test_files_digest_leaves_build_caches_out(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    before = files_digest(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0cache")
    assert files_digest(tmp_path) == before
    (tmp_path / "a.py").write_text("x = 2\n")
    assert files_digest(tmp_path) != before


KEEL_RUN = effect_of("tool/run", {"tool": "run", "args": {"cmd": "make"}}, SANDBOX)
assert KEEL_RUN is not None
KEEL_INTENT = JournalEntry(seq=4, kind="tool/run", fingerprint="k", phase="intent")  # a numbering agent's: no mark
KEEL_RERUN = msgspec.structs.replace(KEEL_INTENT, rerun_approved=True)


@pytest.mark.parametrize(
    ("intent", "seen", "kind"),
    [
        (KEEL_INTENT, True, "settle"),  # the sandbox shows it happened: recorded as it shows
        (KEEL_INTENT, False, "run"),  # visibly absent: run at its intent
        (KEEL_INTENT, None, "ask"),  # the sandbox cannot tell: a person decides
        (KEEL_RERUN, None, "run"),  # a person said rerun
        (KEEL_RERUN, True, "run"),  # a person's word stands over what the sandbox seems to show
        (DOUBT, None, "ask"),  # an outside agent's effect in doubt at its own number: asked as when found by key
        (DOUBT, True, "settle"),
    ],
)
def test_an_intent_of_keels_own_tool_is_decided_as_every_effect_in_doubt(
    intent: JournalEntry, seen: bool | None, kind: str
) -> None:
    decision = decide((), KEEL_RUN, "", at=intent, seen=seen)
    assert (decision.kind, decision.entry) == (kind, intent)
    assert decision.reason


def test_an_intent_met_at_its_number_is_judged_by_itself_not_by_an_effect_found_by_key() -> None:
    assert TEST is not None
    assert decide([DONE], TEST, BEFORE).kind == "answer"  # found by key: a completed repeat
    assert decide([DONE], TEST, BEFORE, at=DOUBT).kind == "ask"  # the request's own number holds an intent
    edited = decide([DOUBT, EDIT_AFTER], TEST, EDITED, at=DOUBT)  # files changed by a later edit: a new effect
    assert (edited.kind, edited.entry) == ("run", None)


def test_a_refusal_stands_before_any_intent() -> None:
    assert decide((), KEEL_RUN, "", "not allowed", at=KEEL_INTENT, seen=True).kind == "refuse"
