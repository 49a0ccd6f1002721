"""Named databases and key layouts.

Ids (missions, units) never contain NUL, so `id NUL` is an unambiguous prefix; sequence numbers are
8-byte big-endian so keys sort in log order.
"""

from __future__ import annotations

import enum

SEQ_BYTES = 8


class DB(enum.StrEnum):
    META = "meta"  # schema version, store id
    MISSIONS = "missions"  # mission id -> MissionRecord
    HEADS = "heads"  # mission id -> checkpoint digest (HEAD)
    BLOBS = "blobs"  # digest -> bytes (content-addressed, written once)
    JOURNAL = "journal"  # mission NUL unit NUL seq -> JournalEntry
    EVENTS = "events"  # mission NUL seq -> Event
    EVIDENCE = "evidence"  # mission NUL seq -> Evidence
    CONTROL = "control"  # mission NUL seq -> Control
    POINTS = "points"  # mission NUL seq -> RestorePoint
    LEASES = "leases"  # mission NUL unit -> lease
    PROVIDERS = "providers"  # provider/endpoint -> health


def mission_prefix(mission_id: str) -> bytes:
    return mission_id.encode() + b"\x00"


def unit_prefix(mission_id: str, unit_id: str) -> bytes:
    return mission_id.encode() + b"\x00" + unit_id.encode() + b"\x00"


def log_key(prefix: bytes, seq: int) -> bytes:
    return prefix + seq.to_bytes(SEQ_BYTES, "big")
