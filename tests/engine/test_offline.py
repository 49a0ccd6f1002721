"""Total network loss during a real mission: the coder agent against the loopback OpenAI-compatible fault
server. The server stops midway, the mission goes offline, the server comes back and the mission resumes
by itself and completes — with every journal entry once and no model answer paid for twice. Also: `keel
run` exits 3 offline without `--wait-online`, and a mission a person paused is never resumed by the prober."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import keel, kill, mission_id_of, record, start_keel, wait_for, write_mission
from modelkit import (
    NO_KEYRING,
    FaultServer,
    delay,
    fault_servers,  # noqa: F401 (the `faults` fixture)
    journal,
    ok,
    points,
    provider,
    write_config,
)

from keel.protocol.states import MissionState, PauseReason

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

BUGGY = "def add(a, b):\n    return a - b\n"
CHECK = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"
FIX = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
CODER = [sys.executable, "-m", "keel.agents.coder"]
UNIT = {
    "id": "fix",
    "kind": "code",
    "title": "Fix add",
    "params": {"task": "Make add() correct.", "verify": "python check_calc.py"},
}


def tool_calls(name: str, args: dict[str, Any], n: int) -> tuple[dict[str, Any], ...]:
    return ({"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}},)


READ = ok(tool_calls=tool_calls("read_file", {"path": "calc.py"}, 1))
APPLY = ok(tool_calls=tool_calls("apply_diff", {"diff": FIX}, 2))
VERIFY = ok(tool_calls=tool_calls("run", {"cmd": "python check_calc.py", "verify": True}, 3))
DONE = ok("Fixed add(); check_calc.py passes.")


def _workspace(tmp_path: Path, server: FaultServer | str, **models: Any) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "calc.py").write_text(BUGGY)
    (ws / "check_calc.py").write_text(CHECK)
    write_config(ws, [provider("local", server, capabilities={"tools": True, "context_window": 32000, "local": True})])
    return write_mission(
        tmp_path, [UNIT], agent=CODER, goal="Make add() correct", **({"models": models} if models else {})
    )


def test_coder_survives_a_provider_outage_and_resumes_by_itself(
    tmp_path: Path, faults: Callable[..., FaultServer]
) -> None:
    server = faults()
    server.push(READ, APPLY, delay(30, then=VERIFY))  # the third answer never comes: the network goes
    mission = _workspace(tmp_path, server)
    store = tmp_path / ".keel" / "store"
    proc = start_keel("run", str(mission), "--wait-online", store=store, env=NO_KEYRING)
    try:
        mid = mission_id_of(proc)
        wait_for(lambda: len(server.posts) == 3, timeout=30)
        server.stop()
        wait_for(lambda: record(store, mid).state == MissionState.OFFLINE, timeout=30)
        offline = record(store, mid)
        assert offline.pause_reason == PauseReason.OFFLINE and offline.error.startswith("offline:")
        assert proc.poll() is None  # the host waits, probing
        server.push(VERIFY, DONE)
        server.start()
        out, err = proc.communicate(timeout=60)
    finally:
        kill(proc)
    assert proc.returncode == 0, out + err
    assert record(store, mid).state == MissionState.COMPLETED
    assert (Path(record(store, mid).sandbox) / "calc.py").read_text() == BUGGY.replace("a - b", "a + b")

    entries = journal(store, mid, "fix")
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))  # nothing lost, nothing twice
    kinds = [e.kind for e in entries]
    assert kinds.count("model/complete") == 4
    tools = [e.result["output"].get("path") or e.summary for e in entries if e.kind == "tool/run"]
    assert len(tools) == 4, tools  # read, apply_diff, the model's verify run, the unit's own check
    assert all(e.phase == "done" for e in entries)
    model_calls = [e for e in entries if e.kind == "model/complete"]
    assert sum(e.cost.tokens for e in model_calls) == 4 * 10
    assert {e.served_model for e in model_calls} == {"local-model"}

    bodies = [json.dumps(p.body["messages"], sort_keys=True) for p in server.posts]
    assert len(bodies) == 5  # 4 answered + the one cut by the outage, sent again after it
    assert bodies[2] == bodies[3] and len(set(bodies)) == 4  # only the unanswered call went out twice
    reasons = [p.reason for p in points(store, mid)]
    assert "offline" in reasons and reasons[-1] == "completed"
    assert server.requests[-1].method == "POST" and any(r.method == "GET" for r in server.requests)  # probed


def test_run_exits_3_offline_and_a_person_pause_is_never_undone(tmp_path: Path) -> None:
    down = "http://127.0.0.1:9/v1"  # the discard port: nothing listens, connection refused
    mission = _workspace(tmp_path, down)
    store = tmp_path / ".keel" / "store"
    proc = keel("run", str(mission), "--json", store=store, env=NO_KEYRING, check_rc=3)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    rec = record(store, mid)
    assert rec.state == MissionState.OFFLINE and rec.pause_reason == PauseReason.OFFLINE
    assert "connection" in rec.error and points(store, mid)[-1].reason == "offline"
    assert "keel resume" in proc.stdout

    waiting = start_keel("resume", mid, "--wait-online", store=store, env=NO_KEYRING)
    try:
        wait_for(lambda: record(store, mid).host is not None and record(store, mid).state == MissionState.OFFLINE)
        keel("pause", mid, store=store, check_rc=0)
        waiting.communicate(timeout=20)
    finally:
        kill(waiting)
    assert waiting.returncode == 3
    rec = record(store, mid)
    assert rec.state == MissionState.PAUSED and rec.pause_reason == PauseReason.OPERATOR


def test_auto_resume_false_does_not_wait(tmp_path: Path) -> None:
    mission = _workspace(tmp_path, "http://127.0.0.1:9/v1", auto_resume=False)
    store = tmp_path / ".keel" / "store"
    proc = keel("run", str(mission), "--wait-online", "--json", store=store, env=NO_KEYRING, check_rc=3)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    assert record(store, mid).state == MissionState.OFFLINE
    assert '"waiting_online"' not in proc.stdout
