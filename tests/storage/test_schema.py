"""Schema versions: newer stores are refused with a clear message; older ones are migrated on open."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from keel.protocol.records import Event, HostLease, JournalEntry, Placement, UnitLease, WorkerOffer, WorkerPlace
from keel.protocol.spec import UnitSpec
from keel.protocol.states import LeaseState, Resolution
from keel.storage import DB, Store, StoreTooNewError, hostlease, leases
from keel.storage import migrations as mig
from keel.storage import missions as m
from keel.storage.keys import unit_prefix
from keel.storage.migrations import SCHEMA_VERSION, SchemaInfo
from keel.storage.txn import Txn, decode_value
from tests.storage.raw import raw_get, raw_keys
from tests.storage.rawlmdb import raw_env


def write_schema_record(path: Path, version: int, written_by: str) -> None:
    """Make `path` look like a store written by another keel: its META schema record says `version`."""
    with Store.open(path) as store:
        store.write(lambda t: t.put(DB.META, b"schema", SchemaInfo(version=version, written_by=written_by)))


def test_newer_store_is_refused_with_a_clear_message(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    path = store_folder(tmp_path / "s")
    write_schema_record(path, SCHEMA_VERSION + 1, "9.9.9")
    with pytest.raises(StoreTooNewError) as info:
        Store.open(path)
    where = re.escape(str(path))  # a PostgreSQL store is named by its server and database, then its folder
    assert re.fullmatch(
        rf"store at ({where}|postgresql://127\.0\.0\.1:\d+/postgres \({where}\)) has schema {SCHEMA_VERSION + 1}, "
        rf"written by keel 9\.9\.9; this keel \(0\.1\.0\) reads schema {SCHEMA_VERSION} at most; upgrade keel",
        info.value.message,
    ), info.value.message
    if not (path / "store.url").exists():
        raw_env(path).close()  # the refused open closed its environment (LMDB allows one per process)
    with pytest.raises(StoreTooNewError):  # and refusing changed nothing
        Store.open(path)


def test_schema_0_store_is_migrated_forward_on_open(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    path = store_folder(tmp_path / "s")
    write_schema_record(path, 0, "")
    with Store.open(path) as store:
        store.write(lambda t: t.put(DB.EVENTS, b"old", Event(kind="before", at=1.0)))
    # (the line above reopened it: the store is now current; go back to 0 to watch the migration itself)
    write_schema_record(path, 0, "")
    with Store.open(path) as store:
        assert store.schema() == SchemaInfo(version=SCHEMA_VERSION, written_by="0.1.0")
        assert store.read(lambda t: t.get(DB.EVENTS, b"old", Event)) == Event(kind="before", at=1.0)


def test_migrations_run_in_order_inside_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_folder: Callable[[Path], Path]
) -> None:
    path = store_folder(tmp_path / "s")
    write_schema_record(path, 0, "")
    ran: list[int] = []

    def step(n: int, fail: bool = False):  # type: ignore[no-untyped-def]
        def migrate(txn: Txn) -> None:
            ran.append(n)
            txn.put(DB.META, f"migrated-{n}".encode(), SchemaInfo(version=n))
            if fail:
                raise RuntimeError(f"migration {n} failed")

        return migrate

    monkeypatch.setattr(mig, "SCHEMA_VERSION", 3)
    monkeypatch.setattr("keel.storage.base.SCHEMA_VERSION", 3)
    monkeypatch.setitem(mig.MIGRATIONS, 0, step(0))
    monkeypatch.setitem(mig.MIGRATIONS, 1, step(1))
    monkeypatch.setitem(mig.MIGRATIONS, 2, step(2, fail=True))
    with pytest.raises(RuntimeError, match="migration 2 failed"):
        Store.open(path)
    assert ran == [0, 1, 2]
    # the failed attempt left nothing behind: still schema 0, no migration's writes
    assert raw_keys(path, DB.META) == [b"schema"]
    assert decode_value("meta", b"schema", raw_get(path, DB.META, b"schema"), SchemaInfo).version == 0
    monkeypatch.setitem(mig.MIGRATIONS, 2, step(2))
    ran.clear()
    with Store.open(path) as store:
        assert ran == [0, 1, 2] and store.schema().version == 3
        assert store.read(lambda t: t.get(DB.META, b"migrated-2", SchemaInfo)) == SchemaInfo(version=2)


def test_schema_1_answers_kept_in_summaries_become_typed_flags(
    tmp_path: Path, store_folder: Callable[[Path], Path]
) -> None:
    """Schema 1 kept a person's answer to an uncertain effect as the entry's summary; schema 2 types it, and
    a summary that merely reads alike (an agent's own words, an intent not answered) is left alone."""
    path = store_folder(tmp_path / "s")
    skipped_result = {"ok": True, "output": {"skipped": True, "note": "a person said the effect had already happened"}}
    old = {
        1: JournalEntry(seq=1, kind="tool/run", fingerprint="a", phase="intent", summary="rerun-approved"),
        2: JournalEntry(seq=2, kind="tool/run", fingerprint="b", summary="skipped", result=skipped_result),
        3: JournalEntry(seq=3, kind="tool/run", fingerprint="c", summary="skipped 3 files", result={"ok": True}),
        4: JournalEntry(seq=4, kind="tool/run", fingerprint="d", phase="intent", summary="run make"),
    }
    write_schema_record(path, 1, "0.1.0")
    with Store.open(path) as store:
        store.write(lambda t: [m.journal_put(t, "m1", "a#2", entry) for entry in old.values()])
    write_schema_record(path, 1, "0.1.0")  # (the line above reopened it at schema 2: back to 1)
    with Store.open(path) as store:
        assert store.schema().version == SCHEMA_VERSION
        now = {e.seq: e for e in store.read(lambda t: m.journal_entries(t, "m1", "a#2"))}
    assert now[1] == msgspec.structs.replace(old[1], rerun_approved=True)
    assert now[2] == msgspec.structs.replace(old[2], skipped=True)
    assert now[3] == old[3] and now[4] == old[4]


def test_schema_2_flat_leases_are_nested_in_place(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    """Schema 2 stored a unit's lease as one flat map of 23 fields; schema 3 keeps the same record with its
    placement (`place`) and its worker offer (`offer`) nested. Every field is found in its new place; a
    lease that set none of them gets an empty placement and no offer; a lease already nested (a store marked
    older than the records it holds) and a host's lease are left as they are."""
    path = store_folder(tmp_path / "s")
    unit = UnitSpec(id="a", kind="shell", title="build", params={"cmd": "make"})
    ran_on = WorkerPlace(worker="w-1", hostname="build-7", pid=4242, sandbox="/w/a.3")
    flat = {  # the schema 2 record of a done unit a worker ran, its fields in the order that keel wrote them
        "unit": "a",
        "lane": "a#2",
        "epoch": 3,
        "host_id": "h1",
        "state": "done",
        "pid": 42,
        "hostname": "vm",
        "heartbeat": 9.5,
        "ttl_s": 5.0,
        "started_at": 8.5,
        "sandbox": "/s/a",
        "branch": "keel/m1-units/a",
        "base": "c" * 40,
        "tree": "t" * 64,
        "base_tree": "b" * 64,
        "last_checkpoint": 7,
        "result": {"ok": 1},
        "commit": "d" * 40,
        "merged": True,
        "resolution": "rerun",
        "worker": "w-1",
        "spec": unit,
        "why": "a question for a person",
        "ran_on": ran_on,
    }
    bare = {"unit": "b", "lane": "b", "epoch": 1, "host_id": "h1"}  # every other field at its default
    host = HostLease(mission="m1", epoch=4, host_id="h1", pid=7, hostname="vm", heartbeat=1.0, ttl_s=2.0)
    nested = UnitLease(unit="c", lane="c", epoch=2, host_id="h1", place=Placement(sandbox="/s/c", tree="t" * 64))
    write_schema_record(path, 2, "0.1.0")
    with Store.open(path) as store:
        store.write(
            lambda t: (
                t.put(DB.LEASES, unit_prefix("m1", "a")[:-1], flat),
                t.put(DB.LEASES, unit_prefix("m1", "b")[:-1], bare),
                t.put(DB.LEASES, unit_prefix("m1", "c")[:-1], nested),
                t.put(DB.LEASES, b"m1", host),
            )
        )
    write_schema_record(path, 2, "0.1.0")  # (the line above reopened it at the current schema: back to 2)
    with Store.open(path) as store:
        assert store.schema().version == SCHEMA_VERSION
        now = {x.unit: x for x in store.read(lambda t: leases.list_leases(t, "m1"))}
        assert store.read(lambda t: hostlease.get(t, "m1")) == host
    assert now["a"] == UnitLease(
        unit="a",
        lane="a#2",
        epoch=3,
        host_id="h1",
        state=LeaseState.DONE,
        pid=42,
        hostname="vm",
        heartbeat=9.5,
        ttl_s=5.0,
        started_at=8.5,
        resolution=Resolution.RERUN,
        place=Placement(
            sandbox="/s/a",
            branch="keel/m1-units/a",
            base="c" * 40,
            tree="t" * 64,
            base_tree="b" * 64,
            last_checkpoint=7,
            commit="d" * 40,
            merged=True,
            result={"ok": 1},
            ran_on=ran_on,
        ),
        offer=WorkerOffer(worker="w-1", spec=unit, why="a question for a person"),
    )
    assert now["b"] == UnitLease(unit="b", lane="b", epoch=1, host_id="h1", place=Placement(), offer=None)
    assert now["c"] == nested
