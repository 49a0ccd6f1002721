"""The subagent registry: one lease per (mission, unit) in DB.LEASES, with an epoch as fencing token.

Heartbeats and expiry use the store's clock (`Txn.clock()`: the database server's on PostgreSQL), so a
machine with a wrong clock can neither keep a dead worker's lease alive nor expire a live one.

Every write a subagent's work makes (journal entries, heartbeats, its completion) runs `check` in the
same transaction, so a worker whose lease was taken over (a new epoch granted) can never overwrite
newer work: its write raises `StaleLeaseError` and commits nothing. A lease changes only through the
named operations here, each of which says which epoch it acts on; nothing outside writes one
(tests/test_layering.py). Knows nothing of processes.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from keel.protocol.errors import ErrorCode, KeelError
from keel.protocol.records import Placement, UnitLease, WorkerOffer
from keel.protocol.spec import UnitSpec
from keel.protocol.states import LeaseState, Resolution, check_lease_transition
from keel.storage.keys import DB, mission_prefix, unit_prefix
from keel.storage.reach import silence
from keel.storage.txn import Txn


class StaleLeaseError(KeelError):
    """A write fenced by a lease epoch that is no longer the unit's current one."""

    code = ErrorCode.INVALID_STATE


def _key(mission_id: str, unit_id: str) -> bytes:
    return unit_prefix(mission_id, unit_id)[:-1]


def get(txn: Txn, mission_id: str, unit_id: str) -> UnitLease | None:
    return txn.get(DB.LEASES, _key(mission_id, unit_id), UnitLease)


def _put(txn: Txn, mission_id: str, lease: UnitLease) -> None:
    txn.put(DB.LEASES, _key(mission_id, lease.unit), lease)


def list_leases(txn: Txn, mission_id: str) -> list[UnitLease]:
    return [lease for _, lease in txn.scan(DB.LEASES, mission_prefix(mission_id), UnitLease)]


def grant(
    txn: Txn,
    mission_id: str,
    unit_id: str,
    *,
    lane: str,
    host_id: str,
    ttl_s: float,
    place: Placement | None = None,
    offer: WorkerOffer | None = None,
    state: LeaseState = LeaseState.RUNNING,
    hostname: str = "",
) -> UnitLease:
    """A new lease for the unit with the next epoch: every earlier holder is fenced off from now on."""
    old = get(txn, mission_id, unit_id)
    now = txn.clock()
    lease = UnitLease(
        unit=unit_id,
        lane=lane,
        epoch=(old.epoch + 1) if old else 1,
        host_id=host_id,
        state=state,
        hostname=hostname,
        heartbeat=now,
        started_at=now,
        ttl_s=ttl_s,
        place=place or Placement(),
        offer=offer,
    )
    _put(txn, mission_id, lease)
    return lease


def offer(
    txn: Txn,
    mission_id: str,
    unit_id: str,
    *,
    lane: str,
    host_id: str,
    ttl_s: float,
    spec: UnitSpec,
    place: Placement,
) -> UnitLease:
    """The unit offered to any `keel worker` under the next epoch (fencing every earlier holder)."""
    return grant(
        txn,
        mission_id,
        unit_id,
        lane=lane,
        host_id=host_id,
        ttl_s=ttl_s,
        place=place,
        offer=WorkerOffer(spec=spec),
        state=LeaseState.OFFERED,
    )


def claim(
    txn: Txn,
    mission_id: str,
    unit_id: str,
    epoch: int,
    *,
    worker: str,
    hostname: str,
    ttl_s: float,
    sandbox: str,
    base: str,
) -> UnitLease:
    """A worker takes an offered unit: still offered at `epoch`, it is granted to `worker` (its sandbox
    there: `sandbox`, started from `base`) under the next epoch, keeping the lane, its snapshots and journal
    mark; else StaleLeaseError (another took it, or the host withdrew it)."""
    current = get(txn, mission_id, unit_id)
    if current is None or current.epoch != epoch or current.state != LeaseState.OFFERED:
        raise StaleLeaseError(f"mission {mission_id} unit {unit_id}: the offer of epoch {epoch} is no longer open")
    place = current.place.started_in(sandbox, base)
    return grant(
        txn,
        mission_id,
        unit_id,
        lane=current.lane,
        host_id=worker,
        ttl_s=ttl_s,
        place=place,
        offer=WorkerOffer(worker=worker, spec=current.offer.spec if current.offer else None),
        hostname=hostname,
    )


