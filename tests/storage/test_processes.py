"""Several real processes on one store: nothing lost, no duplicate sequence numbers, no stale readers.

Writers are `python -c` subprocesses (LMDB serializes writers across processes); readers run at the same
time and must only ever see whole, verified records.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from keel.protocol.records import Event
from keel.storage import DB, Store
from keel.storage.keys import mission_prefix
from keel.storage.verify import open_reader, verify_all, verify_structure, walk_in_snapshot
from tests.storage.rawlmdb import raw_env

WRITER = """
import os, sys, time
from keel.protocol.records import Event
from keel.storage import DB, Store
from keel.storage.keys import mission_prefix
path, name, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with Store.open(path, map_size=64 * 1024) as store:
    print("ready", flush=True)
    while not os.path.exists(go):  # start together, so that the writers really interleave
        time.sleep(0.005)
    for i in range(count):
        ev = Event(kind=name, at=float(i), message=name * 200)
        store.write(lambda t: (t.append(DB.EVENTS, mission_prefix("shared"), ev),
                               t.put(DB.EVIDENCE, f"{name}-{i}".encode(), ev)))
"""

READER = """
import sys
from keel.protocol.records import Event
from keel.storage import DB, Store
from keel.storage.keys import mission_prefix
path, rounds = sys.argv[1], int(sys.argv[2])
seen = 0
with Store.open(path) as store:
    for _ in range(rounds):
        log = store.read(lambda t: list(t.read_log(DB.EVENTS, mission_prefix("shared"), Event)))
        assert [s for s, _ in log] == list(range(1, len(log) + 1)), "gap in the log"
        assert len(log) >= seen, "the log shrank"
        seen = len(log)
print(seen)
"""


def _spawn(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_two_writers_and_a_reader_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s"
    Store.open(path, map_size=64 * 1024).close()
    count = 300
    go = tmp_path / "go"
    writers = [_spawn(WRITER, path, name, count, go) for name in "ab"]
    for proc in writers:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    go.touch()
    procs = [*writers, _spawn(READER, path, 200)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outputs.append(out)
    assert int(outputs[-1]) > 0  # the reader saw the log grow while the writers ran
    with Store.open(path) as store:
        log = store.read(lambda t: list(t.read_log(DB.EVENTS, mission_prefix("shared"), Event)))
        evidence = store.read(lambda t: dict(t.scan(DB.EVIDENCE, b"", Event)))
        assert store.map_size() > 64 * 1024  # the map grew across processes
    assert [seq for seq, _ in log] == list(range(1, 2 * count + 1))  # no gap, no duplicate
    for name in "ab":
        mine = [ev.at for _, ev in log if ev.kind == name]
        assert mine == [float(i) for i in range(count)]  # each writer's appends, in its order, once
        assert all(evidence[f"{name}-{i}".encode()].kind == name for i in range(count))
    kinds = "".join(ev.kind for _, ev in log)
    assert "ab" in kinds and "ba" in kinds  # the writers really ran at the same time


HOLDER = """
import sys, time
from keel.storage import Store
store = Store.open(sys.argv[1])
def hold(txn):
    print("reading", flush=True)
    time.sleep(60)
store.read(hold)
"""

KEEPER = """
import sys, time
from keel.storage import Store
store = Store.open(sys.argv[1])
print("open", flush=True)
time.sleep(60)
"""


def _reader_pids(path: Path) -> set[int]:
    env = raw_env(path)  # raw: opening a Store would clear the stale slots this test looks for
    try:
        lines = env.readers().splitlines()[1:]  # "pid thread txnid" rows after a header
    finally:
        env.close()
    return {int(line.split()[0]) for line in lines if line.strip()}


def test_stale_reader_slot_of_a_killed_process_is_cleared_on_open(tmp_path: Path) -> None:
    path = tmp_path / "s"
    Store.open(path).close()
    # A live process keeps the lock file in use, so LMDB does not reset the reader table by itself.
    keeper = _spawn(KEEPER, path)
    holder = _spawn(HOLDER, path)
    try:
        assert keeper.stdout is not None and keeper.stdout.readline().strip() == "open"
        assert holder.stdout is not None and holder.stdout.readline().strip() == "reading"
        assert holder.pid in _reader_pids(path)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert holder.pid in _reader_pids(path)  # the dead reader's slot is still taken
        with Store.open(path) as store:
            assert holder.pid not in store.reader_pids()
            store.write(lambda t: t.put(DB.META, b"after", Event(kind="x", at=time.time())))
    finally:
        for proc in (keeper, holder):
            proc.kill()
            proc.communicate(timeout=10)


GROWER = """
import os, sys, time
from keel.storage import Store
path, seconds = sys.argv[1], float(sys.argv[2])
with Store.open(path, map_size=64 * 1024) as store:
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # 64 KiB blobs: the file and its map grow all the time
        store.write(lambda t: t.put_object(os.urandom(64 * 1024)))
