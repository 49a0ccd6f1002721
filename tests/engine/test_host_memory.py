"""A host's own memory does not grow with its unit's history: not while the unit runs, and not when a
restarted host replays it. Read from /proc (RssAnon: the process's own pages, not the store's mapped file)
of a real `keel run` and `keel resume`, at journal sizes read from the store by this process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keel.storage import DB, Store
from keel.storage.keys import unit_prefix
from tests.engine.engine_helpers import read, write_mission

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

ENTRIES = 6000
BODY = "a line a unit reads back, again and again, to fill its journal\n" * 64  # ~4 KB of result per entry
MB = 1024 * 1024


def _anon(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("RssAnon:")), 0)


def _entries(store: Path) -> int:
    if not (store / "data.mdb").exists():
        return 0
    with Store.open(store, create=False, readonly=True) as s:

        def count(t):  # type: ignore[no-untyped-def]
            missions = [k.decode() for k, _ in t.scan_raw(DB.MISSIONS, b"")]
            return sum(t.last_seq(DB.JOURNAL, unit_prefix(mid, "u")) for mid in missions)

        return int(s.read(count))


def _watch(proc: subprocess.Popen[bytes], store: Path, until: int | None) -> tuple[dict[int, int], int]:
    """The host's anonymous memory when the journal first held 500 entries and `until` entries (then the
    host is SIGKILLed), and its peak over its life."""
    at: dict[int, int] = {}
    peak = 0
    while proc.poll() is None:
        anon, n = _anon(proc.pid), _entries(store)
        peak = max(peak, anon)
        for mark in (500, until):
            if mark is not None and n >= mark and mark not in at and anon:
                at[mark] = anon
        if until is not None and until in at:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    return at, peak


@pytest.mark.slow
@pytest.mark.lmdb_only("the journal's length is read from the LMDB file while the host writes it")
@pytest.mark.timeout(600)
def test_a_hosts_memory_stays_flat_as_its_unit_runs_and_when_a_restarted_host_replays_it(tmp_path: Path) -> None:
    mission = write_mission(
        tmp_path,
        [
            {
                "id": "u",
                "params": {"steps": [{"repeat": ENTRIES, "steps": [{"tool": "read_file", "args": {"path": "r.txt"}}]}]},
            }
        ],
    )
    (tmp_path / "ws" / "r.txt").write_text(BODY)
    store = tmp_path / "store"
    keel = [sys.executable, "-m", "keel.server.cli"]
    until = ENTRIES - 300
    first = subprocess.Popen([*keel, "run", str(mission), "--plain", "--store", str(store)], stdout=subprocess.DEVNULL)
    at, _ = _watch(first, store, until)
    assert until in at, "the host was struck after the journal held most of the unit's entries"
    grown = at[until] - at[500]
    assert grown < 10 * MB, f"the host's memory grew {grown / MB:.1f} MB from 500 to {until} entries"

    (mission_id,) = read(store, lambda t: [k.decode() for k, _ in t.scan_raw(DB.MISSIONS, b"")])
    resumed = subprocess.Popen(
        [*keel, "resume", mission_id, "--plain", "--store", str(store)], stdout=subprocess.DEVNULL
    )
    _, peak = _watch(resumed, store, None)
    assert resumed.returncode == 0
    assert _entries(store) == ENTRIES
    over = peak - at[500]  # a page of entries and the worker's answer table: bounded, whatever the history
    assert over < 24 * MB, f"replaying {until} entries took the host {over / MB:.1f} MB past a short history's"
