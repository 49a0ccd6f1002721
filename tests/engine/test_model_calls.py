"""model/complete through the mission host and real fault servers on loopback: the served model and cost
in the journal, replay without HTTP, failover evidence and restore points, policy pauses, and the API
key kept out of the store, logs, evidence and the agent's environment."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import keel, record, start_keel, write_mission
from modelkit import (
    FAST,
    KEY,
    KEY_VAR,
    NO_KEYRING,
    FaultServer,
    agent_pids,
    config_blob,
    error,
    evidence,
    fault_servers,  # noqa: F401 (the `faults` fixture)
    files_containing,
    journal,
    ok,
    points,
    provider,
    write_config,
)

from keel.protocol.states import MissionState, PauseReason

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

HELLO = {"messages": [{"role": "user", "content": "say hello"}], "purpose": "greeting"}


def test_failover_is_recorded_and_a_replayed_call_sends_nothing(
    tmp_path: Path, faults: Callable[..., FaultServer]
) -> None:
    a, b = faults(), faults()
    a.push(error(401, "invalid_api_key", "Incorrect API key provided"))
    b.push(ok("hello from b"))
    write_config(tmp_path / "ws", [provider("a", a, api_key_env=KEY_VAR), provider("b", b)])
    once = tmp_path / "died-once"
    units = [
        {
            "id": "greet",
            "params": {
                "steps": [
                    {"model": HELLO},
                    {"sleep": 0.6},
                    {"exit": 9, "once_file": str(once)},
                    {"evidence": {"kind": "note", "summary": "after the replay"}},
                ]
            },
        }
    ]
    mission = write_mission(tmp_path, units)
    store = tmp_path / ".keel" / "store"
    env = {KEY_VAR: KEY, **NO_KEYRING}
    proc = start_keel("run", str(mission), store=store, env=env)
    environs = _agent_environs(proc, str(tmp_path / ".keel" / "sandboxes"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    mid = json.loads(out.splitlines()[0])["mission"]
    exit_event = next(json.loads(line) for line in out.splitlines() if '"host_exit"' in line)
    assert exit_event["replayed"] == 1  # the restarted agent got the model call from the journal

    assert len(a.posts) == 1 and a.posts[0].headers["authorization"] == f"Bearer {KEY}"
    assert len(b.posts) == 1 and "authorization" not in b.posts[0].headers  # b has no key: none is sent
    calls = [e for e in journal(store, mid, "greet") if e.kind == "model/complete"]
    assert len(calls) == 1
    assert calls[0].served_model == "b-model" and calls[0].cost.tokens == 10
    assert calls[0].result["provider"] == "b" and calls[0].result["message"]["content"] == "hello from b"

    failovers = [e for e in evidence(store, mid) if e.kind == "failover"]
    assert len(failovers) == 1 and failovers[0].unit == "greet"
    assert failovers[0].data["from"] == "a/0" and failovers[0].data["to"] == "b/0"
    assert failovers[0].data["reason"] == "auth"
    by_reason = {p.reason: p for p in points(store, mid)}
    assert "failover: a/0 -> b/0" in by_reason, list(by_reason)
    before, after = config_blob(store, by_reason["started"]), config_blob(store, by_reason["failover: a/0 -> b/0"])
    assert before.pop("active_model") == "" and after.pop("active_model") == "b/b-model"
    assert before == after  # permissions and policies are what they were
    assert config_blob(store, by_reason["completed"])["active_model"] == "b/b-model"

    assert environs, "the agent was never seen running"
    for environ in environs:
        assert KEY.encode() not in environ and KEY_VAR.encode() not in environ
    assert files_containing(tmp_path / ".keel", KEY) == []  # store, logs, sandboxes
    assert KEY not in out + err
    assert KEY not in json.dumps([e.data for e in evidence(store, mid)])


def test_a_provider_that_failed_cools_down_one_failover_one_point(
    tmp_path: Path, faults: Callable[..., FaultServer]
) -> None:
    """a answers 503 to everything: the unit's first call fails over to b and a cools down, so its second
    call goes straight to b. One incident: one failover, one restore point, naming the cause."""
    a, b = faults(default=error(503, "overloaded", "the servers are busy")), faults()
    write_config(tmp_path / "ws", [provider("a", a), provider("b", b)], network={**FAST, "cooldown_s": 120.0})
    again = {"messages": [{"role": "user", "content": "say it again"}], "purpose": "greeting"}
    mission = write_mission(tmp_path, [{"id": "greet", "params": {"steps": [{"model": HELLO}, {"model": again}]}}])
    store = tmp_path / ".keel" / "store"
    proc = keel("run", str(mission), "--json", store=store, env=NO_KEYRING)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    assert record(store, mid).state == MissionState.COMPLETED
    calls = [e for e in journal(store, mid, "greet") if e.kind == "model/complete"]
    assert [c.result["provider"] for c in calls] == ["b", "b"]
    assert len(a.posts) == FAST["max_attempts"] and len(b.posts) == 2  # a: the first call only
    [failover] = [e for e in evidence(store, mid) if e.kind == "failover"]
    assert failover.summary.startswith(
        "failover a/0 -> b/0 (server_error, HTTP 503 Service Unavailable: the servers are busy); now serving b/"
    ), failover.summary
    assert failover.data["status"] == 503 and failover.data["providers"] == "command:keel.providers.focus"
    assert [p.reason for p in points(store, mid) if p.reason.startswith("failover")] == ["failover: a/0 -> b/0"]


def test_failover_never_pauses_the_mission_for_policy(tmp_path: Path, faults: Callable[..., FaultServer]) -> None:
    a, b = faults(), faults()
    a.push(error(403, "forbidden", "no access to this model"))
    write_config(tmp_path / "ws", [provider("a", a), provider("b", b)])
    mission = write_mission(
        tmp_path,
        [{"id": "greet", "params": {"steps": [{"model": HELLO}]}}],
        models={"failover": "never", "prefer": ["a"]},
    )
    store = tmp_path / ".keel" / "store"
    proc = keel("run", str(mission), "--json", store=store, env=NO_KEYRING, check_rc=3)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    rec = record(store, mid)
    assert rec.state == MissionState.PAUSED and rec.pause_reason == PauseReason.POLICY
    assert "failover = never" in rec.error and "a/0" in rec.error and "403" in rec.error
    assert len(b.posts) == 0 and journal(store, mid, "greet") == []
    assert [p.reason for p in points(store, mid)][-1] == "paused: policy"


def _agent_environs(proc: object, sandboxes: str) -> list[bytes]:
    """/proc/<pid>/environ of every agent seen while the mission runs."""
    seen: dict[int, bytes] = {}
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:  # type: ignore[attr-defined]
        for pid in agent_pids(sandboxes):
            if pid not in seen:
                try:
                    seen[pid] = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
        time.sleep(0.02)
    assert os.environ.get(KEY_VAR) is None  # the key only ever lived in the host's environment
    return list(seen.values())
