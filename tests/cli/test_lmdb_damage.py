"""Random bytes over the data pages of data.mdb: `keel verify` reports damage (exit 5), never crashes or hangs.

LMDB keeps no page checksums, and a damaged B-tree can make it abort the process; `keel verify` walks the
store in a child process, so what a user sees is always a report. Seeds are fixed, so runs repeat.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from keel.protocol.records import Event, JournalEntry
from keel.storage import DB, Store
from keel.storage.keys import log_key, mission_prefix, unit_prefix

PAGE = 4096
SEEDS = range(24)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("pristine") / "store"
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
    records = _verify(path)[1]["records"]
    return path, records


def _verify(path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "verify", "--json", "--store", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, json.loads(proc.stdout) if proc.stdout else {}


def _damage(path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    data = bytearray((path / "data.mdb").read_bytes())
    pages = len(data) // PAGE
    for _ in range(rnd.randint(1, 8)):  # pages 0 and 1 are LMDB's meta pages; the rest hold data
        offset = rnd.randrange(2, pages) * PAGE + rnd.randrange(PAGE)
        size = min(rnd.choice([1, 8, 64, PAGE]), len(data) - offset)
        data[offset : offset + size] = rnd.randbytes(size)
    (path / "data.mdb").write_bytes(bytes(data))


def test_random_bytes_over_data_pages_never_crash_or_hang_verify(pristine: tuple[Path, int], tmp_path: Path) -> None:
    source, records = pristine

    def one(seed: int) -> tuple[int, int, str, dict[str, object]]:
        path = tmp_path / f"seed{seed}"
        shutil.copytree(source, path)
        _damage(path, seed)
        proc, report = _verify(path)
        return seed, proc.returncode, proc.stderr, report

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, SEEDS))
    for seed, code, stderr, report in results:
        assert code in (0, 5), f"seed {seed}: exit {code}: {stderr}"
        assert stderr == "", f"seed {seed}: {stderr}"
        if code == 5:
            assert report["problems"] and not report["ok"]
        else:  # the bytes hit unused space: then every record is still there and verifies
            assert report["records"] == records, f"seed {seed}: a clean report that lost records"
    assert sum(code == 5 for _, code, _, _ in results) >= len(SEEDS) * 3 // 4
