"""The journal writer and fingerprints on a real LMDB store: group commits, urgency, isolation."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from keel.protocol.spec import CheckpointPolicy
from keel.server.engine.journal import JournalWriter, fingerprint, lane
from keel.server.engine.step.policy import Policy
from keel.storage import DB, Store, Txn

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def test_fingerprint_is_canonical_and_names_the_method() -> None:
    assert fingerprint("tool/run", {"a": 1, "b": [1, 2]}) == fingerprint("tool/run", {"b": [1, 2], "a": 1})
    assert fingerprint("tool/run", {"a": 1}) != fingerprint("now", {"a": 1})
    assert fingerprint("now", None) != fingerprint("random", None)
    assert lane("u", 0) == "u" and lane("u", 2) == "u#2"


async def _commit_all(writer: JournalWriter, n: int, urgent: bool) -> list[int]:
    def put(i: int):  # type: ignore[no-untyped-def]
        def fn(txn: Txn) -> int:
            txn.put(DB.META, f"k{i}".encode(), i)
            return i

        return fn

    return list(await asyncio.gather(*(writer.commit(put(i), urgent=urgent) for i in range(n))))


@pytest.mark.parametrize(("parallel", "urgent", "max_commits"), [(4, False, 5), (1, True, 50)])
def test_cheap_steps_share_commits_only_when_units_run_in_parallel(
    tmp_path: Path, parallel: int, urgent: bool, max_commits: int
) -> None:
    with Store.open(tmp_path / "store") as store:
        writer = JournalWriter(store, window_s=0.005)
        writer.parallel = parallel
        assert asyncio.run(_commit_all(writer, 50, urgent)) == list(range(50))
        writer.close()
        assert writer.items == 50 and writer.commits <= max_commits
        assert store.read(lambda t: t.get(DB.META, b"k49", int)) == 49


def test_one_failing_write_does_not_fail_its_batch_neighbours(tmp_path: Path) -> None:
    async def run(writer: JournalWriter) -> list[object]:
        def good(txn: Txn) -> str:
            txn.put(DB.META, b"good", 1)
            return "ok"

        def bad(txn: Txn) -> str:
            raise ValueError("broken write")

        return await asyncio.gather(
            writer.commit(good, urgent=False), writer.commit(bad, urgent=False), return_exceptions=True
        )

    with Store.open(tmp_path / "store") as store:
        writer = JournalWriter(store, window_s=0.01)
        writer.parallel = 2
        good, bad = asyncio.run(run(writer))
        writer.close()
        assert good == "ok" and isinstance(bad, ValueError)
        assert store.read(lambda t: t.get(DB.META, b"good", int)) == 1


def test_policy_classifies_steps_by_cost() -> None:
    adaptive = Policy(CheckpointPolicy())
    assert adaptive.urgent("model/complete", None, 1.0, 100)
    assert adaptive.urgent("tool/run", "effectful", 0.1, 0)
    assert not adaptive.urgent("tool/run", "read_only", 0.1, 0)
    assert adaptive.urgent("tool/run", "read_only", 500.0, 0)
    assert not adaptive.urgent("now", None, 0.01, 0)
    assert not adaptive.record(10.0) and adaptive.record(40_000.0)
    every = Policy(CheckpointPolicy(policy="every-step"))
    assert every.urgent("now", None, 0.01, 0) and every.record(0.01) and every.window_s == 0.0


def test_a_group_commits_as_soon_as_every_unit_has_an_entry_waiting(tmp_path: Path) -> None:
    """The window is an upper bound: once each unit that may add entries has one waiting, nobody else
    can join, so the group commits at once instead of waiting out a (here very long) window."""

    async def run(writer: JournalWriter) -> list[int]:
        return await asyncio.wait_for(_commit_all(writer, 4, urgent=False), timeout=30)

    with Store.open(tmp_path / "store") as store:
        writer = JournalWriter(store, window_s=120.0)
        writer.parallel = 4
        try:
            assert asyncio.run(run(writer)) == [0, 1, 2, 3]
        finally:
            writer.close()
        assert writer.commits == 1 and writer.items == 4


HOLD_WRITER_LOCK = """
import sys
from keel.storage import Store
from keel.storage.keys import DB

def hold(txn):  # inside a write transaction: the store's write lock is held (writer.lock), or on PostgreSQL
    txn.get_raw(DB.META, b"late")  # the fence of the records the test's writer puts
    print("held", flush=True)
    sys.stdin.read()

Store.open(sys.argv[1], create=False).write(hold)
"""


def test_alone_a_commit_is_made_on_the_callers_thread_but_never_waits_there_for_another_writer(
    tmp_path: Path,
) -> None:
    """One unit alone commits on the event loop's thread (no handoff). While another process holds the
    store's write lock, its write goes to the writer thread instead: the loop keeps running, and the
    entry commits once the lock is free."""

    def put(key: bytes) -> Callable[[Txn], bytes]:
        def fn(txn: Txn) -> bytes:
            txn.put(DB.META, key, 1)
            return key

        return fn

    async def while_held(writer: JournalWriter, holder: subprocess.Popen[str]) -> bytes:
        task = asyncio.ensure_future(writer.commit(put(b"late")))
        started = time.monotonic()
        for _ in range(20):  # the loop goes on turning while the commit waits for the lock
            await asyncio.sleep(0.01)
        assert time.monotonic() - started < 30, "the event loop waited for another process's write lock"
        assert not task.done()
        assert holder.stdin is not None
        holder.stdin.close()  # the holder commits and exits: the lock is free
        return await asyncio.wait_for(task, timeout=30)

    with Store.open(tmp_path / "store", write_timeout=120) as store:  # a loop waiting would wait for long
        writer = JournalWriter(store, window_s=0.002)
        try:
            assert asyncio.run(writer.commit(put(b"first"))) == b"first"
            assert writer.direct == 1
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLD_WRITER_LOCK, str(store.path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert holder.stdout is not None and holder.stdout.readline() == "held\n"
                assert asyncio.run(while_held(writer, holder)) == b"late"
            finally:
                holder.kill()
                holder.wait(timeout=30)
        finally:
            writer.close()
        assert writer.direct == 1 and writer.commits == 2
        assert store.read(lambda t: t.get(DB.META, b"late", int)) == 1
