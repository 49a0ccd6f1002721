"""Agents that misbehave and hosts that die at awkward moments: each unit fails (or recovers) with a
clear error, the host lives on, nothing recorded twice."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from engine_helpers import (
    AGENT,
    keel,
    kill,
    mission_id_of,
    read,
    record,
    start_keel,
    unit_events,
    wait_for,
    write_mission,
)

from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

FLAKY_AGENT = """
import os, sys
from keel.agents.sdk import Agent

async def handle(ctx):
    for _ in range(int(sys.argv[2])):  # steps that replay the same
        await ctx.now()
    # deterministic on the first run, different after a marker file appears: a nondeterministic agent
    if os.path.exists(sys.argv[1]):
        await ctx.random()
    else:
        await ctx.now()
    return await ctx.ask("continue?")

Agent("flaky", {"*": handle}).run()
"""


def _ok_unit(uid: str, side: Path) -> dict:
    return {"id": uid, "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo {uid} >> {side}"}}]}}


@pytest.mark.parametrize("same", [0, 3])
def test_nondeterminism_fails_the_unit_naming_the_entry(tmp_path: Path, same: int) -> None:
    """Also after steps that replay the same (answered by the unit's worker): the host numbers on from them."""
    agent = tmp_path / "flaky.py"
    agent.write_text(FLAKY_AGENT)
    marker = tmp_path / "changed"
    store = tmp_path / "store"
    mission = write_mission(tmp_path, [{"id": "x"}], agent=f"python {agent} {marker} {same}")
    proc = keel("run", str(mission), "--json", store=store, check_rc=3)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    marker.write_text("now the agent behaves differently")
    keel("answer", mid, "yes", "--no-resume", store=store, check_rc=0)
    assert keel("resume", mid, store=store).returncode == 4
    error = record(store, mid).error
    assert f"nondeterminism in mission {mid} unit x entry {same + 1}" in error
    assert "the journal has now" in error and "the agent sent random" in error


def test_agent_writing_garbage_fails_its_unit_and_the_host_lives_on(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    units = [{"id": "bad", "params": {"steps": [{"garbage": True}, {"now": True}]}}, _ok_unit("good", side)]
    store = tmp_path / "store"
    proc = keel("run", str(write_mission(tmp_path, units)), "--json", store=store, check_rc=4)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    assert head.units["good"].state.value == "succeeded"
    assert head.units["bad"].state.value == "failed"
    assert "wrote garbage on stdout" in head.units["bad"].error
    assert side.read_text().split() == ["good"]


def test_agent_dying_at_start_fails_its_unit_with_a_clear_error(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mission = write_mission(tmp_path, [{"id": "x"}], agent=["python", "-c", "import sys; sys.exit(3)"])
    keel("run", str(mission), store=store, check_rc=4)
    mid = read(store, m.list_missions)[0].id
    error = read(store, lambda t: m.head_checkpoint(t, mid)).units["x"].error
    assert "exited (code 3)" in error and "gave up after 3 starts" in error


def test_an_agent_that_closes_its_input_is_reported_by_its_own_exit(tmp_path: Path) -> None:
    """The host's first frame finds the agent's input closed while the agent still runs: the unit's worker
    reports the agent's exit (code 3), never its own stop as if its host had gone (code 70)."""
    store = tmp_path / "store"
    agent = ["python", "-c", "import os, sys, time; os.close(0); time.sleep(0.5); sys.exit(3)"]
    mission = write_mission(tmp_path, [{"id": "x"}], agent=agent)
    keel("run", str(mission), store=store, check_rc=4)
    mid = read(store, m.list_missions)[0].id
    error = read(store, lambda t: m.head_checkpoint(t, mid)).units["x"].error
    assert "exited (code 3)" in error and "gave up after 3 starts" in error, error


def test_agent_dying_mid_unit_is_started_again_and_replays(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    units = [
        {
            "id": "x",
            "params": {
                "steps": [
                    {"tool": "run", "args": {"cmd": f"echo once >> {side}"}},
                    {"exit": 9, "once_file": str(tmp_path / "died")},
                    {"now": True},
                ]
            },
        }
    ]
    store = tmp_path / "store"
    proc = keel("run", str(write_mission(tmp_path, units)), "--json", store=store, check_rc=0)
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert any("starting it again" in e.get("message", "") for e in events)
    assert side.read_text().split() == ["once"]
    assert events[-1]["replayed"] == 1


def _agent_pids(root: Path) -> list[int]:
    """The scripted agents working under `root` (the agent itself: its worker's command line names it too)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if argv[1:3] == [b"-m", b"keel.agents.scripted"] and cwd.startswith(str(root)):
                pids.append(int(entry.name))
    return pids


def test_sigkill_of_an_agent_restarts_the_unit_from_its_journal(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    units = [
        {
            "id": "x",
            "params": {
                "steps": [
                    {"tool": "run", "args": {"cmd": f"echo one >> {side}"}},
                    {"sleep": 1.0},
                    {"tool": "run", "args": {"cmd": f"echo two >> {side}"}},
                ]
            },
        }
    ]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mission_id_of(host)
    wait_for(lambda: side.exists())
    pids = _agent_pids(tmp_path)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    out, _ = host.communicate(timeout=30)
    assert host.returncode == 0
    assert side.read_text().split() == ["one", "two"]
    assert json.loads(out.splitlines()[-1])["replayed"] == 1


def test_sigkill_during_a_checkpoint_write_loses_nothing(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    units = [_ok_unit("a", side), {**_ok_unit("b", side), "after": ["a"]}]
    store = tmp_path / "store"
    marker = tmp_path / "in-checkpoint"
    mission = write_mission(tmp_path, units)
    host = start_keel("run", str(mission), store=store, env={"KEEL_FAULT_CHECKPOINT": f"{marker}:5"})
    mid = mission_id_of(host)
    wait_for(marker.exists)  # the host sits inside the "started" checkpoint transaction
    kill(host)
    points_before = read(store, lambda t: m.restore_points(t, mid))
    assert points_before == []  # the killed transaction left nothing half-written
    keel("resume", mid, store=store, check_rc=0)
    assert keel("verify", store=store).returncode == 0
    assert side.read_text().split() == ["a", "b"]
    assert [s for u, s in unit_events(store, mid) if s == "succeeded"] == ["succeeded", "succeeded"]


def test_scripted_agent_exits_when_stdin_closes(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "keel.agents.scripted"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.2)
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=5) == 0
    assert AGENT.endswith("scripted")


def test_a_unit_past_its_timeout_fails(tmp_path: Path) -> None:
    store = tmp_path / "store"
    never = tmp_path / "never"  # the unit's work never ends by itself: only its timeout can end it
    units = [{"id": "slow", "timeout_s": 0.5, "params": {"steps": [{"wait_file": str(never)}]}}]
    keel("run", str(write_mission(tmp_path, units)), store=store, timeout=120, check_rc=4)
    mid = read(store, m.list_missions)[0].id
    assert "took longer than its timeout_s of 0.5 s" in record(store, mid).error
