"""Per-mission wake-ups on PostgreSQL: a commit's NOTIFY names the missions and databases it changed, and a
subscriber for one mission (and some of its databases) is woken by those commits only; a subscriber for no
mission in particular by every commit. A waiting host is then not woken by every other mission's writes. And
a store's connection pool shrinks back to one connection at rest."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from keel.protocol.records import Control
from keel.storage import Store, Txn, leases
from keel.storage.keys import DB, mission_prefix
from keel.storage.missions import CONTROL_CHANGES, change_token
from keel.storage.pg import PgStore
from tests.pgserver import PgServer


def _control_key(mission: str) -> bytes:
    return mission_prefix(mission) + (1).to_bytes(8, "big")


class _Woken:
    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()


def test_a_subscriber_is_woken_by_its_missions_changes_only(tmp_path: Path, pg_server: PgServer) -> None:
    with Store.open(pg_server.store_folder(tmp_path / "store")) as store:
        controls_of_a, anything_of_a, everything = _Woken(), _Woken(), _Woken()
        store.subscribe(controls_of_a, mission="a", dbs=(CONTROL_CHANGES,))
        store.subscribe(anything_of_a, mission="a")
        store.subscribe(everything)
        deadline = time.monotonic() + 10
        while not everything.event.is_set() and time.monotonic() < deadline:  # the listener's first call
            time.sleep(0.01)
        for woken in (controls_of_a, anything_of_a, everything):
            woken.count = 0
            woken.event.clear()

        def settle(commits: int) -> None:  # notices come in commit order: the last one seen, all were
            store.write(lambda t: t.put_blob(b"settle %d" % time.monotonic_ns()))  # a commit of no mission's
            deadline = time.monotonic() + 10
            while everything.count < commits and time.monotonic() < deadline:
                time.sleep(0.01)
            assert everything.count == commits

        store.write(lambda t: t.put(DB.CONTROL, _control_key("b"), Control(action="pause", at=time.time())))
        store.write(lambda t: leases.grant(t, "a", "u1", lane="u1", host_id="h", ttl_s=5))
        settle(3)
        assert controls_of_a.count == 0  # another mission's control; this mission's lease; no mission's blob
        assert anything_of_a.count == 1  # this mission's lease
        store.write(lambda t: t.put(DB.CONTROL, _control_key("a"), Control(action="pause", at=time.time())))
        settle(5)
        assert controls_of_a.count == 1 and anything_of_a.count == 2


def test_change_tokens() -> None:
    assert change_token(DB.CONTROL, b"m1\x00" + bytes(8)) == "control/m1"
    assert change_token(DB.LEASES, b"m1\x00u1") == "leases/m1"
    assert change_token(DB.LEASES, b"m1") == "hostlease/m1"  # the host lease: the mission id alone
    assert change_token(DB.MISSIONS, b"m1") == "missions/m1"
    assert change_token(DB.BLOBS, b"ab" * 32) is None


def test_a_store_at_rest_holds_one_pooled_connection_however_busy_it_was(tmp_path: Path, pg_server: PgServer) -> None:
    with Store.open(pg_server.store_folder(tmp_path / "store")) as store:
        assert isinstance(store, PgStore)
        store.linger_s, store.most = 0.5, 6
        inside = threading.Barrier(6, timeout=60)  # every read holds its connection until all six do

        def read_at_once() -> None:
            store.read(lambda t: t.get_raw(DB.META, b"nothing") or inside.wait())

        threads = [threading.Thread(target=read_at_once) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        mine = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        with pg_server.connect() as admin:
            busy = admin.execute(mine, (store.application,)).fetchone()
            assert busy is not None and busy[0] >= 6  # the burst had a connection each
            time.sleep(0.6)
            store.read(lambda t: t.get_raw(DB.META, b"nothing"))  # at rest, a read now and then
            deadline = time.monotonic() + 10
            while (rest := admin.execute(mine, (store.application,)).fetchone()) and rest[0] > 1:
                assert time.monotonic() < deadline, rest
                time.sleep(0.05)


def test_a_process_uses_at_most_its_pools_connections_at_once(tmp_path: Path, pg_server: PgServer) -> None:
    """Twelve threads reading at once (a process hosting many missions) share the pool's `most` connections:
    the others wait for one to be given back, and every read is made."""
    with Store.open(pg_server.store_folder(tmp_path / "store")) as store:
        assert isinstance(store, PgStore)
        store.most = 3
        lock, inside, most_inside = threading.Lock(), [0], [0]

        def read_slowly(txn: Txn) -> int:
            with lock:
                inside[0] += 1
                most_inside[0] = max(most_inside[0], inside[0])
            time.sleep(0.1)
            with lock:
                inside[0] -= 1
            return 1

        with ThreadPoolExecutor(12) as pool:
            made = list(pool.map(lambda _: store.read(read_slowly), range(24)))
        assert made == [1] * 24
        assert most_inside[0] == 3
        mine = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        with pg_server.connect() as admin:
            row = admin.execute(mine, (store.application,)).fetchone()
            assert row is not None and row[0] <= 3 + 1  # the pool's and, had anything subscribed, its listener's
