"""An acknowledged journal entry survives a SIGKILLed host: checked from a fresh process.

A real host runs an agent that notes every result it receives in a file (the kernel keeps what a killed
process wrote); the host is SIGKILLed while the agent is still asking, and a fresh process then finds a
journal entry for every result the agent had seen. Whichever way the host committed an entry (on its
event loop's thread or on the writer thread), its result must not reach the agent before the commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.engine.engine_helpers import kill, start_keel, wait_for, write_mission

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

NOTING_AGENT = """
import sys
from keel.agents.sdk import Agent

async def run(ctx):
    with open(sys.argv[1], "a") as acks:
        for _ in range(100_000):
            acks.write(repr(await ctx.now()) + "\\n")
            acks.flush()
    return {}

Agent("noting", {"*": run}).run()
"""

FRESH_READ = """
import json, sys
from keel.storage import Store
from keel.storage import missions as m
with Store.open(sys.argv[1], create=False, readonly=True) as s:
    mission = s.read(m.list_missions)[0].id
    entries = [e for unit in sys.argv[2:] for e in s.read(lambda t: m.journal_entries(t, mission, unit))]
print(json.dumps([e.result["time"] for e in entries if e.kind == "now" and e.phase == "done"]))
"""


def _acknowledged(path: Path) -> list[float]:
    lines = path.read_text().split("\n")[:-1]  # a line still being written is not acknowledged
    return [float(line) for line in lines]


def _processes_with(needle: bytes) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{entry.name}/cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


@pytest.mark.parametrize("parallel_units", [1, 3])
def test_every_acknowledged_entry_is_durable_after_a_sigkill(tmp_path: Path, parallel_units: int) -> None:
    marker = f"noting-agent-{uuid.uuid4().hex}"
    script = tmp_path / f"{marker}.py"
    script.write_text(NOTING_AGENT)
    acks = tmp_path / "acks"
    acks.write_text("")
    units = [f"u{i}" for i in range(parallel_units)]
    mission = write_mission(
        tmp_path, [{"id": u} for u in units], agent=["python", str(script), str(acks)], max_parallel=parallel_units
    )
    store = tmp_path / "store"
    host = start_keel("run", str(mission), store=store)
    try:
        wait_for(lambda: len(_acknowledged(acks)) >= 60 * parallel_units, timeout=60)
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=30)
        acknowledged = _acknowledged(acks)
        fresh = [sys.executable, "-c", FRESH_READ, str(store), *units]
        out = subprocess.run(fresh, capture_output=True, text=True, timeout=60, check=True)
        durable = set(json.loads(out.stdout))
        missing = [t for t in acknowledged if t not in durable]
        assert len(acknowledged) >= 60 * parallel_units
        assert missing == [], f"{len(missing)} of {len(acknowledged)} acknowledged entries lost"
    finally:
        kill(host)
        deadline = time.monotonic() + 30
        while _processes_with(marker.encode()) and time.monotonic() < deadline:
            time.sleep(0.1)  # the orphaned worker stops its agent within about 2 s
        for pid in _processes_with(marker.encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
