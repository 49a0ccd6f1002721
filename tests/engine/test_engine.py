"""The mission host end to end with real scripted agents: run, evidence, sandboxes, pause, answer,
points and restore, one host per mission."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from engine_helpers import (
    keel,
    kill,
    mission_id_of,
    read,
    record,
    sandbox_of,
    start_keel,
    stop_process,
    wait_for,
    write_mission,
)

from keel.protocol.states import MissionState
from keel.storage import missions as m
from keel.storage.location import store_exists
from keel.storage.writelock import LOCK_NAME, holder_pid

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def _edit_units(side: Path) -> list[dict]:
    return [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.py", "content": "A = 1\n"}},
                    {"tool": "run", "args": {"cmd": f"python -m py_compile a.py && echo a >> {side}", "verify": True}},
                    {"now": True},
                    {"random": True},
                ]
            },
        },
        {
            "id": "b",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "b.py", "content": "B = 2\n"}},
                    {"save_state": {"done": 1}},
                ]
            },
        },
        {
            "id": "c",
            "after": ["a", "b"],
            "params": {
                "steps": [
                    {"tool": "read_file", "args": {"path": "a.py"}},
                    {"tool": "run", "args": {"cmd": f"echo c >> {side}"}},
                ]
            },
        },
    ]


def test_run_completes_records_evidence_and_leaves_the_workspace_alone(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    mission = write_mission(tmp_path, _edit_units(side))
    (tmp_path / "ws" / "keep.py").write_text("K = 0\n")
    store = tmp_path / ".keel" / "store"
    proc = keel("run", str(mission), "--json", store=store, check_rc=0)
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    mid = events[0]["mission"]
    assert events[-1]["event"] == "host_exit" and events[-1]["state"] == "completed"
    sandbox = sandbox_of(store, mid)
    assert (sandbox / "a.py").read_text() == "A = 1\n" and (sandbox / "keep.py").exists()
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["keep.py"]  # the person's folder is untouched
    assert side.read_text().split() == ["a", "c"]
    evidence = [e for _, e in read(store, lambda t: list(m.evidence_after(t, mid)))]
    kinds = [e.kind for e in evidence]
    assert kinds.count("tool") == 5 and "verification" in kinds and "diff" in kinds
    verification = next(e for e in evidence if e.kind == "verification")
    assert verification.data["ok"] is True and "py_compile" in verification.data["cmd"]
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    saved = read(store, lambda t: t.get_object(head.units["b"].agent_state, dict))
    assert saved is not None and saved["value"] == {"done": 1}  # the scripted agent saves where it was with it
    points = json.loads(keel("points", mid, "--json", store=store, check_rc=0).stdout)
    reasons = [p["reason"] for p in points]
    assert reasons[0] == "started" and reasons[-1] == "completed"
    assert {"unit succeeded: a", "unit succeeded: b", "unit succeeded: c"} <= set(reasons)


def test_git_workspace_gets_a_worktree_on_its_own_branch(tmp_path: Path) -> None:
    mission = write_mission(tmp_path, _edit_units(tmp_path / "side.log")[:1])
    ws = tmp_path / "ws"
    (ws / "main.py").write_text("print('hi')\n")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=ws, check=True)
    subprocess.run([*git, "add", "."], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=ws, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ws, capture_output=True, text=True).stdout
    store = tmp_path / ".keel" / "store"
    mid = json.loads(keel("run", str(mission), "--json", store=store, check_rc=0).stdout.splitlines()[0])["mission"]
    sandbox = sandbox_of(store, mid)
    branch = subprocess.run(["git", "branch", "--show-current"], cwd=sandbox, capture_output=True, text=True)
    assert branch.stdout.strip() == f"keel/{mid}" and (sandbox / "a.py").exists()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ws, capture_output=True, text=True).stdout
    assert status == "" and not (ws / "a.py").exists()
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=ws, capture_output=True, text=True).stdout == head
    current = subprocess.run(["git", "branch", "--show-current"], cwd=ws, capture_output=True, text=True)
    assert current.stdout.strip() == "main"


# Slow enough that a `keel pause` started from another process lands mid-mission even on a loaded machine.
def _slow_units(side: Path) -> list[dict]:
    return [
        {
            "id": f"u{i}",
            "params": {
                "steps": [
                    {"tool": "run", "args": {"cmd": f"echo u{i}-1 >> {side}"}},
                    {"sleep": 1.5},
                    {"tool": "run", "args": {"cmd": f"echo u{i}-2 >> {side}"}},
                    {"sleep": 1.5},
                    {"now": True},
                ]
            },
        }
        for i in range(3)
    ]


def test_pause_is_acknowledged_and_resume_continues_there(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, _slow_units(side))), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: side.exists() and len(side.read_text().split()) >= 2)
    keel("pause", mid, store=store, check_rc=0)
    # How fast the host acknowledges is a benchmark figure (benchmarks/), not a timed assertion here.
    wait_for(lambda: record(store, mid).state in (MissionState.PAUSING, MissionState.PAUSED), step=0.005)
    assert host.wait(timeout=20) == 3
    assert record(store, mid).state == MissionState.PAUSED
    assert "paused" in [p.reason for p in read(store, lambda t: m.restore_points(t, mid))]
    keel("resume", mid, store=store, check_rc=0)
    lines = side.read_text().split()
    assert sorted(lines) == sorted(f"u{i}-{k}" for i in range(3) for k in (1, 2))  # no effect twice


def test_pause_requested_while_the_host_is_dead_is_honoured(tmp_path: Path) -> None:
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, _slow_units(tmp_path / "side.log"))), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: record(store, mid).state == MissionState.RUNNING)
    kill(host)
    keel("pause", mid, store=store, check_rc=0)
    assert record(store, mid).state == MissionState.PAUSED
    assert keel("resume", mid, store=store).returncode == 0


def test_question_waits_for_an_answer_delivered_by_replay(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    units = [
        {
            "id": "q",
            "params": {
                "steps": [
                    {"tool": "run", "args": {"cmd": f"echo before >> {side}"}},
                    {"ask": "Which name?", "choices": ["alpha", "beta"]},
                    {"tool": "run", "args": {"cmd": f"echo after >> {side}"}},
                ]
            },
        }
    ]
    store = tmp_path / "store"
    proc = keel("run", str(write_mission(tmp_path, units)), "--json", store=store, check_rc=3)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    status = keel("status", mid, store=store, check_rc=0).stdout
    assert "Which name?" in status and "waiting_input" in status
    assert "answer one of alpha, beta" in keel("answer", mid, "gamma", store=store, check_rc=2).stderr
    keel("answer", mid, "beta", store=store, check_rc=0)  # resumes in a detached host
    wait_for(lambda: record(store, mid).state == MissionState.COMPLETED, timeout=30)
    manifest = read(store, lambda t: m.head_checkpoint(t, mid))
    assert manifest.units["q"].result["outputs"][1] == "beta"
    assert side.read_text().split() == ["before", "after"]


def test_a_second_host_for_the_same_mission_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, _slow_units(tmp_path / "side.log"))), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: record(store, mid).state == MissionState.RUNNING)
    second = keel("resume", mid, store=store)
    assert second.returncode == 2 and "already running" in second.stderr
    kill(host)


def test_restore_rewinds_with_a_new_checkpoint_and_keeps_history(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    store = tmp_path / "store"
    units = _edit_units(side)
    units[0]["params"]["steps"].append({"ask": "ok?"})
    proc = keel("run", str(write_mission(tmp_path, units, max_parallel=1)), "--json", store=store, check_rc=3)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    keel("answer", mid, "yes", "--no-resume", store=store, check_rc=0)
    keel("resume", mid, store=store, check_rc=0)
    points = json.loads(keel("points", mid, "--json", store=store, check_rc=0).stdout)
    waiting = next(p for p in points if p["reason"] == "waiting for input")
    keel("restore", mid, waiting["id"], store=store, check_rc=0)
    after = json.loads(keel("points", mid, "--json", store=store, check_rc=0).stdout)
    assert after[: len(points)] == points and after[-1]["reason"] == f"restored to {waiting['id']}"
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    assert head.units["c"].state.value == "pending" and head.units["a"].epoch == 1
    assert record(store, mid).state == MissionState.PAUSED
    # resuming asks again: the answer recorded after the point is not used
    assert keel("resume", mid, store=store).returncode == 3
    assert record(store, mid).question is not None
    assert side.read_text().split().count("a") == 1  # the rewound unit replays its effects from the journal


def test_agent_plans_units_and_the_control_api_runs_detached(tmp_path: Path) -> None:
    from keel.server.engine import control, hostlock

    side = tmp_path / "side.log"
    units = [
        {
            "id": "plan",
            "params": {
                "steps": [
                    {"evidence": {"kind": "note", "summary": "planning"}},
                    {
                        "add_units": [
                            {
                                "id": "later",
                                "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo later >> {side}"}}]},
                            }
                        ]
                    },
                ]
            },
        }
    ]
    store = tmp_path / "store"
    mid = control.start_mission(store, write_mission(tmp_path, units), detach=True)
    wait_for(lambda: store_exists(store) and record(store, mid).state == MissionState.COMPLETED, timeout=30)
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    assert set(head.units) == {"plan", "later"} and head.units["later"].state.value == "succeeded"
    assert side.read_text().split() == ["later"]
    assert next(e.summary for _, e in read(store, lambda t: list(m.evidence_after(t, mid)))) == "planning"
    assert "plan: plan added 1" in [p.reason for p in read(store, lambda t: m.restore_points(t, mid))]
    wait_for(lambda: not hostlock.host_alive(record(store, mid)))
    assert (tmp_path / "logs" / f"{mid}.log").exists()  # the detached host's own log file


def _freeze_outside_a_write(pid: int, store: Path) -> None:
    """SIGSTOP the host at a moment it holds neither byte of the LMDB store's writer lock: frozen inside a
    write it would make every other writer give up (exit 7, naming it), which is tested elsewhere."""
    for _ in range(200):
        stop_process(pid)
        lock = store / LOCK_NAME
        if not lock.exists():
            return
        with lock.open("rb") as f:
            if pid not in (holder_pid(f.fileno(), 0), holder_pid(f.fileno(), 1)):
                return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)
    raise AssertionError(f"host {pid} was inside a write every time it was frozen")


def test_a_pause_the_host_never_acknowledged_is_honoured_after_a_crash(tmp_path: Path) -> None:
    store = tmp_path / "store"
    units = [
        {
            "id": f"w{i}",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": f"w{i}-1.txt", "content": "one\n"}},
                    {"sleep": 0.4},
                    {"tool": "write_file", "args": {"path": f"w{i}-2.txt", "content": "two\n"}},
                ]
            },
        }
        for i in range(3)
    ]
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: record(store, mid).state == MissionState.RUNNING)
    time.sleep(0.2)
    _freeze_outside_a_write(host.pid, store)  # frozen: alive, but it cannot see the request
    keel("pause", mid, store=store, check_rc=0)
    assert record(store, mid).state == MissionState.RUNNING
    kill(host)
    assert keel("resume", mid, store=store).returncode == 3  # the restarted host honours the pause first
    assert record(store, mid).state == MissionState.PAUSED
    keel("resume", mid, store=store, check_rc=0)
    sandbox = sandbox_of(store, mid)
    assert sorted(p.name for p in sandbox.glob("w*.txt")) == sorted(f"w{i}-{k}.txt" for i in range(3) for k in (1, 2))


def test_snapshot_checkpoints_come_at_the_policys_interval_not_after_every_step(tmp_path: Path) -> None:
    """`policy = "interval"`: a snapshot checkpoint when interval_ms has passed since the last one, so a
    unit of 24 steps of 50 ms or more makes about one per 300 ms of its run, never one per step."""
    steps = [{"tool": "run", "args": {"cmd": "sleep 0.05"}} for _ in range(24)]
    mission = write_mission(
        tmp_path, [{"id": "u1", "params": {"steps": steps}}], checkpoint={"policy": "interval", "interval_ms": 300}
    )
    store = tmp_path / "store"
    keel("run", str(mission), "--plain", store=store, timeout=120, check_rc=0)
    mid = read(store, m.list_missions)[0].id
    entries = read(store, lambda t: m.journal_entries(t, mid, "u1"))
    run_ms = (entries[-1].at - entries[0].at) * 1000
    snapshots = [p for p in read(store, lambda t: m.restore_points(t, mid)) if p.reason == "snapshot"]
    assert len(entries) == 24 and run_ms >= 24 * 50
    assert 1 <= len(snapshots) <= run_ms / 300 + 2, f"{len(snapshots)} snapshots in {run_ms:.0f} ms of steps"
