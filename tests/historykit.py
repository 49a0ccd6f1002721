"""A long mission history made quickly: journal entries, their evidence, model calls and a restore point
written straight into a store with keel's own storage functions (no agent runs), for the history tests and
benchmarks/history.py.

Every tenth entry is a model call (7 in + 3 out tokens); the others are tool calls, each with its `tool`
evidence, every fourth of them a file write with a diff. One unit, lane `u`, running; a checkpoint at the
last entry gives restore point p1 (the unit unfinished there).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig

from keel.protocol.missionfile import load_mission_file
from keel.protocol.records import Event, Evidence, HostInfo, JournalEntry, MissionRecord, StepCost, UnitMark
from keel.protocol.states import MissionState, UnitState
from keel.server.engine import checkpoint
from keel.storage import DB, Store, Txn
from keel.storage import missions as m
from keel.storage.keys import unit_prefix

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


def mission_id(entries: int) -> str:
    return f"m-history-{entries}"


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
        id=mission_id(entries),
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


# -- a host that writes a long mission's history, then completes it, for following it through `keel serve`
def host_main(store_path: str, mission_id: str, go: str, count: str, per_s: str) -> None:
    """Stands for the mission's host (the record names this process): once `go` exists, appends `count`
    entries at `per_s` a second, then completes the mission and leaves, as a host does."""
    while not Path(go).exists():
        time.sleep(0.01)
    total, rate, chunk = int(count), float(per_s), 100
    with Store.open(store_path) as store:
        began = time.monotonic()
        first = store.read(lambda t: t.last_seq(DB.JOURNAL, unit_prefix(mission_id, UNIT))) + 1
        for done in range(0, total, chunk):
            append(store, mission_id, first + done, min(chunk, total - done))
            time.sleep(max(0.0, began + (done + chunk) / rate - time.monotonic()))
        store.write(lambda t: m.set_mission_state(t, mission_id, MissionState.COMPLETED, host=None))


def start_host(store: Path, mid: str, go: Path, count: int, per_s: float) -> tuple[subprocess.Popen[bytes], HostInfo]:
    """The host process (waiting for `go`) and how the mission record names it: make the mission after this."""
    argv = [sys.executable, "-m", "tests.historykit", str(store), mid, str(go), str(count), str(per_s)]
    started = time.time()
    proc = subprocess.Popen(argv, cwd=REPO)
    return proc, HostInfo(host_id=f"history-{proc.pid}", pid=proc.pid, started_at=started)


REPO = Path(__file__).resolve().parents[1]


# -- following a mission through `keel serve`
class Followed(NamedTuple):
    items: int  # activity items the client paged and was pushed
    errors: int  # requests answered with an error, and ERROR lines in the server's log
    peak_anon_mb: float  # the server's RssAnon, highest seen
    cpu_after_s: float  # CPU seconds the server used from `settle_s` to `settle_s + idle_s` after the end
    idle_s: float
    suspects: int  # times supervision suspected the mission's host


def rss_anon_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def follow(
    serve: list[str],
    root: Path,
    mid: str,
    go: Path,
    *,
    pages: int,
    settle_s: float,
    idle_s: float,
    within: float = 600.0,
) -> Followed:
    """Start `serve` (a `keel serve` command) on workspace `root`, let the host go, page through the first
    `pages` pages of the mission's activity (2000 items each) while it writes and is pushed what it adds, until
    it completed; then measure the server at rest."""
    log_file = root / "serve.log"
    client = await ClientServerConfig(server_command=[*serve, "--log-file", str(log_file)]).start()
    states: list[str] = []
    pushed = [0]
    client.feature("keel/missionChanged")(lambda p: states.append(_field(p, "state")))
    client.feature("keel/activityChanged")(lambda p: pushed.__setitem__(0, pushed[0] + len(_field(p, "items"))))
    params = types.InitializeParams(capabilities=types.ClientCapabilities(), root_uri=root.as_uri())
    await client.initialize_session(params)
    pid = client._server.pid  # type: ignore[union-attr]
    peak, errors, items, cursor, more = rss_anon_mb(pid), 0, 0, "", True
    os.close(os.open(go, os.O_CREAT | os.O_WRONLY))  # the host goes
    deadline = time.monotonic() + within
    try:
        while "completed" not in states or (more and pages > 0):
            assert time.monotonic() < deadline, f"mission {mid} not followed to its end within {within}s"
            peak = max(peak, rss_anon_mb(pid))
            if not more or pages <= 0:
                await asyncio.sleep(0.05)
                continue
            try:
                page = await client.protocol.send_request_async(
                    "keel/activity", {"id": mid, "cursor": cursor, "limit": 2000}
                )
                items, cursor, more = items + len(_field(page, "items")), _field(page, "cursor"), _field(page, "more")
                pages -= 1
            except JsonRpcException:
                errors += 1
        await asyncio.sleep(settle_s)
        before = cpu_s(pid)
        await asyncio.sleep(idle_s)
        used = cpu_s(pid) - before
        peak = max(peak, rss_anon_mb(pid))
    finally:
        await client.shutdown_session()
        await client.stop()
    log = log_file.read_text()
    errors += log.count(" ERROR ")
    suspects = log.count(f"supervision of {mid}: watching -> suspect")
    return Followed(items + pushed[0], errors, peak, used, idle_s, suspects)


def _field(value: Any, name: str) -> Any:
    return (value._asdict() if hasattr(value, "_asdict") else value)[name]


if __name__ == "__main__":
    host_main(*sys.argv[1:])
