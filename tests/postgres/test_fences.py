"""Missions' writes on PostgreSQL are independent: a write fences only the missions it touches. While one
mission's write is open, another mission's write commits at once, a write of the same mission waits for it
(and, past its limit, is StoreBusyError naming the holder), and a `whole` write (gc) waits for both. Writers
racing on one mission's log lose nothing and never number two entries alike; the change counter grows with
every commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from keel.storage import Store
from keel.storage.errors import StoreBusyError
from keel.storage.keys import DB, mission_prefix
from keel.storage.txn import Txn
from tests.pgserver import PgServer


def _entry(mission: str, text: str) -> Callable[[Txn], int]:
    return lambda txn: txn.append(DB.EVENTS, mission_prefix(mission), text)


class _Open:
    """A write of one mission held open (in its own thread) until released."""

    def __init__(self, store: Store, mission: str) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=store.write, args=(self._fn(mission),), daemon=True)
        self.thread.start()
        assert self.inside.wait(20), "the held write never began"

    def _fn(self, mission: str) -> Callable[[Txn], None]:
        def fn(txn: Txn) -> None:
            txn.append(DB.EVENTS, mission_prefix(mission), "held")
            self.inside.set()
            assert self.release.wait(60)

        return fn

    def end(self) -> None:
        self.release.set()
        self.thread.join(30)


def test_another_missions_write_does_not_wait_and_the_same_missions_does(tmp_path: Path, pg_server: PgServer) -> None:
    with Store.open(pg_server.store_folder(tmp_path / "store"), write_timeout=30) as store:
        held = _Open(store, "a")
        try:
            began = time.monotonic()
            assert store.write(_entry("b", "free"), timeout=30) == 1
            other = time.monotonic() - began
            with pytest.raises(StoreBusyError, match=r"keel pid \d+"):  # the holder is named
                store.write(_entry("a", "waits"), timeout=0.3)
            with ThreadPoolExecutor(2) as pool:
                same = pool.submit(store.write, _entry("a", "after"))
                whole = pool.submit(store.write, lambda t: t.put_blob(b"whole"), whole=True)
                time.sleep(0.5)
                assert not same.done() and not whole.done(), "a write of the held mission (or a whole one) went on"
                held.end()
                assert same.result(30) == 2 and whole.result(30)
        finally:
            held.end()
        assert other < 5, f"another mission's write took {other:.1f} s while one was open"
        events = store.read(lambda t: [v for _, v in t.scan(DB.EVENTS, mission_prefix("a"), str)])
        assert events == ["held", "after"]


def test_racing_writers_of_one_mission_lose_nothing(tmp_path: Path, pg_server: PgServer) -> None:
    with Store.open(pg_server.store_folder(tmp_path / "store"), write_timeout=60) as store:
        before = store.txn_id()
        with ThreadPoolExecutor(6) as pool:
            seqs = list(pool.map(lambda n: store.write(_entry(("a", "b")[n % 2], f"e{n}")), range(60)))
        assert sorted(seqs) == sorted([*range(1, 31), *range(1, 31)])
        for mission in ("a", "b"):
            keys = store.read(lambda t, m=mission: [k for k, _ in t.scan_raw(DB.EVENTS, mission_prefix(m))])
            assert [int.from_bytes(k[-8:], "big") for k in keys] == list(range(1, 31))
        assert store.txn_id() > before
        seen = store.txn_id()
        store.write(_entry("c", "one more"))
        assert store.txn_id() > seen


def test_a_claim_passes_over_a_mission_being_written(tmp_path: Path, pg_server: PgServer) -> None:
    """A worker's claim fences the offer's mission without waiting (as `FOR UPDATE SKIP LOCKED` would): while
    another write of the mission is under way it looks at the next offer instead of queueing."""
    with Store.open(pg_server.store_folder(tmp_path / "store"), write_timeout=30) as store:
        held = _Open(store, "a")
        try:
            began = time.monotonic()
            assert store.write(lambda t: (t.try_mission("a"), t.try_mission("b"))) == (False, True)
            assert time.monotonic() - began < 5
        finally:
            held.end()
        assert store.write(lambda t: t.try_mission("a")) is True
