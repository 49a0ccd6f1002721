"""The lease operations' spec (storage/leases.py), on both backends: every write of a unit's lease is a
named operation that takes the epoch it acts on, writes what it says at that epoch, and at any other
(a lease replaced since, or none) raises StaleLeaseError and writes nothing. Like a checkpointer's
conformance suite, each operation is run through the same cases; the table names what each one writes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from keel.protocol.errors import InvalidTransitionError
from keel.protocol.records import Placement, UnitLease
from keel.protocol.states import LeaseState, Resolution
from keel.storage import Store, Txn, leases

M, U = "m1", "a"
TREE, BASE = "1" * 64, "2" * 64
PLACE = Placement(sandbox="/s/a", base="c" * 40, tree=TREE, base_tree=BASE, last_checkpoint=3, saved_at=2)

Op = Callable[[Txn, str, int], object]


def _here(txn: Txn, unit: str, epoch: int) -> UnitLease:
    """The unit's lease of `epoch` as a host that made its sandbox here names it."""
    held = leases.get(txn, M, unit) or UnitLease(unit=unit, lane=unit, epoch=epoch, host_id="h")
    return msgspec.structs.replace(held, epoch=epoch, place=msgspec.structs.replace(held.place, sandbox="/here/a"))


# name -> (the operation at an epoch, what it wrote: the lease after it, the lease before it -> bool)
OPERATIONS: dict[str, tuple[Op, Callable[[UnitLease, UnitLease], bool]]] = {
    "started": (
        lambda t, u, e: leases.started(t, M, u, e, pid=4242, hostname="build-7"),
        lambda after, before: (after.pid, after.hostname) == (4242, "build-7") and after.heartbeat >= before.heartbeat,
    ),
    "beat": (lambda t, u, e: leases.beat(t, M, u, e), lambda after, before: after.heartbeat > before.heartbeat),
    "recorded": (
        lambda t, u, e: leases.recorded(t, M, u, e, mark=9, tree="3" * 64, saved_at=7),
        lambda after, _: (after.place.last_checkpoint, after.place.tree, after.place.saved_at) == (9, "3" * 64, 7),
    ),
    "recorded, what it does not know left as it was": (
        lambda t, u, e: leases.recorded(t, M, u, e, mark=9),
        lambda after, before: (
            (after.place.last_checkpoint, after.place.tree, after.place.saved_at)
            == (9, before.place.tree, before.place.saved_at)
        ),
    ),
    "expire": (lambda t, u, e: leases.expire(t, M, u, e), lambda after, _: after.state == LeaseState.EXPIRED),
    "orphan": (lambda t, u, e: leases.orphan(t, M, u, e), lambda after, _: after.state == LeaseState.ORPHANED),
    "hand_back": (
        lambda t, u, e: leases.hand_back(t, M, u, e, "a question"),
        lambda after, _: (after.state, after.why) == (LeaseState.RETURNED, "a question"),
    ),
    "complete": (
        lambda t, u, e: leases.complete(t, M, u, e, result={"ok": 1}, commit="d" * 40, tree=TREE),
        lambda after, _: (after.state, after.place.result, after.place.commit) == ("done", {"ok": 1}, "d" * 40),
    ),
    "resolve": (
        lambda t, u, e: leases.resolve(t, M, u, e, Resolution.RERUN),
        lambda after, _: after.resolution == Resolution.RERUN,
    ),
    "resolved": (
        lambda t, u, e: leases.resolved(t, M, u, e, forget_tree=True),
        lambda after, _: (after.resolution, after.place.tree) == (Resolution.NONE, ""),
    ),
    "forget_tree": (lambda t, u, e: leases.forget_tree(t, M, u, e), lambda after, _: after.place.tree == ""),
    "carried": (lambda t, u, e: leases.carried(t, M, u, e), lambda after, _: after.place.base_tree == TREE),
    "mark_merged": (lambda t, u, e: leases.mark_merged(t, M, u, e), lambda after, _: after.place.merged),
    "moved": (
        lambda t, u, e: leases.moved(t, M, _here(t, u, e), fence=True),
        lambda after, before: (after.epoch, after.place.sandbox) == (before.epoch + 1, "/here/a"),
    ),
}
# what a finished run's lease still takes: a person's answer about it, its merge, its files carried or moved
AFTER_DONE = {"resolve", "resolved", "forget_tree", "carried", "mark_merged", "moved"}


def _grant(store: Store, unit: str = U) -> UnitLease:
    lease: UnitLease = store.write(lambda t: leases.grant(t, M, unit, lane=unit, host_id="h", ttl_s=5, place=PLACE))
    return lease


