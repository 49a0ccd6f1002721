"""The person's path through real VS Code: code-server 4.139.1 + the packaged VSIX + headless Chromium.

drive.mjs starts a mission from the command palette, sees its rows in the keel view, pauses it from
the status bar, resumes it, and answers its question through the input box; the mission is real (a
detached host running the scripted agent). Screenshots go to test-artifacts/vscode/. Afterwards the
store must show that exact history and the answer typed in the browser.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from keel.storage import Store
from keel.storage import missions as m
from tests.hosts import kill_hosts

from .conftest import ARTIFACTS, mission_file, workspace

ANSWER = "use structlog everywhere"
HOST_GRACE_S = 10.0


def stop_host_left_waiting(store: Path, driver: threading.Thread) -> int:
    """While the browser works: a host still alive HOST_GRACE_S after its mission entered waiting_input
    is killed (SIGKILL), and the number of such kills returned.

    A host checkpoints and exits by itself when its mission waits for input, so this must never fire;
    it exists so that a host that stays is reported as such (the test asserts zero kills) instead of
    surfacing as an answer that is never applied.
    """
    kills = 0
    waiting_since: float | None = None
    while driver.is_alive():
        time.sleep(0.2)
        if not (store / "data.mdb").exists():
            continue
        with Store.open(store) as opened:
            records = opened.read(m.list_missions)
        record = records[0] if records else None
        if record is None or record.state.value != "waiting_input" or record.host is None:
            waiting_since = None
            continue
        waiting_since = waiting_since or time.monotonic()
        if time.monotonic() - waiting_since > HOST_GRACE_S:
            try:
                os.killpg(record.host.pid, signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
            waiting_since = None
    return kills


def test_pause_resume_answer_from_the_status_bar(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    ws = workspace(tmp_path / "ws")
    store = ws / ".keel" / "store"
    mission_file(
        ws,
        "migrate-logging",
        [
            ("u1", "Survey call sites", [], "[{ sleep = 6 }]"),
            ("u2", "Choose the logger", ["u1"], '[{ ask = "Which logging library should the code use?" }]'),
            ("u3", "Rewrite imports", ["u2"], "[{ now = true }]"),
        ],
    )
    server = code_server()
    server.install(vsix)
    server.start()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in [*ARTIFACTS.glob("[0-9]-*.png"), *ARTIFACTS.glob("failed-*.png")]:  # this test's, not the others'
        old.unlink()
    started = time.monotonic()
    result: dict[str, Any] = {}
    config = {
        "mode": "ui",
        "url": f"{server.url}/?folder={ws}",
        "mission": "migrate-logging",
        "missionFile": "migrate-logging.mission.toml",
        "units": 3,
        "answer": ANSWER,
        "shots": str(ARTIFACTS),
    }
    driver = threading.Thread(target=lambda: result.update(drive(config)))
    driver.start()
    try:
        kills = stop_host_left_waiting(store, driver)
    finally:
        driver.join()
        kill_hosts(store)
    out = {**result, "hostKills": kills, "seconds": round(time.monotonic() - started, 1)}
    (ARTIFACTS / "ui.json").write_text(json.dumps(out, indent=2))
    assert out["ok"], f"{out.get('error')}\n" + "\n".join(out.get("console", [])[-40:]) + server.log_tail()
    seen = out["seen"]

    assert "running" in seen["runningRow"] and "/3" in seen["runningRow"]
    assert [u.split()[0] for u in seen["unitRows"]] == ["u1", "u2", "u3"]
    assert seen["runningStatus"].startswith("keel: migrate-logging")
    assert "paused" in seen["pausedStatus"] and "paused (operator)" in seen["pausedRow"]
    assert seen["questionStatus"] == "keel: migrate-logging needs input"
    assert "waiting for input" in seen["questionRow"]
    assert "Which logging library should the code use?" in seen["inputPrompt"]
    assert seen["runningActions"] == ["Pause Mission"]
    assert seen["pausedActions"] == ["Resume Mission"]
    assert seen["questionActions"] == ["Answer Mission Question…"]
    assert seen["pointActions"] == [
        "Restore Mission to Point…",
        "Diff Point with Sandbox…",
        "Restore with Files…",
        "Fork Mission from Point…",
    ]
    assert "completed" in seen["completedRow"] and "3/3" in seen["completedRow"]
    assert seen["finalStatus"] == "keel: migrate-logging completed"  # kept until another mission starts
    assert all(Path(p).stat().st_size > 10_000 for p in out["shots"])

    with Store.open(store) as opened:

        def read(txn):
            [record] = m.list_missions(txn)
            return record, m.events_after(txn, record.id), m.journal_entries(txn, record.id, "u2")

        record, events, journal = opened.read(read)
    assert record.state.value == "completed"
    states = [e.state for _, e in events if e.kind == "state"]
    history = [s for s in states if s in {"paused", "running", "waiting_input", "completed"}]
    assert history == ["running", "paused", "running", "waiting_input", "running", "completed"], states
    asks = [e for e in journal if e.kind == "human/ask"]
    assert len(asks) == 1 and ANSWER in json.dumps(asks[0].result), asks
    assert kills == 0, "the host stayed alive in waiting_input"
