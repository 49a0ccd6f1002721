"""The mission page in real VS Code (code-server + the packaged VSIX + headless Chromium, tests/vscode/page.mjs):
a running mission, one paused with a question, one that failed over between real loopback model servers
and a completed one with a diamond task graph, each opened as a person would (palette or row) and shot in
the dark and the light theme into test-artifacts/vscode/vscode-page-*.png.
"""

from __future__ import annotations

from pathlib import Path

from keel.storage import missions as m

from .conftest import ARTIFACTS, keel, mission_file, workspace
from .test_ui_items import ANSWER, QUESTION, asking_mission, failover_servers, run_scene, wait_for

READ_DOCS = '{ tool = "read_file", args = { path = "docs.txt" } }'


def write(path: str, text: str) -> str:
    """A scripted step that writes `text` and a newline to `path` (TOML)."""
    return f'{{ tool = "write_file", args = {{ path = "{path}", content = "{text}\\n" }} }}'


def start_missions(ws: Path) -> dict[str, str]:
    store = ws / ".keel" / "store"
    files = {
        "running": mission_file(
            ws,
            "write-docs",
            [
                ("u1", "Write the guide", [], f"[{write('docs.txt', 'g')}]"),
                ("u2", "Review the guide", ["u1"], f"[{READ_DOCS}, {{ sleep = 600 }}]"),
                ("u3", "Publish", ["u2"], "[]"),
            ],
        ),
        "asking": asking_mission(ws),
        "failover": mission_file(
            ws,
            "summarise",
            [("s1", "Summarise", [], '[{ model = { messages = [{ role = "user", content = "hi" }] } }]')],
        ),
        "done": mission_file(
            ws,
            "diamond",
            [
                ("a", "Plan", [], f"[{write('plan.txt', 'p')}]"),
                ("b", "Left", ["a"], f"[{write('left.txt', 'l')}]"),
                ("c", "Right", ["a"], f"[{write('right.txt', 'r')}]"),
                ("d", "Join", ["b", "c"], "[]"),
            ],
        ),
    }
    ids = {kind: keel("run", str(path), "--detach", cwd=ws) for kind, path in files.items()}
    wait_for(
        store,
        "u2 running",
        lambda t: any(e.unit == "u2" and e.state == "running" for _, e in m.events_after(t, ids["running"])),
    )
    wait_for(store, "the question", lambda t: m.get_mission(t, ids["asking"]).state.value == "waiting_input")
    for kind in ("failover", "done"):
        wait_for(store, f"{kind} completed", lambda t, k=kind: m.get_mission(t, ids[k]).state.value == "completed")
    return ids


def test_mission_page_in_vscode(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    ws = workspace(tmp_path / "ws")
    with failover_servers(ws):
        start_missions(ws)
        names = {"running": "write-docs", "asking": "release-notes", "failover": "summarise", "done": "diamond"}
        seen = run_scene(code_server, drive, vsix, ws, "page", {"missions": names, "answer": ANSWER}, "page.mjs")

    # running: state as colour and icon on every node, the running unit's step on its node, live totals
    running = seen["running"]
    assert running["title"].startswith("write-docs") and "running" in running["title"]
    assert [n.split(":")[0] for n in running["nodes"]] == [
        "unit u1 Write the guide",
        "unit u2 Review the guide",
        "unit u3 Publish",
    ]
    assert "succeeded" in running["nodes"][0] and "running" in running["nodes"][1] and "pending" in running["nodes"][2]
    assert running["edges"] == 2 and any("now:" in s for s in running["runningSub"])
    assert "Pause" in running["actions"] and "Resume" not in running["actions"]
    assert any(t.startswith("wall time") for t in running["totals"])
    assert any("write_file docs.txt" in r for r in running["rows"]), running["rows"]
    # a question: its text, an answer button on the page; answering from the page finishes the mission
    asking = seen["asking"]
    assert QUESTION in " ".join(asking["question"]) and "waiting for input" in " ".join(asking["nodes"])
    assert QUESTION in seen["answerPrompt"] and not seen["quickInput"]
    answered = seen["answered"]
    assert "completed" in answered["title"]
    # 4: the unit that carried on after the answer is not a host loss: nothing on that lane, no resume counted
    assert not any("mark-host" in c for c in answered["marks"]), answered["marks"]
    assert "no resume yet" in " ".join(answered["totals"]), answered["totals"]
    assert (ws / ".keel").exists()
    # failover: one switch mark on the timeline (not an error), served model and cost with its currency
    failover = seen["failover"]
    switches = [c for c in failover["marks"] if "mark-switches" in c]
    assert len(switches) == 1 and "failed" not in switches[0], failover["marks"]
    totals = " | ".join(failover["totals"])
    assert "b/b-model" in totals and "USD" in totals and "model calls 1" in totals, totals
    assert any("⇄" in r for r in failover["rows"]), failover["rows"]
    # completed: the diamond drawn with its four `after` edges; a node shows its activity; a point its actions
    done = seen["done"]
    assert len(done["nodes"]) == 4 and done["edges"] == 4 and all("succeeded" in n for n in done["nodes"])
    assert "Apply…" in done["actions"] and "Pause" not in done["actions"]
    rows = seen["nodeActivity"]["rows"]
    assert rows and all(" b " in f" {r} " for r in rows) and any("left.txt" in r for r in rows), rows
    assert "Restore to p" in seen["pointDetail"] and "Fork from p" in seen["pointDetail"]
    shots = {Path(s).name for s in (ARTIFACTS / "items-page.json").read_text().split('"') if s.endswith(".png")}
    for name in ("running", "question", "failover", "completed", "point"):
        for kind in ("dark", "light"):
            assert f"vscode-page-{name}-{kind}.png" in shots
