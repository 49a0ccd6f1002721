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
    lease = _held(txn, mission_id, unit_id, epoch)
    if lease.state == LeaseState.DONE:
        raise StaleLeaseError(f"mission {mission_id} unit {unit_id}: epoch {epoch} already completed")
    return lease


def _held(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> UnitLease:
    """The unit's lease if it is still of `epoch`, finished or not; else StaleLeaseError (it was replaced)."""
    lease = get(txn, mission_id, unit_id)
    if lease is None or lease.epoch != epoch:
        now = lease.epoch if lease else 0
        raise StaleLeaseError(
            f"mission {mission_id} unit {unit_id}: lease epoch {epoch} was taken over "
            f"(current epoch {now}); this write is rejected"
        )
    return lease


def _write(txn: Txn, mission_id: str, lease: UnitLease, state: LeaseState | None = None, **changes: Any) -> UnitLease:
    """`lease` with `changes` (and its state moved to `state`: protocol/states.LEASE_TRANSITIONS; an illegal
    move raises), stored."""
    if state is not None:
        check_lease_transition(lease.state, state)
        changes["state"] = state
    changed = msgspec.structs.replace(lease, **changes)
    _put(txn, mission_id, changed)
    return changed


def started(txn: Txn, mission_id: str, unit_id: str, epoch: int, *, pid: int, hostname: str) -> UnitLease:
    """The worker process of the lease of `epoch` runs: its pid and machine, and its first heartbeat."""
    return _write(
        txn, mission_id, check(txn, mission_id, unit_id, epoch), pid=pid, hostname=hostname, heartbeat=txn.clock()
    )


def beat(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> UnitLease:
    """A heartbeat of the lease of `epoch`, on the store's clock."""
    return _write(txn, mission_id, check(txn, mission_id, unit_id, epoch), heartbeat=txn.clock())


def recorded(
    txn: Txn, mission_id: str, unit_id: str, epoch: int, *, mark: int, tree: str | None = None, saved_at: int = -1
) -> UnitLease:
    """A journal entry of the lease of `epoch` was written (in this transaction: the entry's fence): the lane's
    high-water mark `mark`; `tree`, the snapshot of its sandbox after it, when the entry changed files
    ("" when nothing holds it: an outside agent's sandbox; None leaves the last one); `saved_at`, the
    lane's newest done `state/save` entry (-1: not known to the writer, the last one stays)."""
    held = check(txn, mission_id, unit_id, epoch)
    place = msgspec.structs.replace(held.place, last_checkpoint=mark)
    if saved_at >= 0:
        place = msgspec.structs.replace(place, saved_at=saved_at)
    if tree is not None:
        place = msgspec.structs.replace(place, tree=tree)
    return _write(txn, mission_id, held, place=place)


def expire(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> UnitLease:
    """The lease of `epoch` is taken from its holder: its heartbeat went silent, or its host withdrew an
    offer nobody took."""
    return _write(txn, mission_id, check(txn, mission_id, unit_id, epoch), LeaseState.EXPIRED)


def orphan(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> UnitLease:
    """The worker of the lease of `epoch` saw its parent die and stopped."""
    held = check(txn, mission_id, unit_id, epoch)
    return _write(txn, mission_id, held, LeaseState.ORPHANED, heartbeat=txn.clock())


def hand_back(txn: Txn, mission_id: str, unit_id: str, epoch: int, why: str) -> UnitLease:
    """The worker holding the unit at `epoch` returns it to its mission host, saying `why`."""
    held = check(txn, mission_id, unit_id, epoch)
    offer = msgspec.structs.replace(held.offer or WorkerOffer(), why=why)
    return _write(txn, mission_id, held, LeaseState.RETURNED, offer=offer, heartbeat=txn.clock())


def complete(
    txn: Txn, mission_id: str, unit_id: str, epoch: int, *, result: object, commit: str, tree: str
) -> UnitLease:
    """The unit's completion, exactly once: only the current epoch may record it, only once."""
    held = check(txn, mission_id, unit_id, epoch)
    place = msgspec.structs.replace(held.place, result=result, commit=commit, tree=tree)
    return _write(txn, mission_id, held, LeaseState.DONE, place=place, heartbeat=txn.clock())


def moved(txn: Txn, mission_id: str, here: UnitLease, *, fence: bool) -> UnitLease:
    """The unit's lease after its sandbox was made on this machine (`here` names it and its holder), if the
    lease is still of `here.epoch`; under the next epoch when `fence`, so that whoever held it elsewhere
    can neither heartbeat nor complete it. StaleLeaseError when it was replaced meanwhile."""
    _held(txn, mission_id, here.unit, here.epoch)
    lease = msgspec.structs.replace(here, epoch=here.epoch + 1) if fence else here
    _put(txn, mission_id, lease)
    return lease


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


def resolve(txn: Txn, mission_id: str, unit_id: str, epoch: int, resolution: Resolution) -> UnitLease:
    """A person's answer about the run of the lease of `epoch`, kept on it until its host acts on it."""
    return _write(txn, mission_id, _held(txn, mission_id, unit_id, epoch), resolution=resolution)


def resolved(txn: Txn, mission_id: str, unit_id: str, epoch: int, *, forget_tree: bool = False) -> UnitLease:
    """The answer on the lease of `epoch` was acted on: cleared. `forget_tree`: the sandbox as it is becomes
    the lane's reference (a person's "continue")."""
    held = _held(txn, mission_id, unit_id, epoch)
    place = msgspec.structs.replace(held.place, tree="") if forget_tree else held.place
    return _write(txn, mission_id, held, resolution=Resolution.NONE, place=place)


def forget_tree(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> UnitLease:
    """The digest of the sandbox on the lease of `epoch` is no longer known (a person said an effect in
    doubt had happened: whatever it left is in the sandbox, unrecorded); recovery takes the sandbox as it
    is instead of mistaking the effect's files for tampering."""
    held = _held(txn, mission_id, unit_id, epoch)
    return _write(txn, mission_id, held, place=msgspec.structs.replace(held.place, tree=""))


def carried(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> bool:
    """The unit's work up to the snapshot of the lease of `epoch` is in the mission sandbox (an export
    carried it): that snapshot becomes the one its sandbox started from, so that its later work merges onto
    what was carried wherever its sandbox is made from the store (a restore to a point from now on, a move,
    a worker). False when the lease names no snapshot (an outside agent's sandbox)."""
    held = _held(txn, mission_id, unit_id, epoch)
    if not held.place.kept():
        return False
    _write(txn, mission_id, held, place=msgspec.structs.replace(held.place, base_tree=held.place.tree))
    return True


def mark_merged(txn: Txn, mission_id: str, unit_id: str, epoch: int) -> UnitLease:
    """The files of the run of the lease of `epoch` are in the mission's sandbox (written with the
    checkpoint that merged them)."""
    held = _held(txn, mission_id, unit_id, epoch)
    return _write(txn, mission_id, held, place=msgspec.structs.replace(held.place, merged=True))


STARTUP_S = 15.0  # a worker that has not reported its pid yet is still starting (imports, git worktree)


def expired(lease: UnitLease, now: float | None = None, since: float = 0.0) -> bool:
    """A running lease whose heartbeat is older than its ttl (or than the start-up allowance); `now` is
    the store's clock (`Txn.clock()`), read in the transaction that read the lease. Silence counts only from
    `since`, the store's clock since which the judge has reached the store without a gap (reach.py)."""
    allowed = lease.ttl_s if lease.pid else max(lease.ttl_s, STARTUP_S)
    return lease.state == LeaseState.RUNNING and silence(lease.heartbeat, now or time.time(), since) > allowed