def _stored(store: Store, unit: str = U) -> UnitLease | None:
    return store.read(lambda t: leases.get(t, M, unit))


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_a_lease_operation(store: Store, name: str) -> None:
    """Each case on a unit of its own, in one store: the operation at its epoch writes what it says; at a
    stale epoch, one never granted, or on a unit without a lease it is refused and writes nothing; on a
    finished run's lease only what concerns its files is taken."""
    operation, wrote = OPERATIONS[name]
    before = _grant(store, "now")
    time.sleep(0.002)  # a heartbeat on the store's clock is later than the grant's
    store.write(lambda t: operation(t, "now", before.epoch))
    after = _stored(store, "now")
    assert after is not None and wrote(after, before), after

    old, current = _grant(store, "stale"), _grant(store, "stale")  # a new holder: the old epoch is fenced off
    for epoch in (old.epoch, current.epoch + 1):
        with pytest.raises(leases.StaleLeaseError, match=f"epoch {epoch}"):
            store.write(lambda t, e=epoch: operation(t, "stale", e))
        assert _stored(store, "stale") == current

    with pytest.raises(leases.StaleLeaseError):
        store.write(lambda t: operation(t, "none", 1))
    assert _stored(store, "none") is None

    held = _grant(store, "done")
    done = store.write(lambda t: leases.complete(t, M, "done", held.epoch, result="r", commit="", tree=TREE))
    if name in AFTER_DONE:
        store.write(lambda t: operation(t, "done", held.epoch))
        after = _stored(store, "done")
        assert after is not None and wrote(after, done) and after.place.result == "r"
    else:
        with pytest.raises(leases.StaleLeaseError, match="already completed"):
            store.write(lambda t: operation(t, "done", held.epoch))
        assert _stored(store, "done") == done


def test_a_lease_state_moves_only_along_its_table(store: Store) -> None:
    held = _grant(store)
    assert isinstance(store.write(lambda t: leases.orphan(t, M, U, held.epoch)).state, LeaseState)
    assert store.write(lambda t: leases.expire(t, M, U, held.epoch)).state == LeaseState.EXPIRED
    with pytest.raises(InvalidTransitionError, match="lease cannot go from expired to returned"):
        store.write(lambda t: leases.hand_back(t, M, U, held.epoch, "why"))
    assert _stored(store).state == LeaseState.EXPIRED  # type: ignore[union-attr]
    assert store.write(lambda t: leases.complete(t, M, U, held.epoch, result=1, commit="", tree="")).state == "done"


def test_completion_happens_once_and_only_at_the_current_epoch(store: Store) -> None:
    first, second = _grant(store), _grant(store)
    assert (first.epoch, second.epoch) == (1, 2)
    with pytest.raises(leases.StaleLeaseError, match="epoch 1 was taken over"):
        store.write(lambda t: leases.complete(t, M, U, 1, result="old", commit="", tree=""))
    store.write(lambda t: leases.complete(t, M, U, 2, result="new", commit="c", tree="t"))
    with pytest.raises(leases.StaleLeaseError, match="already completed"):
        store.write(lambda t: leases.complete(t, M, U, 2, result="again", commit="", tree=""))
    assert store.read(lambda t: leases.get(t, M, U)).place.result == "new"  # type: ignore[union-attr]


def test_expiry_is_judged_on_the_heartbeat_and_the_startup_allowance(store: Store) -> None:
    held = _grant(store)
    assert not leases.expired(held, held.heartbeat + 1)  # no worker reported yet: the start-up allowance
    assert leases.expired(held, held.heartbeat + leases.STARTUP_S + 6)
    started = store.write(lambda t: leases.started(t, M, U, held.epoch, pid=1234, hostname="h"))
    assert leases.expired(started, started.heartbeat + 6)
    orphaned = store.write(lambda t: leases.orphan(t, M, U, held.epoch))
    assert not leases.expired(orphaned, orphaned.heartbeat + 60)  # only a running lease expires


def test_carrying_a_unit_without_snapshots_writes_nothing(store: Store) -> None:
    store.write(lambda t: leases.grant(t, M, U, lane=U, host_id="h", ttl_s=5, place=Placement(tree="d")))
    assert not store.write(lambda t: leases.carried(t, M, U, 1))  # an outside agent's sandbox: no snapshot
    assert _stored(store).place == Placement(tree="d")  # type: ignore[union-attr]


# -- Placement.copied: a copy is said by its own field; a record of an older keel said it with base "copy" --
COPIES: list[tuple[Placement, bool, bool]] = [  # (stored placement, is a copy, a sandbox was made)
    (Placement(sandbox="/s", copied=True), True, True),
    (Placement(sandbox="/s", base="copy"), True, True),  # as older keels wrote it
    (Placement(sandbox="/s", base="c" * 40), False, True),  # a git worktree
    (Placement(sandbox="/s"), False, False),  # only named (a lost sandbox, a restore's lease)
]


@pytest.mark.parametrize(("place", "copy", "made"), COPIES)
def test_a_stored_placement_says_whether_its_sandbox_is_a_copy(
    store: Store, place: Placement, copy: bool, made: bool
) -> None:
    store.write(lambda t: leases.grant(t, M, U, lane=U, host_id="h", ttl_s=5, place=place))
    stored = _stored(store)
    assert stored is not None and (stored.place.is_copy(), stored.place.made()) == (copy, made)
    claimed = stored.place.started_in("/w/a", "")  # a worker's sandbox of the same lane is made as it was
    assert (claimed.is_copy(), claimed.base) == (copy, "")
    if copy:
        assert msgspec.json.decode(msgspec.json.encode(claimed), type=dict[str, Any]).get("base") is None


def test_the_copy_field_is_new_and_optional() -> None:
    """A placement without the field (every record before it) decodes as not copied."""
    old = msgspec.json.encode({"sandbox": "/s", "base": "c" * 40})
    assert msgspec.json.decode(old, type=Placement) == Placement(sandbox="/s", base="c" * 40, copied=False)
