"""data.mdb's structure, read with plain reads: the check every open makes, and the page walk of `keel verify`.

Real stores in tmp_path, damaged the way disks and people damage them: truncated to a few sizes, emptied,
and single bits flipped over every page LMDB can reach. Nothing here lets LMDB map a damaged file in the
test process; what must go through LMDB runs as a `keel verify` subprocess.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.protocol.records import Event, JournalEntry
from keel.storage import DB, Store, StoreDamagedError
from keel.storage.keys import log_key, mission_prefix, unit_prefix
from keel.storage.lmdbfile import DataFile, FileDamage, PageHeader, newest
from keel.storage.lmdbwalk import _Walk, check_data_file, walk

PAGE = 4096


def _fill(path: Path) -> None:
    """Events, journal entries (rewritten and deleted, so pages are freed), blobs on overflow pages."""
    with Store.open(path) as store:

        def fill(t: object) -> None:
            txn = t  # type: ignore[assignment]
            for i in range(300):
                txn.append(DB.EVENTS, mission_prefix("m1"), Event(kind="e" * 40, at=float(i), message="y" * 200))
                txn.put(
                    DB.JOURNAL,
                    log_key(unit_prefix("m1", "u1"), i),
                    JournalEntry(seq=i, kind="tool/run", fingerprint="f" * 64, result={"out": "b" * 300}),
                )
                txn.put_blob(bytes([i % 256]) * 3000)

        store.write(fill)  # type: ignore[arg-type]
        for k in range(12):

            def churn(t: object, k: int = k) -> None:
                txn = t  # type: ignore[assignment]
                for i in range(k, 300, 5):
                    key = log_key(unit_prefix("m1", "u1"), i)
                    if k % 3 == 2:
                        txn.delete(DB.JOURNAL, key)
                    else:
                        txn.put(
                            DB.JOURNAL,
                            key,
                            JournalEntry(
                                seq=i, kind="tool/run", fingerprint="f" * 64, result={"out": "c" * (k * 97 % 2500)}
                            ),
                        )

            store.write(churn)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lmdbfile") / "store"
    _fill(path)
    return path


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target / "data.mdb"


def test_a_healthy_store_has_no_structural_problem(pristine: Path) -> None:
    data = pristine / "data.mdb"
    meta = check_data_file(data)
    assert walk(data) == []
    with DataFile(data) as f:
        probe = _Walk(f, newest(f.metas()))
        probe.run()
    kinds = {PageHeader.parse(data.read_bytes()[p * PAGE : p * PAGE + 16]).flags for p in probe.owner}
    assert kinds >= {0x01, 0x02, 0x04}, kinds  # branch, leaf and overflow pages were all walked
    assert probe.free and len(probe.owner) + len(probe.free) + 2 == meta.last_pg + 1


@pytest.mark.parametrize("size", ["empty", 8192, 16384, 40960, "one page short"])
def test_a_truncated_data_file_is_refused_before_lmdb_maps_it(pristine: Path, tmp_path: Path, size: object) -> None:
    data = _copy(pristine, tmp_path / "s")
    full = data.stat().st_size
    length = {"empty": 0, "one page short": full - PAGE}.get(str(size), size)
    assert isinstance(length, int)
    with open(data, "r+b") as f:
        f.truncate(length)
    with pytest.raises(FileDamage, match="truncated"):
        check_data_file(data)
    with pytest.raises(StoreDamagedError, match=f"the LMDB file is damaged: {data} is {length} bytes"):
        Store.open(data.parent)
    assert data.stat().st_size == length  # never re-initialised as an empty store
    problems = walk(data)
    assert problems and all("truncated" in p.message or "past the end" in p.message for p in problems[:1])


def _flip_offsets(data: Path) -> Iterator[tuple[str, int]]:
    """(kind, byte offset) over every reachable tree page: header bytes, node offsets, node headers, keys."""
    with DataFile(data) as f:
        probe = _Walk(f, newest(f.metas()))
        probe.run()
    raw = data.read_bytes()
    for pgno in sorted(probe.owner)[::2]:
        base = pgno * PAGE
        header = PageHeader.parse(raw[base : base + 16])
        yield from (("header", base + i) for i in (0, 1, 10, 12, 13, 14, 15))
        if header.flags not in (0x01, 0x02):
            continue  # an overflow page's body is a record's bytes: keel's seal covers them
        ptrs = [
            int.from_bytes(raw[base + 16 + 2 * i : base + 18 + 2 * i], "little")
            for i in range((header.lower - 16) // 2)
        ]
        for i, ptr in enumerate(ptrs[::3]):
            yield "node offset", base + 16 + 2 * 3 * i + (i % 2)
            yield "node header", base + ptr + (2, 4, 6)[i % 3]
            ksize = int.from_bytes(raw[base + ptr + 6 : base + ptr + 8], "little")
            if ksize:
                yield "key", base + ptr + 8 + (i * 7) % ksize


def _keel_verify(store: Path) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "verify", "--json", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 5), f"keel verify ended with {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow  # hundreds of page walks and a few `keel verify` processes
def test_single_bit_flips_over_reachable_pages_are_caught(pristine: Path, tmp_path: Path) -> None:
    data = _copy(pristine, tmp_path / "s")
    original = bytearray(data.read_bytes())
    caught: dict[str, list[bool]] = {}
    missed: list[tuple[str, int]] = []
    with open(data, "r+b") as f:
        for n, (kind, offset) in enumerate(_flip_offsets(data)):
            f.seek(offset)
            f.write(bytes([original[offset] ^ (1 << (n % 8))]))
            f.flush()
            found = bool(walk(data))
            caught.setdefault(kind, []).append(found)
            if not found:
                missed.append((kind, offset))
            f.seek(offset)
            f.write(bytes([original[offset]]))
    flips = sum(len(v) for v in caught.values())
    assert flips > 400
    rates = {kind: sum(v) / len(v) for kind, v in caught.items()}
    print(f"\nflips {flips}, caught by the page walk: " + ", ".join(f"{k} {r:.1%}" for k, r in rates.items()))
    structural = caught["header"] + caught["key"]
    print(f"headers and keys together: {sum(structural)}/{len(structural)} = {sum(structural) / len(structural):.1%}")
    assert sum(structural) / len(structural) >= 0.9, rates
    assert sum(sum(v) for v in caught.values()) / flips >= 0.9, rates
    # what the walk missed still must not pass `keel verify`, unless it is an unused byte (mp_pad)
    for kind, offset in missed[:: max(1, len(missed) // 8)]:
        data.write_bytes(bytes(original[:offset]) + bytes([original[offset] ^ 0x01]) + bytes(original[offset + 1 :]))
        code, report = _keel_verify(data.parent)
        assert code == 5 or offset % PAGE in (8, 9), (kind, offset, report)
