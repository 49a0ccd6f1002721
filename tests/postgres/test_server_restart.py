"""PostgreSQL crashes and restarts (`pg_ctl restart -m immediate`) under a running mission.

The strike comes on a condition: a unit's first effect has run (its marker is in the side log), the
mission is not finished, and the mission host holds a live connection to the server. The server then
crashes (no shutdown checkpoint: recovery replays its WAL) and starts again. Connections keel had are
gone; writes in flight either committed or not, and keel must find out which by reading back, never
by guessing. Checked: the mission completes by itself (the host waits the server out), every effect
ran exactly once, the files equal an undisturbed run's, each unit succeeded once, and `keel verify`
finds every record intact.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from engine_helpers import files, keel, mission_id_of, record, sandbox_of, start_keel, unit_events, write_mission

from keel.protocol.states import MissionState
from tests.pgserver import PgServer, schema_of

UNITS = {"a": [], "b": [], "c": [], "d": ["a", "b"], "e": ["c", "d"]}


def _units(side: Path) -> list[dict[str, Any]]:
    def unit(uid: str) -> dict[str, Any]:
        return {
            "id": uid,
            "after": UNITS[uid],
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": f"{uid}.py", "content": f"{uid.upper()} = 1\n"}},
                    {"tool": "run", "args": {"cmd": f"sleep 0.3; echo {uid}-1 >> {side}"}},
                    {"now": True},
                    {"random": True},
                    {"sleep": 0.3},
                    {"tool": "run", "args": {"cmd": f"echo {uid}-2 >> {side}"}},
                    {"save_state": {"unit": uid}},
                    {"tool": "read_file", "args": {"path": f"{uid}.py"}},
                ]
            },
        }

    return [unit(uid) for uid in UNITS]


def _mission(folder: Path, server: PgServer) -> tuple[Path, Path, Path]:
    folder.mkdir()
    side = folder / "side.log"
    return server.store_folder(folder / "store"), write_mission(folder, _units(side), max_parallel=3), side


def _connected(server: PgServer, store: Path, pid: int) -> bool:
    """Whether process `pid` holds a connection to the store's database now."""
    with server.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (f"keel pid {pid} on %",)
        ).fetchone()
    return row is not None and int(row[0]) > 0


def _outcome(store: Path, mid: str, side: Path) -> dict[str, Any]:
    return {
        "side": side.read_text().split(),
        "files": files(sandbox_of(store, mid)),
        "events": unit_events(store, mid),
    }


@pytest.mark.slow
@pytest.mark.parametrize("strike", ["first-effect", "second-wave", "outage"])
def test_server_crash_and_restart_loses_nothing_and_repeats_nothing(
    tmp_path: Path, pg_server: PgServer, strike: str
) -> None:
    store, mission, side = _mission(tmp_path / "reference", pg_server)
    done = keel("run", str(mission), "--json", store=store, timeout=120, check_rc=0)
    reference = _outcome(store, json.loads(done.stdout.splitlines()[0])["mission"], side)
    assert sorted(reference["side"]) == sorted(f"{u}-{k}" for u in UNITS for k in (1, 2))

    store, mission, side = _mission(tmp_path / "struck", pg_server)
    # an outage longer than keel's reconnect window (2 s here, 30 s by default): waited out, not given up
    host = start_keel("run", str(mission), store=store, env={"KEEL_STORE_RECONNECT_S": "2"})
    mid = mission_id_of(host)
    wanted = "d-1" if strike == "second-wave" else "a-1"  # d runs after a and b: a later wave of units
    deadline = time.monotonic() + 60
    while wanted not in (side.read_text().split() if side.exists() else []):
        assert host.poll() is None and time.monotonic() < deadline, "the mission ended before the strike"
        time.sleep(0.01)
    assert record(store, mid).state == MissionState.RUNNING
    assert _connected(pg_server, store, host.pid), "the host holds no connection: the strike would miss it"
    before = len(side.read_text().split())
    if strike == "outage":
        pg_server.crash()
        time.sleep(6)
        pg_server.start()
    else:
        pg_server.restart_immediate()
    with psycopg.connect(pg_server.store_url(schema_of(store))) as conn:  # the server is back
        conn.execute("SELECT 1")
    out, err = host.communicate(timeout=180)
    assert host.returncode == 0, f"the host did not complete the mission by itself:\n{out[-2000:]}\n{err[-3000:]}"
    struck = _outcome(store, mid, side)
    assert before < len(struck["side"]), "the mission had finished its effects before the strike"
    counts = collections.Counter(struck["side"])
    assert all(n == 1 for n in counts.values()), f"an effect ran twice: {struck['side']}"
    assert set(counts) == set(reference["side"]), f"effects lost: {sorted(counts)}"
    assert struck["files"] == reference["files"]
    for unit in UNITS:
        states = [s for u, s in struck["events"] if u == unit]
        assert states.count("succeeded") == 1 and states[-1] == "succeeded", (unit, states)
    keel("verify", store=store, check_rc=0)
