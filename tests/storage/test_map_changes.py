"""A read in one thread goes on while the store's map changes: grown by a write of another thread, or adopted
after another process grew it (as `keel serve` reads while a mission host writes). py-lmdb invalidates
every open transaction and cursor of an environment when its map is resized, so the resize waits until no
read of the process is open (`storage/envgate.py`) instead of breaking the one under way."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from keel.protocol.records import Event
from keel.storage import DB, Store, StoreError, Txn
from keel.storage.keys import mission_prefix
from keel.storage.store import LmdbStore

PREFIX = mission_prefix("m1")
SMALL_MAP = 256 * 1024
DEADLINE_S = 60.0
ENTRIES = 40


def _event(i: int) -> Event:
    return Event(kind="fill", at=float(i), message=f"{i:08d}" + "x" * 2000)


def _fill(store: Store, start: int, count: int) -> None:
    for i in range(start, start + count):
        store.write(lambda t, i=i: t.append(DB.EVENTS, PREFIX, _event(i)))


def _grow_here(store: LmdbStore, path: Path) -> None:
    """A write of this process that needs a bigger map than the store has."""
    before = store.map_size()
    _fill(store, ENTRIES + 1, 400)
    assert store.map_size() > before


def _grow_elsewhere(store: LmdbStore, path: Path) -> None:
    """Another process grows the map; then a read of this process begins (and must adopt the new size)."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[2]); from keel.storage import Store; "
        "from tests.storage.test_map_changes import _fill, ENTRIES; "
        "s = Store.open(sys.argv[1], map_size=262144); _fill(s, ENTRIES + 1, 400); print(s.map_size()); s.close()"
    )
    root = str(Path(__file__).resolve().parents[2])
    grown = subprocess.run([sys.executable, "-c", script, str(path), root], capture_output=True, text=True, timeout=60)
    assert grown.returncode == 0, grown.stderr
    assert int(grown.stdout) > store.map_size()
    assert len(store.read(lambda t: list(t.read_log(DB.EVENTS, PREFIX, Event)))) == ENTRIES + 400


@pytest.mark.parametrize("grow", [_grow_here, _grow_elsewhere], ids=["grown-here", "grown-by-another-process"])
def test_a_read_under_way_survives_the_map_growing(tmp_path: Path, grow: Callable[[LmdbStore, Path], None]) -> None:
    path = tmp_path / "store"
    store = Store.open(path, map_size=SMALL_MAP)
    assert isinstance(store, LmdbStore)
    try:
        _fill(store, 1, ENTRIES)
        halfway, grown = threading.Event(), threading.Event()
        failures: list[BaseException] = []

        def resize_waits_or_done() -> bool:
            gate = getattr(store._shared, "gate", None)  # the map change that waits for the read to end
            return grown.is_set() or failures != [] or (gate is not None and gate.change_waiting())

        def scan(t: Txn) -> list[int]:
            seqs = []
            for seq, _ in t.read_log(DB.EVENTS, PREFIX, Event):
                seqs.append(seq)
                if seq == ENTRIES // 2:  # a cursor is open mid-log: let the map change now
                    halfway.set()
                    _wait(resize_waits_or_done)
            return seqs

        def reader() -> None:
            try:
                assert store.read(scan) == list(range(1, ENTRIES + 1))
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        assert halfway.wait(DEADLINE_S)

        def grower_run() -> None:
            try:
                grow(store, path)
                grown.set()
            except BaseException as exc:
                failures.append(exc)

        grower = threading.Thread(target=grower_run)
        grower.start()
        thread.join(DEADLINE_S)
        grower.join(DEADLINE_S)
        assert not thread.is_alive() and not grower.is_alive()
        assert grown.is_set(), "the map did not grow"
        assert failures == []
    finally:
        store.close()


def _wait(condition: Callable[[], bool]) -> None:
    done = threading.Event()
    for _ in range(int(DEADLINE_S / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("the map neither changed nor waited to change")


def test_a_thread_cannot_grow_the_map_under_its_own_read(tmp_path: Path) -> None:
    """A write that needs a bigger map, made inside a read of the same thread, is refused with a StoreError
    (growing the map would invalidate that read) instead of waiting for itself."""
    with Store.open(tmp_path / "store", map_size=SMALL_MAP) as store:
        _fill(store, 1, ENTRIES)

        def write_inside(t: Txn) -> None:
            _fill(store, ENTRIES + 1, 400)

        with pytest.raises(StoreError, match="cannot change while this thread holds one of its transactions"):
            store.read(write_inside)
        assert len(store.read(lambda t: list(t.read_log(DB.EVENTS, PREFIX, Event)))) > ENTRIES  # still usable
