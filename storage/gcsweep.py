"""Garbage collection carried out: the plan (`gc.plan_txn`, one read transaction: no lock) removed in short
write transactions, so that `keel gc` never holds the store's write lock for long.

Each transaction first looks at the root records written since the previous one and adds what they
reach to the live set (`gc.catch_up`: HEADs, restore points, units' leases, mission records; it walks only
what is not known live yet); then it removes the next steps of the plan, up to
`MOST_STEPS` or `BUDGET_S`, each judged as the store is now:

1. the restore points the policy drops (one that HEAD has moved to stays);
2. each mission's record change (`retired`, `start_tree`), made on the record as it is now, with the
   deletion of the checkpoints it retires; a checkpoint a write has named again since the plan keeps the
   chain whole: the record is left as it is and nothing of that chain goes;
3. the records of missions that no longer exist (not if the mission is back);
4. unreachable blobs not live by now, each before the blobs it names.

A blob unreachable at the plan's snapshot is named again only by a root record written later (a new
checkpoint reusing a file or folder blob, a restore or fork from a point being dropped, a lease's new
snapshot, an imported bundle), always in the same transaction as the blobs it writes or reuses; so every
blob removed was unreachable from every root at the moment it went, as in one transaction. The order of
(4) keeps every blob still in the store whole, for writers that reuse a folder blob that exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from keel.protocol.records import MissionRecord
from keel.storage import missions as m
from keel.storage.base import Store
from keel.storage.gc import GcPlan, GcReport, catch_up, deletion_order, plan_txn, retired_record, spare
from keel.storage.keys import DB
from keel.storage.txn import Txn

BUDGET_S = 0.05  # a write transaction stops taking steps once it has held the lock this long
MOST_STEPS = 20_000  # or after this many steps

Step = tuple[Callable[[Txn, Any, "_Done"], None], Any]  # what to do, and to what


class _Done(msgspec.Struct):
    """What one write transaction removed (counted into the report only once it committed)."""

    steps: int = 0
    blobs: int = 0
    bytes: int = 0
    points: list[str] = []
    records: int = 0
    spared: set[str] = set()


def collect(
    store: Store,
    *,
    keep_last: int | None = None,
    keep: tuple[str, ...] = (),
    dry_run: bool = False,
    budget_s: float = BUDGET_S,
    most: int = MOST_STEPS,
    planned: Callable[[GcPlan], object] | None = None,
) -> GcReport:
    """Collect the store's garbage; with `dry_run` only say what would go (one read transaction).
    `planned` is called between the plan and the first removal."""
    plan = store.read(lambda t: plan_txn(t, keep_last=keep_last, keep=keep))
    if dry_run:
        plan.report.dry_run = True
        return plan.report
    if planned is not None:
        planned(plan)
    return _Sweep(plan, budget_s, most).run(store)


class _Sweep:
    def __init__(self, plan: GcPlan, budget_s: float, most: int) -> None:
        self.plan = plan
        self.budget_s = budget_s
        self.most = max(1, most)
        self.steps: list[Step] = [
            *((self._point, point) for point in plan.points),
            *((self._retire, mission_id) for mission_id in plan.retire),
            *((self._orphan, record) for record in plan.orphans),
            # ordered here, outside the plan's read transaction (PostgreSQL ends one idle for 10 s)
            *((self._blob, digest) for digest in deletion_order(plan.blobs)),
        ]

    def run(self, store: Store) -> GcReport:
        report = GcReport(blobs_kept=self.plan.report.blobs_kept)
        spared: set[str] = set()
        at = 0
        while at < len(self.steps):
            began: list[float] = []
            done = store.write(partial(self._batch, at=at, began=began), whole=True)
            report.longest_txn_ms = max(report.longest_txn_ms, (time.monotonic() - began[-1]) * 1000)
            report.transactions += 1
            at += done.steps
            report.blobs_removed += done.blobs
            report.bytes_freed += done.bytes
            report.points_dropped += done.points
            report.orphan_records += done.records
            spared |= done.spared
        report.blobs_spared = len(spared)
        report.blobs_kept += len(spared)
        return report

    def _batch(self, txn: Txn, at: int, began: list[float]) -> _Done:
        """One write transaction: spare what the roots written since name, then the next steps. May run
        more than once (`Store.write`): it changes nothing of the sweep's but the live set, which only grows."""
        began.append(time.monotonic())
        catch_up(txn, self.plan)
        done = _Done()
        for n in range(at, min(len(self.steps), at + self.most)):
            step, what = self.steps[n]
            step(txn, what, done)
            done.steps += 1
            if time.monotonic() - began[-1] >= self.budget_s:
                break
        return done

    def _point(self, txn: Txn, point: tuple[str, bytes, str], done: _Done) -> None:
        name, key, checkpoint = point
        if m.head(txn, name.split(":", 1)[0]) == checkpoint:  # HEAD's point stays
            spare(txn, self.plan, [checkpoint], [])
        elif txn.delete(DB.POINTS, key):
            done.points.append(name)

    def _retire(self, txn: Txn, mission_id: str, done: _Done) -> None:
        change = self.plan.retire[mission_id]
        record = txn.get(DB.MISSIONS, mission_id.encode(), MissionRecord)
        if record is None or any(cut in self.plan.live for cut in change.cut):
            spare(txn, self.plan, list(change.cut), [])  # named again (a fork): the chain stays whole
            return
        m.put_mission(txn, retired_record(record, change))
        for digest in change.cut:
            self._blob(txn, digest, done)

    def _orphan(self, txn: Txn, record: tuple[DB, bytes], done: _Done) -> None:
        db, key = record
        if not txn.exists(DB.MISSIONS, key.split(b"\x00", 1)[0]) and txn.delete(db, key):
            done.records += 1

    def _blob(self, txn: Txn, digest: str, done: _Done) -> None:
        if digest in self.plan.live:
            done.spared.add(digest)
        elif txn.delete(DB.BLOBS, digest.encode()):
            done.blobs += 1
            done.bytes += self.plan.sizes.get(digest, 0)
