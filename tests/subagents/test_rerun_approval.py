"""A person's "rerun" of an uncertain effect is a typed flag on the intent, and a store written before the
flag existed (schema 1: the approval kept as the intent's summary "rerun-approved") is still honoured: its
migration to schema 2 sets the flag."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
from engine_helpers import keel, read, record, write_mission
from subagent_helpers import uncertain_effect

from keel.protocol.records import Control, HostInfo, JournalEntry, Question
from keel.protocol.states import MissionState, StartDecision
from keel.server.engine import control
from keel.server.engine.recovery import apply_controls
from keel.storage import Store, Txn
from keel.storage import missions as m
from keel.storage.base import SCHEMA_KEY
from keel.storage.keys import DB
from keel.storage.migrations import SchemaInfo

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def test_a_rerun_answer_sets_the_intents_flag_and_keeps_its_summary(tmp_path: Path) -> None:
    units = [{"id": "a", "params": {"steps": [{"now": True}]}}]
    intent = JournalEntry(seq=2, kind="tool/run", fingerprint="fp", phase="intent", summary="run make")
    question = Question(unit="a", seq=2, text="?", choices=("rerun", "skip"), kind="uncertain-effect", lane="a")
    with Store.open(tmp_path / "store") as store:
        mid = control.create_mission(store, write_mission(tmp_path, units)).id

        def waiting(txn: Txn) -> None:
            m.set_mission_state(txn, mid, MissionState.RUNNING)
            m.set_mission_state(txn, mid, MissionState.WAITING_INPUT, question=question)
            m.journal_put(txn, mid, "a", intent)
            m.add_control(txn, mid, Control(action="answer", at=time.time(), text="rerun"))

        store.write(waiting)
        host = HostInfo(host_id="h", pid=1, started_at=time.time())
        decision, after = store.write(lambda t: apply_controls(t, mid, host))
        approved = store.read(lambda t: m.journal_get(t, mid, "a", 2))
    assert (decision, after.question) == (StartDecision.RUN, None)
    assert approved is not None and approved.rerun_approved and approved.phase == "intent"
    assert approved.summary == "run make"  # the description stays; the approval is not free text


def test_an_approval_recorded_as_a_summary_by_an_earlier_keel_reruns_the_effect(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    units = [
        {
            "id": "a",
            "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo ran >> {side} && sleep 2"}}]},
        }
    ]
    store, mid = uncertain_effect(tmp_path, units, side)
    question = record(store, mid).question
    assert question is not None

    def answered_by_an_earlier_keel(txn: Txn) -> None:  # what its apply_answer wrote for "rerun"
        intent = m.journal_get(txn, mid, question.lane, question.seq)
        assert intent is not None and intent.phase == "intent"
        legacy = msgspec.structs.replace(intent, summary="rerun-approved")
        m.journal_put(txn, mid, question.lane, legacy)
        m.put_mission(txn, msgspec.structs.replace(m.get_mission(txn, mid), question=None))
        txn.put(DB.META, SCHEMA_KEY, SchemaInfo(version=1, written_by="0.1.0"))

    with Store.open(store, create=False) as s:
        s.write(answered_by_an_earlier_keel)
    keel("resume", mid, store=store, check_rc=0)
    assert side.read_text() == "ran\nran\n"  # approved: run again, not asked again
    done = read(store, lambda t: m.journal_get(t, mid, question.lane, question.seq))
    assert done.phase == "done" and not done.rerun_approved
