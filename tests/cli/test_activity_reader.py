"""The activity reader on a real LMDB store: an intent shown, then shown again with its result (same id);
a lane a restore made shows only its new entries; the cursor loses and repeats nothing across pages."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from keel.protocol.records import Evidence, JournalEntry
from keel.server.activity.reader import Filter, end_cursor, read_page
from keel.storage import DB, Store
from keel.storage import missions as m
from keel.storage.errors import CorruptRecordError
from keel.storage.keys import log_key, unit_prefix
from tests.historykit import UNIT
from tests.historykit import make_mission as make_history
from tests.storage.test_verify import make_mission

PREVIEW = {
    "path": "a.py",
    "before": None,
    "after": "d1",
    "bytes": 6,
    "diff": "--- /dev/null\n+++ b/a.py\n@@ -0,0 +1 @@\n+x\n",
}


def _put(store: Store, lane: str, entry: JournalEntry, *evidence: Evidence) -> None:
    def write(txn: object) -> None:
        m.journal_put(txn, "mx", lane, entry)  # type: ignore[arg-type]
        for item in evidence:
            m.add_evidence(txn, "mx", item)  # type: ignore[arg-type]

    store.write(write)


def test_an_intent_comes_again_with_its_result(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store", create=True) as store:
        make_mission(store, "mx", checkpoints=1)
        start = end_cursor(store, "mx")
        now = time.time()
        intent = JournalEntry(
            seq=2,
            kind="tool/run",
            fingerprint="w",
            phase="intent",
            result=PREVIEW,
            tool_class="effectful",
            at=now,
            summary="write_file a.py",
        )
        _put(store, "u1", intent)
        first = read_page(store, "mx", cursor=start)
        [shown] = first.items
        assert (shown.id, shown.effect, shown.files[0].path) == ("j/u1/2", "intent only", "a.py")
        assert read_page(store, "mx", cursor=first.cursor).items == ()  # nothing new yet
        done = msgspec.structs.replace(
            intent, phase="done", at=now + 1, result={"ok": True, "output": {**PREVIEW, "created": True}}
        )
        told = Evidence(
            kind="tool",
            at=now + 1,
            unit="u1",
            data={"tool": "write_file", "args": {"path": "a.py"}, "effect": "reconciled"},
            lane="u1",
            seq=2,
        )
        _put(store, "u1", done, told)
        second = read_page(store, "mx", cursor=first.cursor)
        [again] = second.items
        assert (again.id, again.effect, again.args) == ("j/u1/2", "reconciled", {"path": "a.py"})
        assert read_page(store, "mx", cursor=second.cursor).items == ()


def test_copies_a_restore_made_are_not_shown_twice_and_pages_join_up(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store", create=True) as store:
        make_mission(store, "mx", checkpoints=3)
        copies = [e for e in store.read(lambda t: m.journal_entries(t, "mx", "u1"))][:2]
        for entry in copies:
            _put(store, "u1#1", entry)
        _put(store, "u1#1", JournalEntry(seq=3, kind="now", fingerprint="new", result=9, at=time.time()))
        whole = read_page(store, "mx", limit=2000).items
        journal = [i.id for i in whole if i.id.startswith("j/")]
        assert journal == ["j/u1/1", "j/u1/2", "j/u1/3", "j/u1#1/3"]
        paged, cursor = [], ""
        while True:
            page = read_page(store, "mx", cursor=cursor, limit=1)
            paged += page.items
            cursor = page.cursor
            if not page.more:
                break
        assert paged == list(whole)


def test_failovers_restarts_and_reexecutions_say_why(tmp_path: Path) -> None:
    from keel.protocol.records import Event

    with Store.open(tmp_path / "store", create=True) as store:
        make_mission(store, "mx", checkpoints=2)  # two recorded steps in lane u1
        later = time.time() + 5

        def write(txn: object) -> None:
            add = m.add_evidence
            add(txn, "mx", Evidence(kind="failover", at=later, unit="u1", summary="failover a/0 -> b/0 (auth)"))  # type: ignore[arg-type]
            add(
                txn,
                "mx",
                Evidence(
                    kind="reexecuted",
                    at=later + 1,
                    unit="u1",
                    summary="unit u1 is executed again",  # type: ignore[arg-type]
                    data={"reason": "its sandbox is gone"},
                ),
            )
            m.add_event(txn, "mx", Event(kind="unit", at=later + 2, unit="u1", state="running", message="attempt 2"))  # type: ignore[arg-type]

        store.write(write)
        items = {i.kind: i for i in read_page(store, "mx").items}
        assert items["failover"].title == "failover a/0 -> b/0 (auth)"
        assert items["failover"].status == "switched" and not items["failover"].failed  # served elsewhere
        assert items["reexecuted"].text == "its sandbox is gone"
        assert items["unit"].title.startswith("unit u1 started (attempt 2): 2 recorded step(s) from the journal")
        only = read_page(store, "mx", filter=Filter(failures_only=True)).items
        assert [i.kind for i in only] == []  # a switch to another provider is no failure


def test_a_start_again_without_a_stop_says_the_host_was_lost(tmp_path: Path) -> None:
    """u1 starts, starts again with no pause or question between (its host was lost), asks a question
    and goes on with the answer, then is paused and goes on again (a person's pause): only the start
    again without a stop is a restart (the host lane, the work a resume kept)."""
    from keel.protocol.records import Event

    with Store.open(tmp_path / "store", create=True) as store:
        make_mission(store, "mx", checkpoints=2)  # two recorded steps in lane u1
        later = time.time() + 5
        answer = Evidence(kind="answer", at=later + 3.5, unit="u1", data={"question": "q?", "answer": "a"})

        def write(txn: object) -> None:
            add = m.add_event
            add(txn, "mx", Event(kind="unit", at=later, unit="u1", state="running", message="attempt 1"))  # type: ignore[arg-type]
            add(txn, "mx", Event(kind="unit", at=later + 1, unit="u1", state="running", message="attempt 2"))  # type: ignore[arg-type]
            add(txn, "mx", Event(kind="state", at=later + 2, state="waiting_input", message="running -> waiting_input"))  # type: ignore[arg-type]
            m.add_evidence(txn, "mx", answer)  # type: ignore[arg-type]
            add(txn, "mx", Event(kind="state", at=later + 4, state="running", message="waiting_input -> running"))  # type: ignore[arg-type]
            add(txn, "mx", Event(kind="unit", at=later + 5, unit="u1", state="running", message="attempt 3"))  # type: ignore[arg-type]
            add(txn, "mx", Event(kind="state", at=later + 6, state="paused", message="running -> paused"))  # type: ignore[arg-type]
            add(txn, "mx", Event(kind="state", at=later + 7, state="running", message="paused -> running"))  # type: ignore[arg-type]
            add(txn, "mx", Event(kind="unit", at=later + 8, unit="u1", state="running", message="attempt 4"))  # type: ignore[arg-type]

        store.write(write)
        items = read_page(store, "mx", limit=2000).items
        restarts = [i for i in items if i.kind == "restart"]
        assert [i.title for i in restarts] == [
            "host lost, resumed from the journal: 2 step(s) kept, none run again (unit u1)"
        ]
        assert (restarts[0].status, restarts[0].kept) == ("host-lost", 2)
        # (the journal's entries carry no time here, so even the first start finds them recorded)
        starts = [(i.status, i.title.split(":")[0]) for i in items if i.kind == "unit"]
        assert starts == [
            ("first", "unit u1 started (attempt 1)"),
            ("answered", "unit u1 goes on with the person's answer (attempt 3)"),
            ("resumed", "unit u1 goes on after the mission resumed (attempt 4)"),
        ]
        assert [i.kind for i in items if i.at == answer.at] == ["answer"]


def test_a_page_reads_only_what_it_shows(tmp_path: Path) -> None:
    """A page of a long history never reads far past its cursor: the first pages of a 5,000-entry mission
    are served while entry 4,000 is damaged, and the page that reaches it names the damaged record."""
    store_path = tmp_path / "store"
    mid = make_history(store_path, tmp_path, 5000)
    with Store.open(store_path) as store:
        store.write(lambda t: t.put_raw(DB.JOURNAL, log_key(unit_prefix(mid, UNIT), 4000), b"not a record"))
        page = read_page(store, mid, limit=200)
        assert len(page.items) == 200 and page.more
        assert [i.seq for i in page.items if i.kind != "state" and i.kind != "unit"][:3] == [1, 2, 3]
        shown, cursor = len(page.items), page.cursor
        with pytest.raises(CorruptRecordError, match=f"journal.*{mid}"):
            while True:
                page = read_page(store, mid, cursor=cursor, limit=500)
                shown, cursor = shown + len(page.items), page.cursor
        assert 4000 - 520 <= shown < 4000  # it stopped at the page (500, and a few read past it) that reached it