"""


def test_opening_a_store_another_process_is_growing_never_calls_it_damaged(tmp_path: Path) -> None:
    """Read-only opens (every `keel missions`, `keel status`, a language server) while a host commits: the
    file grows between the check of data.mdb and its meta page, and LMDB's map is resized under the open.
    Neither is damage: every open must succeed."""
    path = tmp_path / "store"
    Store.open(path, create=True).close()
    grower = subprocess.Popen([sys.executable, "-c", GROWER, str(path), "6"], stdout=subprocess.PIPE, text=True)
    assert grower.stdout is not None and grower.stdout.readline().strip() == "ready"
    opened, errors = 0, []
    while grower.poll() is None:
        try:
            with Store.open(path, readonly=True):
                opened += 1
        except Exception as exc:  # each is a failure of the test, collected to be shown
            errors.append(f"{type(exc).__name__}: {exc}")
    assert grower.returncode == 0
    size = (path / "data.mdb").stat().st_size
    assert size > 8 * 1024 * 1024, f"the store grew only to {size} bytes: the opens raced nothing"
    assert not errors, f"{len(errors)} of {opened + len(errors)} opens failed: {errors[:3]}"


def test_verifying_a_store_another_process_is_writing_finds_nothing_wrong(tmp_path: Path) -> None:
    """`keel verify` while a host commits: the page walk must not see pages a commit reuses under it, nor
    pages of a commit newer than the file size it took; every walk and every record read finds nothing."""
    path = tmp_path / "store"
    Store.open(path, create=True).close()
    grower = subprocess.Popen([sys.executable, "-c", GROWER, str(path), "6"], stdout=subprocess.PIPE, text=True)
    assert grower.stdout is not None and grower.stdout.readline().strip() == "ready"
    walks, found = 0, []
    while grower.poll() is None:
        found += verify_structure(path / "data.mdb")
        walks += 1
    assert grower.returncode == 0
    with Store.open(path, readonly=True) as store:
        report = verify_all(store)
    assert walks >= 5, f"only {walks} walks ran while the store was written"
    assert not found and report.ok, f"false damage in {walks} walks: {(found or report.problems)[:3]}"


FILLER = """
import os, sys
from keel.storage import Store
path, megabytes = sys.argv[1], int(sys.argv[2])
with Store.open(path, map_size=64 * 1024) as store:
    for _ in range(megabytes * 16):  # 64 KiB blobs: the map doubles as the data outgrows it
        store.write(lambda t: t.put_object(os.urandom(64 * 1024)))
    print(store.map_size(), flush=True)
"""


def test_verify_walks_a_store_whose_map_another_process_grew_after_verify_opened_it(tmp_path: Path) -> None:
    """A host grows the map between verify's opening the environment and its read transaction: LMDB
    refuses that transaction (MDB_MAP_RESIZED) until the environment adopts the new size; verify must
    adopt it and walk, never die with a traceback or report damage."""
    path = tmp_path / "store"
    Store.open(path, create=True).close()
    env = open_reader(path)
    try:
        opened_with = env.info()["map_size"]
        filler = subprocess.run(
            [sys.executable, "-c", FILLER, str(path), str(opened_with // (1024 * 1024) + 4)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert filler.returncode == 0, filler.stderr
        assert (path / "data.mdb").stat().st_size > opened_with  # the strike landed: data beyond verify's map
        assert walk_in_snapshot(env, path / "data.mdb") == []
    finally:
        env.close()
    with Store.open(path, readonly=True) as store:
        assert verify_all(store).ok
