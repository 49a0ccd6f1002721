"""Map growth and full disks: writes go on while the map can grow; a full disk loses nothing committed."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.protocol.records import Event
from keel.storage import DB, Store, StoreFullError
from keel.storage.keys import mission_prefix
from keel.storage.verify import verify_all

PREFIX = mission_prefix("m1")


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
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({proc.stderr.strip()}); needs root with CAP_SYS_ADMIN")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


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
