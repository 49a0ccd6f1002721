"""`keel gc` while other processes write: it holds the store's write lock only briefly at a time, so their
writes never wait long, and what they name again while it runs (a sandbox put back to a dropped point's
files, a restore to a point being dropped, a fork from the checkpoint where retention cuts the chain)
stays whole: `keel verify` passes and every blob a root reaches is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keel.server.engine.files.trees import Snapshotter
from keel.storage import Store
from keel.storage import missions as m
from tests.bundles.kit import keel, ok, read, wait_for
from tests.storage.gckit import checkpoint, files_at, grow, long_history, missing_blobs, strays, write_files

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

FILES, CHANGES, CHECKPOINTS = 40, 6, 8
LOCK_TIMEOUT_S = 1.0  # the other process's patience for the write lock


def _writer(tmp_path: Path, sandbox: Path, versions: int) -> tuple[subprocess.Popen[str], Path, Path]:
    """Another process writing until told to stop (tests/storage/gckit.keep_writing)."""
    stop, out = tmp_path / "stop-writing", tmp_path / "writer.json"
    store = tmp_path / "store"
    args = [str(store), str(sandbox), str(stop), str(out), str(FILES), str(CHANGES), str(versions)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.gckit", *args],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "KEEL_WRITE_LOCK_TIMEOUT_S": str(LOCK_TIMEOUT_S)},
        text=True,
    )
    return proc, stop, out


def _stopped(proc: subprocess.Popen[str], stop: Path, out: Path) -> dict[str, float]:
    stop.touch()
    assert proc.wait(timeout=60) == 0
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_what_writes_name_again_while_gc_runs_stays_whole(tmp_path: Path, backend: str) -> None:
    """Between gc's plan and its removals: a restore of m0 to a point being dropped, a fork from the
    checkpoint where gc cuts m0's chain, m0's sandbox put back to a dropped point's files; and while gc
    removes, another process puts m1's sandbox back to its first versions' files again and again."""
    store_path = tmp_path / "store"
    count = 20_000 if backend == "lmdb" else 600  # blobs nothing names: several write transactions' worth
    with Store.open(store_path) as store:
        m0 = grow(store, "m0", tmp_path / "m0", checkpoints=CHECKPOINTS, files=FILES, changes=CHANGES)
        sandbox = grow(store, "m1", tmp_path / "m1", checkpoints=CHECKPOINTS, files=FILES, changes=CHANGES)
        strays(store, count)
    planned = tmp_path / "planned"
    gc = subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", "gc", "--keep-last", "1", "--json", "--store", str(store_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KEEL_FAULT_GC_PLANNED": f"{planned}:hold"},
    )
    try:
        wait_for(planned.exists)  # gc has made its plan and waits: what it would remove is fixed now
        ok(keel("restore", "m0", "p4", store=store_path))  # a new checkpoint naming p4's snapshot
        fork = json.loads(ok(keel("fork", "m0", f"p{CHECKPOINTS - 1}", "--json", store=store_path)).stdout)
        write_files(m0, files_at(FILES, 3, CHANGES, "m0"))  # the files as at p3, which gc drops
        with Store.open(store_path) as store:
            checkpoint(store, "m0", m0, Snapshotter(), reason="put back")
        writer, stop, out = _writer(tmp_path, sandbox, versions=3)  # m1's versions 1-3, while gc removes
        wait_for(lambda: read(store_path, lambda t: m.head_checkpoint(t, "m1")).reason == "put back meanwhile")
        planned.unlink()
        stdout, stderr = gc.communicate(timeout=300)
    finally:
        gc.kill()
        gc.wait()
    writes = _stopped(writer, stop, out)
    assert gc.returncode == 0, stderr
    report = json.loads(stdout)
    assert report["blobs_removed"] > count and report["transactions"] > 1  # m1's versions 4-7 went
    assert report["blobs_spared"] > 0  # blobs gc had planned to remove were named again, and stayed
    assert writes["busy"] == 0 and writes["writes"] > 0, writes
    ok(keel("verify", store=store_path))
    assert read(store_path, missing_blobs) == []
    for mission in ("m0", fork["mission"], "m1"):  # the oldest points left restore
        for point in read(store_path, lambda t, x=mission: m.restore_points(t, x))[:2]:  # type: ignore[misc]
            ok(keel("restore", mission, point.id, store=store_path))
    ok(keel("verify", store=store_path))


def test_gc_never_keeps_another_writer_waiting_long(tmp_path: Path) -> None:
    """A store whose collection takes seconds: a long history whose checkpoints all name one large blob
    (gc reads it again for each), and blobs nothing names. Another process's writes, which give up after
    1 s, all land while gc runs."""
    store_path = tmp_path / "store"
    with Store.open(store_path) as store:
        sandbox = grow(store, "m1", tmp_path / "m1", checkpoints=3, files=8, changes=2)
        long_history(store, "m1", 120, config_bytes=1_000_000)
        strays(store, 3000)
    writer, stop, out = _writer(tmp_path, sandbox, versions=0)
    try:
        wait_for(lambda: len(read(store_path, lambda t: m.events_after(t, "m1"))) > 0)  # it is writing
        report = json.loads(ok(keel("gc", "--json", store=store_path, timeout=300)).stdout)
    finally:
        writes = _stopped(writer, stop, out)
    assert report["blobs_removed"] == 3000
    assert writes["busy"] == 0 and writes["longest_s"] < LOCK_TIMEOUT_S, writes
    assert report["longest_txn_ms"] < LOCK_TIMEOUT_S * 1000
    ok(keel("verify", store=store_path))
