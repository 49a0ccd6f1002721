"""One host per mission, on every machine that shares the store: a lease record with an epoch.

A host claims the mission's lease before it runs (a new epoch), heartbeats it, and checks its epoch at
the start of every write transaction (the journal writer's fence): once another host has claimed the
lease, the old host's writes raise `FencedHostError` and commit nothing, wherever it runs and however
long it was frozen or cut off. A lease is free when it was released, when its heartbeat is older than
its ttl by the store's clock (`Txn.clock()`: the database server's on PostgreSQL), or when the caller
knows its holder is dead (a host on this machine whose pid is gone: no need to wait out the ttl).

Stored in DB.LEASES under the mission id alone (units' leases are under `mission NUL unit`, so a scan of
a mission's unit leases never meets it). Knows nothing of processes.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from keel.protocol.errors import ErrorCode, KeelError
from keel.protocol.records import HostLease
from keel.storage.keys import DB
from keel.storage.txn import Txn


class HostLeaseHeldError(KeelError):
    """Another live host holds the mission's lease."""

    code = ErrorCode.USAGE

    def __init__(self, lease: HostLease, age_s: float) -> None:
        super().__init__(
            f"mission {lease.mission} is already running (host pid {lease.pid} on {lease.hostname or '?'}, "
            f"heard from {age_s:.1f} s ago); pause it with `keel pause {lease.mission}`"
        )
        self.lease = lease


class FencedHostError(KeelError):
    """This host's lease was claimed by another host: it must stop without writing anything more."""

    code = ErrorCode.INVALID_STATE


def _key(mission_id: str) -> bytes:
    return mission_id.encode()


def get(txn: Txn, mission_id: str) -> HostLease | None:
    return txn.get(DB.LEASES, _key(mission_id), HostLease)


def live(txn: Txn, mission_id: str) -> HostLease | None:
    """The mission's lease while its holder heartbeats (None: no host runs it anywhere)."""
    lease = get(txn, mission_id)
    if lease is None or txn.clock() - lease.heartbeat > lease.ttl_s:
        return None
    return lease


def claim(
    txn: Txn,
    mission_id: str,
    *,
    host_id: str,
    pid: int,
    hostname: str,
    ttl_s: float,
    dead: Callable[[HostLease], bool],
) -> HostLease:
    """The lease with the next epoch, unless a live host holds it (HostLeaseHeldError)."""
    old = get(txn, mission_id)
    now = txn.clock()
    if old is not None and now - old.heartbeat <= old.ttl_s and not dead(old):
        raise HostLeaseHeldError(old, now - old.heartbeat)
    lease = HostLease(
        mission=mission_id,
        epoch=(old.epoch + 1) if old else 1,
        host_id=host_id,
        pid=pid,
        hostname=hostname,
        heartbeat=now,
        ttl_s=ttl_s,
    )
    txn.put(DB.LEASES, _key(mission_id), lease)
    return lease


def check(txn: Txn, mission_id: str, epoch: int) -> HostLease:
    """The lease when `epoch` still holds it; else FencedHostError (the caller's write must not commit)."""
    lease = get(txn, mission_id)
    if lease is None or lease.epoch != epoch:
        holder = f"host pid {lease.pid} on {lease.hostname} (epoch {lease.epoch})" if lease else "nobody"
        raise FencedHostError(
            f"mission {mission_id}: this host's lease (epoch {epoch}) was taken over; it is held by {holder}. "
            "This host stops without writing anything more"
        )
    return lease


def beat(txn: Txn, mission_id: str, epoch: int) -> HostLease:
    lease = check(txn, mission_id, epoch)
    fresh = msgspec.structs.replace(lease, heartbeat=txn.clock())
    txn.put(DB.LEASES, _key(mission_id), fresh)
    return fresh


def release(txn: Txn, mission_id: str, epoch: int) -> None:
    """Give the lease up (a host that stops): the next host, on any machine, need not wait for its ttl."""
    lease = get(txn, mission_id)
    if lease is not None and lease.epoch == epoch:
        txn.put(DB.LEASES, _key(mission_id), msgspec.structs.replace(lease, heartbeat=0.0))  # the epoch stays
