"""A long mission history made quickly: journal entries, their evidence, model calls and a restore point
written straight into a store with keel's own storage functions (no agent runs), for the history tests and
benchmarks/history.py.

Every tenth entry is a model call (7 in + 3 out tokens); the others are tool calls, each with its `tool`
evidence, every fourth of them a file write with a diff. One unit, lane `u`, running; a checkpoint at the
last entry gives restore point p1 (the unit unfinished there).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from keel.protocol.missionfile import load_mission_file
from keel.protocol.records import Event, Evidence, HostInfo, JournalEntry, MissionRecord, StepCost, UnitMark
from keel.protocol.states import MissionState, UnitState
from keel.server.engine import checkpoint
from keel.storage import Store, Txn
from keel.storage import missions as m

UNIT = "u"
BATCH = 5000
DIFF = "--- a/f.py\n+++ b/f.py\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n"


def mission_file(root: Path) -> Path:
    (root / "ws").mkdir(parents=True, exist_ok=True)
    path = root / "history.toml"
    path.write_text(
        '[mission]\nname = "history"\nagent = "python -m keel.agents.scripted"\nworkspace = "ws"\n\n'
        f'[[units]]\nid = "{UNIT}"\n'
    )
    return path


def entry_and_evidence(seq: int, at: float, lane: str = UNIT) -> tuple[JournalEntry, Evidence | None]:
    if seq % 10 == 0:
        result = {
            "provider": "local",
            "model": "local-model",
            "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            "message": {"role": "assistant", "content": f"step {seq}: carry on"},
        }
        return JournalEntry(
            seq=seq,
            kind="model/complete",
            fingerprint=f"{seq:064x}",
            result=result,
            at=at,
            served_model="local-model",
            cost=StepCost(wall_ms=3.0, tokens=10),
        ), None
    path = f"src/f{seq % 50}.py"
    if seq % 4 == 0:
        output = {"path": path, "bytes": 12, "diff": DIFF, "before": None, "after": f"{seq:032x}"}
        tool, args, klass = "write_file", {"path": path, "content": "x = 1\ny = 2\n"}, "effectful"
    else:
        output = {"path": path, "content": "x = 1\n" * 10, "start_line": 1, "end_line": 10}
        tool, args, klass = "read_file", {"path": path}, "read_only"
    entry = JournalEntry(
        seq=seq,
        kind="tool/run",
        fingerprint=f"{seq:064x}",
        result={"ok": True, "output": output},
        tool_class=klass,
        at=at,
        summary=f"{tool} {path}",
        cost=StepCost(wall_ms=1.0),  # type: ignore[arg-type]
    )
    told = Evidence(
        kind="tool", at=at, unit=UNIT, summary=f"{tool} {path}", data={"tool": tool, "args": args}, lane=lane, seq=seq
    )
    return entry, told


def append(store: Store, mission_id: str, first: int, count: int, *, at: float | None = None) -> None:
    """Entries first..first+count-1 of lane `u`, with their evidence, in transactions of BATCH entries."""
    start = time.time() if at is None else at
    for low in range(first, first + count, BATCH):

        def write(txn: Txn, low: int = low) -> None:
            for seq in range(low, min(low + BATCH, first + count)):
                entry, told = entry_and_evidence(seq, start + (seq - first) * 0.001)
                m.journal_put(txn, mission_id, UNIT, entry)
                if told is not None:
                    m.add_evidence(txn, mission_id, told)

        store.write(write)


def make_mission(
    store_path: Path,
    root: Path,
    entries: int,
    *,
    state: MissionState = MissionState.PAUSED,
    host: HostInfo | None = None,
) -> str:
    """A mission of `entries` journal entries in lane `u`, with restore point p1 at its last entry."""
    spec = load_mission_file(mission_file(root))
    now = time.time() - entries * 0.001 - 1
    record = MissionRecord(
        id=f"m-history-{entries}",
        spec=spec,
        state=MissionState.RUNNING,
        created_at=now,
        updated_at=now,
        workspace=str(root / "ws"),
        machine=os.uname().nodename,
        host=host,
    )
    with Store.open(store_path) as store:

        def start(txn: Txn) -> None:
            m.put_mission(txn, record)
            m.add_event(txn, record.id, Event(kind="state", at=now, state="running", message="created -> running"))
            m.add_event(txn, record.id, Event(kind="unit", at=now, unit=UNIT, state="running"))

        store.write(start)
        append(store, record.id, 1, entries, at=now)

        def point(txn: Txn) -> None:
            mark = UnitMark(state=UnitState.RUNNING, journal_hwm=entries)
            checkpoint.commit(
                txn,
                record.id,
                reason="policy",
                units=list(spec.units),
                marks={UNIT: mark},
                config=checkpoint.config_of(spec),
                state=MissionState.RUNNING,
            )
            if state != MissionState.RUNNING:
                m.set_mission_state(txn, record.id, state, host=None)

        store.write(point)
    return record.id