def offers(txn: Txn, mission_ids: list[str]) -> list[tuple[str, UnitLease]]:
    """The units of these missions offered to workers, as (mission id, lease)."""
    found = [(mission_id, lease) for mission_id in mission_ids for lease in list_leases(txn, mission_id)]
    return [(mission_id, lease) for mission_id, lease in found if lease.state == LeaseState.OFFERED]


def check(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> UnitLease:
    """The current lease when `epoch` still holds it (and it is not finished); else StaleLeaseError."""
    lease = get(txn, mission_id, unit_id)
    if lease is None or lease.epoch != epoch:
        now = lease.epoch if lease else 0
        raise StaleLeaseError(
            f"mission {mission_id} unit {unit_id}: lease epoch {epoch} was taken over "
            f"(current epoch {now}); this worker's write is rejected"
        )
    if lease.state == LeaseState.DONE:
        raise StaleLeaseError(f"mission {mission_id} unit {unit_id}: epoch {epoch} already completed")
    return lease


def update(
    txn: Txn, mission_id: str, unit_id: str, epoch: int, *, place: dict[str, Any] | None = None, **changes: object
) -> UnitLease:
    """A fenced change of the holder's own lease (heartbeat, pid, state; `place`: fields of its placement,
    such as the tree digest and journal mark); the one place a lease's state moves
    (protocol/states.LEASE_TRANSITIONS; an illegal move raises)."""
    current = check(txn, mission_id, unit_id, epoch)
    state = changes.get("state")
    if state is not None:
        changes["state"] = new = LeaseState(str(state))
        check_lease_transition(current.state, new)
    if place:
        changes["place"] = msgspec.structs.replace(current.place, **place)
    lease = msgspec.structs.replace(current, **changes)
    _put(txn, mission_id, lease)
    return lease


def hand_back(txn: Txn, mission_id: str, unit_id: str, epoch: int, why: str) -> UnitLease:
    """The worker holding the unit at `epoch` returns it to its mission host, saying `why`."""
    held = check(txn, mission_id, unit_id, epoch)
    offer = msgspec.structs.replace(held.offer or WorkerOffer(), why=why)
    return update(txn, mission_id, unit_id, epoch, state=LeaseState.RETURNED, offer=offer, heartbeat=txn.clock())


def _current(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> UnitLease | None:
    """The unit's lease if it is still of `epoch` (finished or not), else None: an operation on a lease
    that was since replaced does nothing."""
    lease = get(txn, mission_id, unit_id)
    return lease if lease is not None and lease.epoch == epoch else None


def moved(txn: Txn, mission_id: str, here: UnitLease, *, fence: bool) -> bool:
    """The unit's lease after its sandbox was made on this machine (`here` names it and its holder), if the
    lease is still of `here.epoch`; under the next epoch when `fence`, so that whoever held it elsewhere
    can neither heartbeat nor complete it. False when it was replaced meanwhile."""
    if _current(txn, mission_id, here.unit, here.epoch) is None:
        return False
    _put(txn, mission_id, msgspec.structs.replace(here, epoch=here.epoch + 1) if fence else here)
    return True


def reopen(
    txn: Txn, mission_id: str, unit_id: str, *, lane: str, tree: str, base_tree: str, checkpoint: int, why: str
) -> UnitLease:
    """A restore reopened the unit on a new lane: a lease under the next epoch, held by nobody (orphaned),
    naming the point's snapshots of its sandbox (the resuming host makes the sandbox from them), or none
    with `why` there is none."""
    old = get(txn, mission_id, unit_id)
    lease = UnitLease(
        unit=unit_id,
        lane=lane,
        epoch=(old.epoch if old else 0) + 1,
        host_id="",
        state=LeaseState.ORPHANED,
        place=Placement(tree=tree, base_tree=base_tree, last_checkpoint=checkpoint),
        offer=WorkerOffer(why=why) if why else None,
    )
    _put(txn, mission_id, lease)
    return lease


def resolve(txn: Txn, mission_id: str, unit_id: str, resolution: Resolution) -> None:
    """A person's answer about the unit's run, kept on its current lease until its host acts on it."""
    lease = get(txn, mission_id, unit_id)
    if lease is not None:
        _put(txn, mission_id, msgspec.structs.replace(lease, resolution=resolution))


def resolved(txn: Txn, mission_id: str, unit_id: str, epoch: int, *, forget_tree: bool = False) -> None:
    """The answer on the lease of `epoch` was acted on: cleared. `forget_tree`: the sandbox as it is becomes
    the lane's reference (a person's "continue")."""
    lease = _current(txn, mission_id, unit_id, epoch)
    if lease is not None:
        place = msgspec.structs.replace(lease.place, tree="") if forget_tree else lease.place
        _put(txn, mission_id, msgspec.structs.replace(lease, resolution=Resolution.NONE, place=place))


def forget_tree(txn: Txn, mission_id: str, unit_id: str, lane: str) -> None:
    """The digest of the sandbox on the unit's lease of `lane` is no longer known (a person said an effect
    in doubt had happened: whatever it left is in the sandbox, unrecorded); recovery takes the sandbox as
    it is instead of mistaking the effect's files for tampering."""
    lease = get(txn, mission_id, unit_id)
    if lease is not None and lease.lane == lane and lease.place.tree:
        _put(txn, mission_id, msgspec.structs.replace(lease, place=msgspec.structs.replace(lease.place, tree="")))


def carried(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> bool:
    """The unit's work up to its lease's snapshot is in the mission sandbox (an export carried it): that
    snapshot becomes the one its sandbox started from, so that its later work merges onto what was carried
    wherever its sandbox is made from the store (a restore to a point from now on, a move, a worker).
    False when the lease was replaced meanwhile or names no snapshot (an outside agent's sandbox)."""
    lease = _current(txn, mission_id, unit_id, epoch)
    if lease is None or not lease.place.kept():
        return False
    place = msgspec.structs.replace(lease.place, base_tree=lease.place.tree)
    _put(txn, mission_id, msgspec.structs.replace(lease, place=place))
    return True


def mark_merged(txn: Txn, mission_id: str, unit_id: str) -> None:
    """The unit's files are in the mission's sandbox (written with the checkpoint that merged them)."""
    lease = get(txn, mission_id, unit_id)
    if lease is not None and not lease.place.merged:
        _put(txn, mission_id, msgspec.structs.replace(lease, place=msgspec.structs.replace(lease.place, merged=True)))


def complete(
    txn: Txn, mission_id: str, unit_id: str, epoch: int, *, result: object, commit: str, tree: str
) -> UnitLease:
    """The unit's completion, exactly once: only the current epoch may record it, only once."""
    return update(
        txn,
        mission_id,
        unit_id,
        epoch,
        state=LeaseState.DONE,
        place={"result": result, "commit": commit, "tree": tree},
        heartbeat=txn.clock(),
    )


STARTUP_S = 15.0  # a worker that has not reported its pid yet is still starting (imports, git worktree)


def expired(lease: UnitLease, now: float | None = None, since: float = 0.0) -> bool:
    """A running lease whose heartbeat is older than its ttl (or than the start-up allowance); `now` is
    the store's clock (`Txn.clock()`), read in the transaction that read the lease. Silence counts only from
    `since`, the store's clock since which the judge has reached the store without a gap (reach.py)."""
    allowed = lease.ttl_s if lease.pid else max(lease.ttl_s, STARTUP_S)
    return lease.state == LeaseState.RUNNING and silence(lease.heartbeat, now or time.time(), since) > allowed
