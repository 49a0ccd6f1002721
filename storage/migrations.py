"""Schema versions and forward migrations.

`MIGRATIONS[n]` moves a store from schema n to n+1 inside the single write transaction that opening the
store runs; a failure aborts it and leaves the store as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from keel.protocol.records import JournalEntry, UnitLease
from keel.storage.keys import DB

if TYPE_CHECKING:
    from keel.storage.txn import Txn

SCHEMA_VERSION = 3


class SchemaInfo(msgspec.Struct, frozen=True):
    version: int
    written_by: str = ""


def _from_0(txn: Txn) -> None:
    """Schema 0 is a store created before versioning; nothing to move."""


def _from_1(txn: Txn) -> None:
    """Schema 1 kept a person's answer to an uncertain effect in the journal entry's summary: "rerun-approved"
    on the intent, or "skipped" on the entry it became. Schema 2 types both (JournalEntry.rerun_approved,
    .skipped), and the summary is only words for people. One pass over every journal entry."""
    moved = []
    for key, entry in txn.scan(DB.JOURNAL, b"", JournalEntry):
        if entry.phase == "intent" and entry.summary == "rerun-approved" and not entry.rerun_approved:
            moved.append((key, msgspec.structs.replace(entry, rerun_approved=True)))
        elif entry.phase == "done" and entry.summary.startswith("skipped") and _said_skipped(entry.result):
            moved.append((key, msgspec.structs.replace(entry, skipped=True)))
    for key, entry in moved:
        txn.put(DB.JOURNAL, key, entry)


def _said_skipped(result: object) -> bool:
    output = result.get("output") if isinstance(result, dict) else None
    return isinstance(output, dict) and output.get("skipped") is True


# the fields of a schema 2 unit lease that schema 3 keeps in its `place` and its `offer`
_PLACEMENT_FIELDS = (
    "sandbox",
    "branch",
    "base",
    "tree",
    "base_tree",
    "last_checkpoint",
    "commit",
    "merged",
    "result",
    "ran_on",
)
_OFFER_FIELDS = ("worker", "spec", "why")
_FLAT_FIELDS = frozenset(_PLACEMENT_FIELDS + _OFFER_FIELDS)


def _from_2(txn: Txn) -> None:
    """Schema 2 kept a unit's lease as one flat record; schema 3 nests where the unit's files are
    (UnitLease.place) and its dealings with `keel worker`s (UnitLease.offer) in the same record. A host's
    lease (keyed by the mission id alone, storage/hostlease.py) is left as it is."""
    moved = []
    for key, flat in txn.scan(DB.LEASES, b"", dict):
        if b"\x00" in key and not flat.keys().isdisjoint(_FLAT_FIELDS):  # a lease already nested stays as it is
            moved.append((key, _nested_lease(flat)))
    for key, lease in moved:
        txn.put(DB.LEASES, key, lease)


def _nested_lease(flat: dict[str, Any]) -> UnitLease:
    """A schema 2 unit lease (its fields as stored) in the schema 3 form."""
    place = {name: flat.pop(name) for name in _PLACEMENT_FIELDS if name in flat}
    offer = {name: flat.pop(name) for name in _OFFER_FIELDS if name in flat}
    return msgspec.convert({**flat, "place": place, "offer": offer or None}, UnitLease)


MIGRATIONS: dict[int, Callable[[Txn], None]] = {0: _from_0, 1: _from_1, 2: _from_2}
