"""The lease registry on a real LMDB file: epochs fence writes, completion happens exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from keel.protocol.errors import InvalidTransitionError
from keel.protocol.records import Placement
from keel.protocol.states import LeaseState
from keel.storage import Store, leases

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def test_a_new_grant_fences_the_old_epoch_and_completion_happens_once(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        first = store.write(lambda t: leases.grant(t, "m1", "a", lane="a", host_id="h1", ttl_s=5))
        second = store.write(lambda t: leases.grant(t, "m1", "a", lane="a", host_id="h2", ttl_s=5))
        assert (first.epoch, second.epoch) == (1, 2)
        with pytest.raises(leases.StaleLeaseError, match="epoch 1 was taken over"):
            store.write(lambda t: leases.complete(t, "m1", "a", 1, result="old", commit="", tree=""))
        done = store.write(lambda t: leases.complete(t, "m1", "a", 2, result="new", commit="c", tree="t"))
        assert (done.state, done.place.result) == ("done", "new")
        with pytest.raises(leases.StaleLeaseError, match="already completed"):
            store.write(lambda t: leases.complete(t, "m1", "a", 2, result="again", commit="", tree=""))
        assert store.read(lambda t: leases.get(t, "m1", "a")).place.result == "new"  # nothing overwritten


def test_expiry_and_the_registry_listing(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        for unit in ("a", "b"):
            store.write(lambda t, u=unit: leases.grant(t, "m1", u, lane=u, host_id="h", ttl_s=0.2))
        store.write(lambda t: leases.grant(t, "m2", "a", lane="a", host_id="h", ttl_s=0.2))
        listed = store.read(lambda t: leases.list_leases(t, "m1"))
        assert [x.unit for x in listed] == ["a", "b"]
        assert not any(leases.expired(x) for x in listed)
        assert not any(leases.expired(x, time.time() + 1) for x in listed)  # no worker reported yet
        assert all(leases.expired(x, time.time() + leases.STARTUP_S + 1) for x in listed)
        store.write(lambda t: leases.update(t, "m1", "b", 1, pid=1234))
        assert leases.expired(store.read(lambda t: leases.get(t, "m1", "b")), time.time() + 1)
        store.write(lambda t: leases.update(t, "m1", "a", 1, state="orphaned"))
        assert not leases.expired(store.read(lambda t: leases.get(t, "m1", "a")), time.time() + 1)


def test_a_lease_state_moves_only_along_its_table(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        store.write(lambda t: leases.grant(t, "m1", "a", lane="a", host_id="h", ttl_s=5))
        orphaned = store.write(lambda t: leases.update(t, "m1", "a", 1, state="orphaned"))
        assert orphaned.state == LeaseState.ORPHANED and isinstance(orphaned.state, LeaseState)
        with pytest.raises(InvalidTransitionError, match="lease cannot go from orphaned to running"):
            store.write(lambda t: leases.update(t, "m1", "a", 1, state="running"))
        stored = store.read(lambda t: leases.get(t, "m1", "a"))
        assert stored.state == "orphaned" and msgspec.json.encode(stored.state) == b'"orphaned"'


def test_a_carried_unit_starts_from_its_snapshot_at_the_mark(tmp_path: Path) -> None:
    """After an export carried a unit's work into the mission sandbox, its lease names the snapshot at its
    mark as the one it started from; a lease replaced since, or one without snapshots, is left as it is."""
    tree, base = "1" * 64, "2" * 64
    place = Placement(sandbox="/s", tree=tree, base_tree=base, last_checkpoint=4)
    with Store.open(tmp_path / "store") as store:
        store.write(lambda t: leases.grant(t, "m1", "a", lane="a", host_id="h", ttl_s=5, place=place))
        assert store.write(lambda t: leases.carried(t, "m1", "a", 1))
        moved = store.read(lambda t: leases.get(t, "m1", "a")).place
        assert moved == msgspec.structs.replace(place, base_tree=tree)
        assert not store.write(lambda t: leases.carried(t, "m1", "a", 2))  # no such epoch: nothing written
        store.write(lambda t: leases.grant(t, "m1", "b", lane="b", host_id="h", ttl_s=5, place=Placement(tree="d")))
        assert not store.write(lambda t: leases.carried(t, "m1", "b", 1))  # an outside agent's: no snapshot
        assert store.read(lambda t: leases.get(t, "m1", "b")).place == Placement(tree="d")
