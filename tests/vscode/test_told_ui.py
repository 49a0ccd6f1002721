"""The editor says what just happened, in real VS Code (code-server + the packaged VSIX + headless Chromium,
tests/vscode/page.mjs, scene "told"), each with dark and light screenshots in test-artifacts/vscode/:
a host SIGKILLed while its unit ran (the language server restarts it) → "host lost, resumed from the
journal: N step(s) kept"; Restore with Files → "rewound to p2" with Resume, and the diff tab of the old
files closed; Fork → a name asked (defaulted), where it went, Resume / Open Mission; a call that failed
over past two endpoints → one failover (one point, a "switched" icon); a mission paused for policy keeps
its reason on its row and page after the toasts are gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from keel.storage import Store
from keel.storage import missions as m

from .conftest import keel, mission_file, workspace
from .test_mission_page import write
from .test_ui_items import failover_servers, run_scene, wait_for

MODEL_STEP = '{ model = { messages = [{ role = "user", content = "hi" }] } }'


def kill_host(store: Path, mission_id: str) -> int:
    """SIGKILL the mission's host (and its agent: the host leads its process group); returns its pid."""
    with Store.open(store) as opened:
        record = opened.read(lambda t: m.get_mission(t, mission_id))
    assert record.host is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.host.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(record.host.pid, 0)
        except ProcessLookupError:
            return record.host.pid
        assert time.monotonic() < deadline, "the host outlived SIGKILL"
        time.sleep(0.1)


def start_missions(ws: Path) -> dict[str, str]:
    store = ws / ".keel" / "store"
    files = {
        "survive": mission_file(
            ws, "survive", [("u1", "Write and wait", [], f"[{write('a.txt', 's')}, {{ sleep = 600 }}]")]
        ),
        "rewind": mission_file(
            ws,
            "rewind-me",
            [("u1", "First", [], f"[{write('a.txt', 'one')}]"), ("u2", "Second", ["u1"], f"[{write('a.txt', 'two')}]")],
        ),
        "failover": mission_file(ws, "summarise", [("s1", "Summarise", [], f"[{MODEL_STEP}]")]),
        "strict": mission_file(ws, "strict", [("l1", "Local only", [], f"[{MODEL_STEP}]")]),
    }
    with files["strict"].open("a") as f:
        f.write("[models.require]\nlocal_only = true\n")  # no configured provider is local
    ids = {kind: keel("run", str(path), "--detach", cwd=ws) for kind, path in files.items()}
    wait_for(store, "survive's write journaled", lambda t: any(m.journal_entries(t, ids["survive"], "u1")))
    for kind in ("rewind", "failover"):
        wait_for(store, f"{kind} completed", lambda t, k=kind: m.get_mission(t, ids[k]).state.value == "completed")
    wait_for(store, "strict paused", lambda t: m.get_mission(t, ids["strict"]).state.value == "paused")
    kill_host(store, ids["survive"])  # the language server finds it dead and resumes it
    return ids


def test_what_just_happened_in_vscode(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    ws = workspace(tmp_path / "ws")
    names = {"survive": "survive", "rewind": "rewind-me", "failover": "summarise", "strict": "strict"}
    with failover_servers(ws):
        ids = start_missions(ws)
        seen = run_scene(code_server, drive, vsix, ws, "told", {"missions": names, "forkName": "rewind-v2"}, "page.mjs")

    # host lost and resumed: said once, with what was kept; the page marks it and counts the work kept
    assert "survive: host lost, resumed from the journal: 1 step(s) kept" in seen["hostLostToast"]
    assert any("mark-host" in c for c in seen["hostLostPage"]["marks"])
    assert any("u1: 1 kept" in t for t in seen["hostLostPage"]["totals"]), seen["hostLostPage"]["totals"]
    # restore with files: told, with Resume; the stale diff tab closed; Resume runs it to the end
    assert seen["rewindDialog"]["primary"] == "Restore with Files"
    assert "rewound to p2 (progress and files), paused" in seen["rewoundToast"] and "Resume" in seen["rewoundToast"]
    assert "1 diff tab of its old files closed" in seen["rewoundToast"]
    assert any("a.txt" in t for t in seen["diffTabs"]) and not any("a.txt" in t for t in seen["tabsAfterRestore"])
    assert "completed" in seen["resumedRow"] and (ws / ".keel").exists()
    # fork: a name asked with the original's as default; where it went; Resume and Open Mission
    assert seen["forkPrompt"]["value"] == "rewind-me" and "Name of the new mission" in seen["forkPrompt"]["text"]
    assert 'as "rewind-v2 (fork of p3)"' in seen["forkToast"] and "Missions view" in seen["forkToast"]
    assert (
        "Resume" in seen["forkToast"] and "Open Mission" in seen["forkToast"] and ids["rewind"] not in seen["forkToast"]
    )
    assert "paused" in seen["forkRow"] and seen["forkPage"]["title"].startswith("rewind-v2 (fork of p3)")
    # failover: one row, one point, a switch (not an error)
    page = seen["failoverPage"]
    assert sum("⇄" in r for r in page["rows"]) == 1 and not any("failover" in r and "✕" in r for r in page["rows"])
    assert [c for c in page["marks"] if "mark-switches" in c] == ["mark mark-switches"]
    assert sum("failover" in r for r in seen["failoverPoints"]) == 1, seen["failoverPoints"]
    assert any("codicon-arrow-swap" in c for c in seen["failoverPointIcons"]), seen["failoverPointIcons"]
    assert not any("codicon-error" in c for c in seen["failoverPointIcons"])
    # policy: the reason on the row and the page, still there once the toasts are gone
    for row in (seen["policyRow"], seen["policyRowLater"]):
        assert "paused (policy: no configured model meets the mission's requirements" in row, row
    later = seen["policyPageLater"]
    assert any("Paused for policy: no configured model meets" in r for r in later["reasons"]), later["reasons"]
