"""The journal writer and fingerprints on a real LMDB store: group commits, urgency, isolation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from keel.protocol.spec import CheckpointPolicy
from keel.server.engine.journal import JournalWriter, fingerprint, lane
from keel.server.engine.policy import Policy
from keel.storage import DB, Store, Txn


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
