"""Map growth and full disks: writes go on while the map can grow; a full disk loses nothing committed,
is named by its mount point (also when LMDB reports it as EIO), and the store's reserve lets a host commit
what is in flight."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keel.protocol.records import Event
from keel.storage import DB, Store, StoreFullError, Txn
from keel.storage.keys import mission_prefix
from keel.storage.store import DEFAULT_RESERVE_BYTES
from keel.storage.verify import verify_all
from tests.tmpfs import fill, mounted

PREFIX = mission_prefix("m1")
PREFIXES = [mission_prefix(m) for m in ("j1", "j2", "j3")]


def _event(i: int, size: int = 1000) -> Event:
    return Event(kind="fill", at=float(i), message=f"{i:08d}" + "x" * size)


def _events(store: Store) -> list[tuple[int, Event]]:
    return store.read(lambda t: list(t.read_log(DB.EVENTS, PREFIX, Event)))


def test_map_grows_under_many_writes_and_everything_reads_back(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", map_size=128 * 1024) as store:
        for i in range(1, 801):
            store.write(lambda t, i=i: t.append(DB.EVENTS, PREFIX, _event(i)))
        calls: list[int] = []

        def big(t: object) -> None:  # one transaction larger than the map: retried on a grown map
            calls.append(1)
            for i in range(801, 3001):
                t.append(DB.EVENTS, PREFIX, _event(i))  # type: ignore[attr-defined]

        store.write(big)
        assert store.map_size() > 128 * 1024 and len(calls) > 1
    with Store.open(tmp_path / "s", map_size=128 * 1024) as store:
        assert _events(store) == [(i, _event(i)) for i in range(1, 3001)]
        assert verify_all(store).ok


def test_map_ceiling_is_store_full_and_keeps_what_was_committed(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", map_size=128 * 1024, max_map_size=512 * 1024) as store:
        done = 0
        with pytest.raises(StoreFullError, match="size ceiling of 524288 bytes; nothing committed was lost"):
            for i in range(1, 100_000):
                store.write(lambda t, i=i: t.append(DB.EVENTS, PREFIX, _event(i)))
                done = i
        assert done > 100
        assert _events(store) == [(i, _event(i)) for i in range(1, done + 1)]
        store.write(lambda t: t.delete(DB.EVENTS, PREFIX + (1).to_bytes(8, "big")))  # small writes still work


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB filesystem; unmounted afterwards."""
    with mounted(tmp_path / "tmpfs", "2m") as mnt:
        yield mnt


def test_full_filesystem_is_store_full_and_nothing_committed_is_lost(tmpfs: Path, tmp_path: Path) -> None:
    path = tmpfs / "store"
    done = 0
    with Store.open(path) as store:
        with pytest.raises(StoreFullError, match="disk full") as info:
            for i in range(1, 100_000):
                store.write(lambda t, i=i: t.append(DB.EVENTS, PREFIX, _event(i, 3000)))
                done = i
        assert "nothing committed was lost" in info.value.message
    assert done > 50  # the 2 MiB disk held a few hundred KiB of events before it filled
    with Store.open(path) as store:
        assert _events(store) == [(i, _event(i, 3000)) for i in range(1, done + 1)]
        assert verify_all(store).ok
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    subprocess.run(["umount", str(tmpfs)], check=True)
    assert not (tmpfs / "store").exists()
    with Store.open(copy) as store:
        assert _events(store) == [(i, _event(i, 3000)) for i in range(1, done + 1)]
        report = verify_all(store)
        assert report.ok and report.records >= done
        store.write(lambda t: t.append(DB.EVENTS, PREFIX, _event(done + 1)))  # off the full disk, writes go on


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem: room for a store, its 1 MiB reserve, a filler, and the reserve again."""
    with mounted(tmp_path / "small_fs", "4m") as mnt:
        yield mnt


def _small_txn(i: int) -> Callable[[Txn], None]:
    """About what a journal step writes: three records of 1 KB in three places."""

    def write(t: Txn) -> None:
        for prefix in PREFIXES:
            t.append(DB.EVENTS, prefix, _event(i))

    return write


def test_a_full_disk_spends_the_reserve_and_the_next_commits_go_through(small_fs: Path) -> None:
    path = small_fs / "store"
    with Store.open(path) as store:
        store.reserve_owner = True
        assert (path / "reserve").stat().st_size == DEFAULT_RESERVE_BYTES and store.full_disk() == ""
        store.write(lambda t: t.append(DB.EVENTS, PREFIX, _event(0)))
        filler = fill(small_fs)
        done = 0
        with pytest.raises(StoreFullError) as info:
            for i in range(1, 100_000):
                store.write(_small_txn(i))
                done = i
        # the reserve held many small commits (copy-on-write pages and freelist included): measured
        # about 150 of these three-record transactions per MiB, far more than a host needs to stop
        assert done >= 50, done
        assert not (path / "reserve").exists()
        for message in (info.value.message, store.full_disk()):
            assert message.startswith(f"disk full: the filesystem mounted at {small_fs} (")
            assert f"the store at {path}" in message and "nothing committed was lost" in message
        assert info.value.mount == str(small_fs)
    filler.unlink()
    with Store.open(path) as store:
        assert (path / "reserve").stat().st_size == DEFAULT_RESERVE_BYTES  # made again: there is room now
        assert store.full_disk() == ""
        assert store.read(lambda t: list(t.read_log(DB.EVENTS, PREFIXES[2], Event))) == [
            (i, _event(i)) for i in range(1, done + 1)
        ]
        assert verify_all(store).ok


def test_only_the_reserve_owner_spends_it(small_fs: Path) -> None:
    path = small_fs / "store"
    with Store.open(path) as store:
        filler = fill(small_fs)
        with pytest.raises(StoreFullError, match=f"the filesystem mounted at {small_fs} "):
            for i in range(1, 100_000):
                store.write(_small_txn(i))
        assert (path / "reserve").exists()  # a subagent's heartbeat or a CLI verb leaves it to the host
    filler.unlink()


def test_a_short_write_reported_as_eio_is_a_full_disk(small_fs: Path) -> None:
    """LMDB turns a short write into EIO ("Input/output error"): with almost no space left that is a full
    disk, named by its mount point, not a broken store."""
    path = small_fs / "store"
    with Store.open(path, reserve_bytes=0) as store:
        filler = fill(small_fs, leave=200 * 1024)
        with pytest.raises(StoreFullError) as info:
            store.write(lambda t: t.put_object("x" * 600_000))
        assert "Input/output error" in info.value.message or "No space left" in info.value.message
        assert info.value.message.startswith(f"disk full: the filesystem mounted at {small_fs} (")
        filler.unlink()
        store.write(lambda t: t.append(DB.EVENTS, PREFIX, _event(1)))
        assert _events(store) == [(1, _event(1))]


def test_reopen_keeps_everything_and_serves_every_store_of_the_path(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as first, Store.open(tmp_path / "s") as second:
        first.write(lambda t: t.append(DB.EVENTS, PREFIX, _event(1)))
        first.reopen()  # what a write does by itself after LMDB marked the environment fatal (MDB_PANIC)
        second.write(lambda t: t.append(DB.EVENTS, PREFIX, _event(2)))
        assert _events(first) == _events(second) == [(1, _event(1)), (2, _event(2))]
