"""The step core (server/engine/step/core.py), case by case: what one agent request gets from the unit's
journal (answer from it, run, ask, refuse, fail), and that the worker answers by the host's own rule."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from keel.protocol import rpc
from keel.protocol.records import EffectMark, JournalEntry
from keel.server.engine.journal import request_fingerprint
from keel.server.engine.step.core import Act, Request, by_position, next_step
from keel.server.engine.step.effects import effect_of
from keel.server.engine.step.replay import WorkerReplay, replay_notice

SANDBOX = "/work/sandbox"
RUN = {"tool": "run", "args": {"cmd": "make"}}
EFFECT = effect_of("tool/run", RUN, SANDBOX)
assert EFFECT is not None
FP = request_fingerprint("tool/run", RUN)
NOW = request_fingerprint("now", None)


def _entry(seq: int, fp: str = FP, **fields: Any) -> JournalEntry:
    return JournalEntry(seq=seq, kind=fields.pop("kind", "tool/run"), fingerprint=fp, result={"ok": True}, **fields)


DONE = _entry(1)
ERRED = _entry(1, error="boom")
INTENT = _entry(1, phase="intent")
OTHER = _entry(1, fp=NOW, kind="now")
MARK = EFFECT.mark("f0")
EFFECT_DONE = _entry(2, effect=msgspec.structs.replace(MARK, after="f1"))
EFFECT_DOUBT = _entry(2, phase="intent", effect=MARK)
EFFECT_RERUN = _entry(2, phase="intent", effect=MARK, rerun_approved=True)


@pytest.mark.parametrize(
    ("journal", "seq", "act", "entry"),
    [
        ({}, 1, Act.RUN, None),  # nothing recorded at its number: a new step
        ({1: DONE}, 1, Act.ANSWER, DONE),  # a replay: answered from the journal
        ({1: ERRED}, 1, Act.ANSWER, ERRED),  # a recorded error is the answer too
        ({1: INTENT}, 1, Act.RUN, INTENT),  # an intent without its result: its tool settles it at that number
        ({1: OTHER}, 1, Act.FAIL, OTHER),  # another request was recorded at this number: nondeterminism
        ({1: DONE}, 2, Act.RUN, None),  # past the journal
    ],
)
def test_a_numbering_agents_request_meets_the_entry_at_its_number(
    journal: dict[int, JournalEntry], seq: int, act: Act, entry: JournalEntry | None
) -> None:
    todo = next_step(journal, Request(seq, "tool/run", FP), appending=False)
    assert (todo.act, todo.seq, todo.entry) == (act, seq, entry)
    if act is Act.FAIL:
        assert "tool/run" not in todo.reason and "now" in todo.reason  # names what the journal has


@pytest.mark.parametrize(
    ("journal", "files", "refusal", "act", "seq", "entry"),
    [
        ([], "f0", "", Act.RUN, 3, None),  # a new effect: the next entry
        ([EFFECT_DONE], "f0", "", Act.ANSWER, 3, EFFECT_DONE),  # a repeat of a completed one: from the journal
        ([EFFECT_DONE], "f1", "", Act.ANSWER, 3, EFFECT_DONE),  # on the files it left, too
        ([EFFECT_DONE], "f9", "", Act.RUN, 3, None),  # the files changed since: a new effect
        ([EFFECT_DOUBT], "f0", "", Act.ASK, 2, EFFECT_DOUBT),  # in doubt: asked at its own intent
        ([EFFECT_RERUN], "f0", "", Act.RUN, 2, EFFECT_RERUN),  # a person said rerun: run at its intent
        ([EFFECT_DONE], "f0", "not allowed", Act.REFUSE, 3, None),  # the permissions refuse it
    ],
)
def test_an_appending_agents_effect_is_judged_over_its_whole_journal(
    journal: list[JournalEntry], files: str, refusal: str, act: Act, seq: int, entry: JournalEntry | None
) -> None:
    request = Request(3, "tool/run", "a fingerprint of this run's own", EFFECT, files, refusal)
    todo = next_step({e.seq: e for e in journal}, request, appending=True)
    assert (todo.act, todo.seq, todo.entry) == (act, seq, entry)
    assert (todo.mark is None) == (act in (Act.ANSWER, Act.REFUSE))
    if act in (Act.ANSWER, Act.REFUSE):
        assert todo.reason


def _forward(seq: int, ordinal: int, **fields: Any) -> JournalEntry:
    result = {"body": "{}", "ordinal": ordinal, **fields.pop("result", {})}
    return JournalEntry(seq=seq, kind="model/forward", fingerprint="mf", result=result, **fields)


@pytest.mark.parametrize(
    ("journal", "ordinal", "act", "entry"),
    [
        ([_forward(4, 1)], 1, Act.ANSWER, _forward(4, 1)),  # paid for already: answered from that entry
        ([_forward(4, 1)], 2, Act.RUN, None),  # the same request at another place in its conversation
        ([_forward(4, 1, error="503")], 1, Act.RUN, None),  # a failed request was not paid for
        ([_forward(4, 1, phase="intent")], 1, Act.RUN, None),
        ([_forward(4, 1, result={"body": ""})], 1, Act.RUN, None),  # no body to answer with
        ([], 1, Act.RUN, None),
    ],
)
def test_a_model_request_already_paid_for_is_answered_from_the_journal(
    journal: list[JournalEntry], ordinal: int, act: Act, entry: JournalEntry | None
) -> None:
    request = Request(9, "model/forward", "mf", ordinal=ordinal)
    todo = next_step({e.seq: e for e in journal}, request, appending=True)
    assert (todo.act, todo.seq, todo.entry) == (act, 9, entry)


def test_an_appending_agents_other_requests_run_as_its_next_entry() -> None:
    todo = next_step({1: DONE}, Request(2, "now", NOW), appending=True)
    assert (todo.act, todo.seq, todo.entry) == (Act.RUN, 2, None)


REQUESTS = [("now", None), ("tool/run", RUN), ("random", None)]


@pytest.mark.parametrize(
    ("recorded", "sent"),
    [
        ([0, 1, 2], [0, 1, 2]),  # a faithful replay
        ([0, 1, 2], [0, 2]),  # the agent asks for something else at 2
        ([0, 1], [0, 1, 2]),  # past the journal
        ([1, 0], [0]),  # not what is recorded at 1
    ],
)
def test_the_worker_answers_exactly_where_the_host_would_answer_from_the_journal(
    recorded: list[int], sent: list[int]
) -> None:
    """One rule: for each request the worker answers itself the host's own core says ANSWER, and the first
    one the worker hands over is one the core would not answer from a table of done entries."""
    entries = [
        JournalEntry(seq=n, kind=REQUESTS[i][0], fingerprint=request_fingerprint(*REQUESTS[i]), result={"n": n})
        for n, i in enumerate(recorded, 1)
    ]
    worker = WorkerReplay()
    worker.load(replay_notice(entries)[0])
    journal = {e.seq: e for e in entries}
    for n, i in enumerate(sent, 1):
        method, params = REQUESTS[i]
        host = next_step(journal, Request(n, method, request_fingerprint(method, params)), appending=False)
        by_worker = worker.answer(rpc.Request(method=method, id=n, params=params)) is not None
        assert by_worker == (host.act is Act.ANSWER)
        if not by_worker:
            break


def test_by_position_is_the_rule_for_a_row_of_the_workers_table_as_for_an_entry() -> None:
    class Row:
        fingerprint = FP
        phase = "done"

    assert by_position(Row(), FP) is by_position(DONE, FP) is Act.ANSWER
    assert by_position(Row(), NOW) is by_position(DONE, NOW) is Act.FAIL
    assert by_position(None, FP) is Act.RUN


def test_an_effect_mark_names_the_files_it_started_from() -> None:
    todo = next_step({}, Request(1, "tool/run", FP, EFFECT, "f7"), appending=True)
    assert todo.mark == EffectMark(key=EFFECT.key, before="f7", text=MARK.text)
