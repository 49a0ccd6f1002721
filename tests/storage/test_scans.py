"""Prefix scans and logs on both backends: key order, both directions, `start`, pages of any size, and a
log's newest sequence number beside keys of other shapes under the same prefix."""

from __future__ import annotations

from keel.storage import DB, Store
from keel.storage.keys import log_key

N = 1100  # more than one page of every size a backend reads in (PostgreSQL: 8, 16, ... 512 rows)


def test_scans_and_logs_agree_with_key_order(store: Store) -> None:
    mine, other = b"m1\x00u1\x00", b"m1\x00u2\x00"

    def fill(txn: object) -> None:
        t = txn  # type: ignore[assignment]
        for n in range(1, N + 1):
            t.append(DB.JOURNAL, mine, n)
        for n in range(1, 4):
            t.append(DB.JOURNAL, other, -n)
        t.put(DB.JOURNAL, mine + b"zz-not-a-seq-key", 0)  # same prefix, another shape: never a sequence

    store.write(fill)  # type: ignore[arg-type]

    def look(txn: object) -> dict[str, object]:
        t = txn  # type: ignore[assignment]
        return {
            "forward": [k for k, _ in t.scan(DB.JOURNAL, mine, int)],
            "reverse": [k for k, _ in t.scan(DB.JOURNAL, mine, int, reverse=True)],
            "from": [v for _, v in t.scan(DB.JOURNAL, mine, int, start=log_key(mine, 1000))],
            "last": t.last_seq(DB.JOURNAL, mine),
            "last other": t.last_seq(DB.JOURNAL, other),
            "last none": t.last_seq(DB.JOURNAL, b"m9\x00u1\x00"),
            "log": [s for s, _ in t.read_log(DB.JOURNAL, mine, int, after=600, upto=1050)],
            "values": t.log_values(DB.JOURNAL, mine, int, after=600, upto=1050),
            "all values": t.log_values(DB.JOURNAL, mine, int),
            "values past the end": t.log_values(DB.JOURNAL, mine, int, after=N + 5, upto=N + 9),
            "values none": t.log_values(DB.JOURNAL, mine, int, upto=0),
            "all": sum(1 for _ in t.scan_raw(DB.JOURNAL, b"")),
        }

    seen = store.read(look)  # type: ignore[arg-type]
    keys = [log_key(mine, n) for n in range(1, N + 1)] + [mine + b"zz-not-a-seq-key"]
    assert seen["forward"] == keys
    assert seen["reverse"] == keys[::-1]
    assert seen["from"] == [*range(1000, N + 1), 0]
    assert (seen["last"], seen["last other"], seen["last none"]) == (N, 3, 0)
    assert seen["log"] == seen["values"] == list(range(601, 1051))
    assert seen["all values"] == list(range(1, N + 1))  # a key of another shape is no entry
    assert seen["values past the end"] == seen["values none"] == []
    assert seen["all"] == N + 1 + 3
