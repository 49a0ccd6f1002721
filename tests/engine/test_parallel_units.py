"""Parallel units run their commands at the same time: each unit's tool calls wait only for that unit's
own, never for another unit's. Shown by the commands' own clocks, not by keel's records: each command
writes its start and end time to a file outside the workspace, and waits (up to a generous deadline) for
the other unit's command to have started before it ends. Were the two commands run one after the other,
the first would wait in vain until its deadline, end, and only then would the second start: the
intervals would not overlap."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import keel, read, write_mission

from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

WAIT_TICKS = 2400  # of 0.05 s (2 minutes): how long a command waits for the other one to start before it gives up


def _command(side: Path, me: str, other: str) -> str:
    mine, theirs = side / f"{me}.started", side / f"{other}.started"
    return (  # the start time is written before its file appears (mv), so a seen start is an earlier one
        f"date +%s.%N > {mine}.tmp && mv {mine}.tmp {mine}; i=0; "
        f"while [ ! -e {theirs} ] && [ $i -lt {WAIT_TICKS} ]; do sleep 0.05; i=$((i+1)); done; "
        f"date +%s.%N > {side / me}.ended"
    )


def test_two_units_commands_overlap_in_time(tmp_path: Path) -> None:
    side = tmp_path / "side"
    side.mkdir()
    units = [
        {"id": uid, "params": {"steps": [{"tool": "run", "args": {"cmd": _command(side, uid, other)}}]}}
        for uid, other in (("a", "b"), ("b", "a"))
    ]
    path = write_mission(tmp_path, units, max_parallel=2)
    store = tmp_path / "store"
    done = keel("run", str(path), "--plain", store=store, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [x.state.value for x in read(store, m.list_missions)] == ["completed"]
    a = (float((side / "a.started").read_text()), float((side / "a.ended").read_text()))
    b = (float((side / "b.started").read_text()), float((side / "b.ended").read_text()))
    assert a[0] < b[1] and b[0] < a[1], f"the commands ran one after the other: a {a}, b {b}"
