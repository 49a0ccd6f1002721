"""Agents that break the protocol: the unit fails with the real reason, and when `keel run` returns no
process of that agent is left — not the agent, not what it started, not its worker.

Each agent is a small Python script that starts a child (`python -c "sleep"`) carrying a unique marker
in its argv, writes something that is not a valid frame, and then sleeps without reading its stdin;
the test looks for the marker (and the worker) in /proc after `keel run` has exited.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from engine_helpers import keel, read, write_mission

from keel.protocol.framing import DEFAULT_MAX_SIZE
from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

AGENT = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", sys.argv[1]])
out = sys.stdout.buffer
{misbehave}
out.flush()
time.sleep(300)
"""

CASES = {
    "20kb-header": ('out.write(b"X-Pad: " + b"a" * 20_000 + b"\\r\\n")', "frame header longer than 8192 bytes"),
    "70mb-frame-then-nothing": (
        'out.write(b"Content-Length: 73400320\\r\\n\\r\\n")',
        f"frame of 73400320 bytes exceeds the limit of {DEFAULT_MAX_SIZE} bytes",
    ),
    "70mb-frame-then-garbage": (
        'out.write(b"Content-Length: 73400320\\r\\n\\r\\n" + os.urandom(100_000))',
        f"frame of 73400320 bytes exceeds the limit of {DEFAULT_MAX_SIZE} bytes",
    ),
    "invalid-json": (
        'body = b"{this is not json"; out.write(b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)',
        "message is not a JSON object: JSON is malformed",
    ),
}


def _processes_with(needle: bytes) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle in cmdline:
                found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def _gone(needles: list[bytes], timeout: float = 30) -> list[tuple[int, str]]:
    """The processes still holding a needle after waiting up to `timeout` for them to go."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for needle in needles for p in _processes_with(needle)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.parametrize(("misbehave", "reason"), list(CASES.values()), ids=list(CASES))
def test_an_agent_writing_garbage_fails_its_unit_and_leaves_no_process(
    tmp_path: Path, misbehave: str, reason: str
) -> None:
    marker = f"misbehaving-agent-{uuid.uuid4().hex}"
    script = tmp_path / "bad_agent.py"
    script.write_text(AGENT.format(misbehave=misbehave))
    store = tmp_path / "store"
    mission = write_mission(tmp_path, [{"id": "a"}], agent=["python", str(script), marker])
    needles = [marker.encode(), str(script).encode(), str(store).encode()]  # child, agent, worker
    try:
        keel("run", str(mission), store=store, check_rc=4)
        left = _gone(needles)
        assert left == [], f"still running after keel run returned: {left}"
        mid = read(store, m.list_missions)[0].id
        error = read(store, lambda t: m.head_checkpoint(t, mid)).units["a"].error
        assert error == f"agent a wrote garbage on stdout: {reason}" or error.startswith(
            f"agent a wrote garbage on stdout: {reason}"
        ), error
        assert "died" not in error and "starting it again" not in error
    finally:
        for pid, _ in _processes_with(marker.encode()) + _processes_with(str(script).encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


LINGERING_AGENT = """
import asyncio, os, subprocess, sys
from keel.agents.sdk import Agent

async def handle(ctx):
    if not os.path.exists(sys.argv[2]):  # first start: leave a child behind, then hang
        open(sys.argv[2], "w").close()
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", sys.argv[1]])
        await asyncio.sleep(300)
    return {"result": "second start"}

Agent("lingering", {"*": handle}).run()
"""


def test_a_killed_worker_takes_its_agent_and_the_agents_children_with_it(tmp_path: Path) -> None:
    """The worker dies without cleaning up (SIGKILL): the host kills the worker's whole session, so the
    child the agent started goes too, and the unit starts again."""
    from engine_helpers import mission_id_of, start_keel, wait_for

    marker = f"lingering-agent-{uuid.uuid4().hex}"
    script = tmp_path / "lingering_agent.py"
    script.write_text(LINGERING_AGENT)
    store = tmp_path / "store"
    mission = write_mission(tmp_path, [{"id": "a"}], agent=["python", str(script), marker, str(tmp_path / "started")])
    host = start_keel("run", str(mission), store=store)
    try:
        mission_id_of(host)

        def children() -> list[int]:  # the marker is also in the agent's own argv
            return [pid for pid, cmd in _processes_with(marker.encode()) if "time.sleep(300)" in cmd]

        wait_for(lambda: bool(children()), timeout=30)
        workers = [
            pid for pid, cmd in _processes_with(str(store).encode()) if "keel.server.engine.units.subagent" in cmd
        ]
        assert len(children()) == 1 and len(workers) == 1, (children(), workers)
        os.kill(workers[0], signal.SIGKILL)
        _, err = host.communicate(timeout=60)
        assert host.returncode == 0, err
        assert _gone([marker.encode()]) == []
    finally:
        if host.poll() is None:
            host.kill()
            host.communicate(timeout=10)
        for pid, _ in _processes_with(marker.encode()) + _processes_with(str(script).encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
