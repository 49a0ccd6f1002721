"""The VS Code review's items, each driven through real VS Code (code-server + the packaged VSIX + headless
Chromium, tests/vscode/items.mjs) as a person would, with screenshots named after the item in
test-artifacts/vscode/ (dark and light theme where the item is visual).

The main scene's store holds real missions run by detached hosts with the scripted agent: one running (its
second unit sleeps), one waiting for a free-text answer; a third is started from the palette and fails over
between real loopback model servers (a rate-limited one, a dead one, a priced healthy one). The first-run
scene points keel.python at a Python without keel and fixes it through the Choose Interpreter command.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.storage import Store
from keel.storage import missions as m
from tests.faultserver import FaultServer, ok, rate_limited
from tests.hosts import kill_hosts

from .conftest import ARTIFACTS, keel, mission_file, workspace

ANSWER = "keep the notes short"
QUESTION = "What should the release notes stress?"


def wait_for(store: Path, what: str, probe: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with Store.open(store) as opened:
            if opened.read(probe):
                return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def dead_url() -> str:
    """A loopback URL where nothing listens (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def provider_config(ws: Path, limited: FaultServer, good: FaultServer) -> None:
    """a: rate-limited (cools down 150 s), d: dead, b: answers (priced), c: dead and never reached."""
    rows = [
        ("a", limited.url, ""),
        ("d", dead_url(), ""),
        ("b", good.url, "cost = { input_per_mtok = 300.0, output_per_mtok = 1500.0 }\n"),
        ("c", dead_url(), ""),
    ]
    text = "".join(
        f'[[providers]]\nname = "{name}"\nkind = "openai-compatible"\nmodel = "{name}-model"\nstream = false\n'
        + ('api_key_env = "KEEL_VSCODE_TEST_PASS"\n' if name != "c" else "")
        + f'endpoints = [{{ url = "{url}" }}]\n{extra}\n'
        for name, url, extra in rows
    )
    (ws / ".keel").mkdir(exist_ok=True)
    (ws / ".keel" / "config.toml").write_text(text)


def asking_mission(ws: Path) -> Path:
    """release-notes: one unit that asks QUESTION (free text), then writes notes.txt."""
    write = '{ tool = "write_file", args = { path = "notes.txt", content = "n\\n" } }'
    return mission_file(ws, "release-notes", [("q1", "Ask what matters", [], f'[{{ ask = "{QUESTION}" }}, {write}]')])


def start_missions(ws: Path) -> dict[str, str]:
    store = ws / ".keel" / "store"
    running = mission_file(
        ws,
        "write-docs",
        [
            (
                "u1",
                "Write the guide",
                [],
                '[{ tool = "write_file", args = { path = "docs.txt", content = "guide\\n" } }]',
            ),
            ("u2", "Review the guide", ["u1"], "[{ sleep = 600 }]"),
            ("u3", "Publish", ["u2"], "[]"),
        ],
    )
    asking = asking_mission(ws)
    mission_file(
        ws,
        "summarise",
        [("s1", "Summarise", [], '[{ model = { messages = [{ role = "user", content = "hi" }] } }, { sleep = 25 }]')],
    )
    ids = {
        "running": keel("run", str(running), "--detach", cwd=ws),
        "asking": keel("run", str(asking), "--detach", cwd=ws),
    }
    wait_for(
        store,
        "u2 running",
        lambda t: any(e.unit == "u2" and e.state == "running" for _, e in m.events_after(t, ids["running"])),
    )
    wait_for(store, "the question", lambda t: m.get_mission(t, ids["asking"]).state.value == "waiting_input")
    return ids


def run_scene(
    code_server, drive, vsix: Path, ws: Path, scene: str, extra: dict[str, Any], script: str = "items.mjs"
) -> dict[str, Any]:
    server = code_server()
    server.install(vsix)
    server.start()
    settings = server.home / "user-data" / "User" / "settings.json"
    config = {
        "scene": scene,
        "url": f"{server.url}/?folder={urllib.parse.quote(str(ws))}",
        "shots": str(ARTIFACTS),
        "userSettings": str(settings),
        **extra,
    }
    out = drive(config, timeout=840, script=script)
    (ARTIFACTS / f"items-{scene}.json").write_text(json.dumps(out, indent=2))
    assert out["ok"], (
        f"{out.get('error')}\n{brief(out.get('seen') or {})}\n"
        + "\n".join(out.get("console", [])[-30:])
        + server.log_tail()
    )
    for shot in out["shots"]:
        assert Path(shot).stat().st_size > 10_000, shot
    return dict(out["seen"])


def brief(seen: dict[str, Any]) -> str:
    """What a scene saw, every key in view: each value cut to a few hundred characters (the whole of it is in
    test-artifacts/vscode/items-SCENE.json)."""
    return "\n".join(f"{key}: {json.dumps(value)[:300]}" for key, value in seen.items())


@contextlib.contextmanager
def failover_servers(ws: Path) -> Iterator[None]:
    """The providers of provider_config, running: a model call fails over from a (rate-limited) past d
    (dead) to b, which answers once. The hosts the test started are killed before the servers stop."""
    limited, good = FaultServer().start(), FaultServer().start()
    limited.push(rate_limited("150"))  # past the retry-after cap: fail over at once
    good.push(ok("a summary"))
    provider_config(ws, limited, good)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        kill_hosts(ws / ".keel" / "store")
        limited.stop()
        good.stop()


def test_review_items_in_vscode(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    ws = workspace(tmp_path / "ws")
    with failover_servers(ws):
        start_missions(ws)
        seen = run_scene(
            code_server,
            drive,
            vsix,
            ws,
            "main",
            {
                "running": "write-docs",
                "asking": "release-notes",
                "question": QUESTION,
                "answer": ANSWER,
                "failover": "summarise",
                "failoverFile": "summarise.mission.toml",
            },
        )

    # layout: Missions has the most room; Pause All is a pause icon; no icon ids in accessible labels
    layout = seen["layout"]
    assert layout["missions"] > 2 * max(layout["points"], layout["subagents"], layout["providers"]), layout
    pause_all = next(a for a in seen["titleActions"] if a[0] == "Pause All Missions")
    assert "codicon-debug-pause" in pause_all[1] and "debug-stop" not in pause_all[1]
    # live unit states, and the row names the current unit
    assert "running" in seen["liveMission"] and "u2 Review the guide" in seen["liveMission"]
    assert "succeeded" in seen["liveUnits"][0] and "running" in seen["liveUnits"][1]
    # questions: a toast with Answer; the question stays the title while typing; no "attempt 2"
    assert QUESTION in seen["questionToast"] and "Answer" in seen["questionToast"]
    assert QUESTION in seen["questionWhileTyping"] and ANSWER not in seen["questionWhileTyping"].split(QUESTION)[0]
    assert "succeeded" in seen["answeredUnit"] and "attempt" not in seen["answeredUnit"]
    # completion is offered for review / apply (the status bar keeping it: test_ui.py, where nothing else runs)
    assert "release-notes completed" in seen["completionToast"]
    assert "Review Changes" in seen["completionToast"] and "Apply" in seen["completionToast"]
    assert any("notes.txt" in r for r in seen["reviewPick"]["rows"])
    # jargon after a normal pause
    assert "paused (operator)" in seen["pausedRow"]
    assert any(u.startswith("u2") and "paused" in u for u in seen["pausedUnits"])
    assert not any("resumable" in u for u in seen["pausedUnits"])
    assert not any("orphaned" in r for r in seen["pausedSubagents"])
    labels = " ".join(str(a) for a in seen["pausedAria"]) + seen["pausedStatus"]["aria"]
    assert "debug-pause" not in labels and "sync~spin" not in labels
    # Apply from the palette: pick, state, files, confirmation
    assert any("write-docs" in r and "paused" in r for r in seen["applyPick"]["rows"])
    dialog = seen["applyDialog"]
    assert "write-docs" in dialog["text"] and "paused" in dialog["text"] and "docs.txt" in dialog["text"]
    assert "not completed" in dialog["text"] and dialog["primary"] == "Apply" and "Cancel" in dialog["buttons"]
    assert not (ws / "docs.txt").exists()  # cancelled: nothing applied
    # palette Diff / Fork pick what they need
    assert seen["diffPointPick"]["rows"] and "docs.txt" in " ".join(seen["diffFilePick"]["rows"])
    assert "docs.txt" in seen["diffTab"]
    assert seen["forkPointPick"]["title"].startswith("Fork from which point")
    assert seen["forkSelected"].startswith("write-docs (fork of p2)")
    assert "paused (forked at p2)" in seen["forkRow"] and "operator" not in seen["forkRow"]
    assert "write-docs (fork of p2)" in seen["forkToast"] and "m1" not in seen["forkToast"]  # names, not ids
    assert "fork of p2" in seen["pointsDescription"]
    # restore: default rewinds files, inline Restore with Files asks, distinct icons, ages move
    assert seen["restoreDialog"]["primary"] == "Restore with Files"
    assert "Restore Progress Only" in seen["restoreDialog"]["buttons"]
    assert seen["restoreFilesDialog"]["primary"] == "Restore with Files"
    icons = [c for _, c in seen["pointInline"]]
    row_icon = seen["pointIcons"][0]
    assert len(set(icons)) == 4 and not any(c.split()[-1] in row_icon for c in icons), (icons, row_icon)
    assert seen["pointAges"][0] != seen["pointAges"][1]
    # cancel and delete
    assert "Cancel Mission" in seen["cancelDialog"]["buttons"] and "cancelled" in seen["cancelledRow"]
    assert "Delete" in seen["deleteDialog"]["buttons"] and not any("fork" in r for r in seen["afterDelete"])
    # failover: notification, status-bar sign, served model; provider words; countdown; key only when set
    assert "now served by b/b-model" in seen["failoverToast"]
    assert "b/b-model" in seen["failoverStatus"]["text"] and "b/b-model" in seen["failoverRow"]
    providers = {r[:3]: r for r in seen["providers"]}  # "a/0" then its description
    assert "not used yet" in providers["c/0"] and "unreachable" in providers["d/0"], providers
    assert "active" in providers["b/0"] and "cooling" in providers["a/0"]
    first, later = seen["coolingCountdown"]
    assert 0 < later < first, seen["coolingCountdown"]
    assert "tokens" in seen["usageRow"] and "cost" in seen["usageRow"]
    assert "tokens: 7 in + 3 out" in seen["usageTooltip"] and "served by: b/b-model" in seen["usageTooltip"]


def test_first_run_in_vscode(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    ws = workspace(tmp_path / "ws", python=str(bare / "bin" / "python"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    seen = run_scene(code_server, drive, vsix, ws, "firstRun", {"python": sys.executable})
    assert "not installed" in seen["notInstalledWelcome"] and "Choose Interpreter" in seen["notInstalledWelcome"]
    assert "No missions" not in seen["notInstalledWelcome"]
    assert "own environment from the copy this extension carries" in seen["notInstalledToast"]
    assert "Open the keel.python setting" in " ".join(seen["interpreterPick"]["rows"])
    assert "Python interpreter that has keel" in seen["settingsEditor"]
    assert "No missions" in seen["fixedWelcome"]
    assert not any("not installed" in t for t in seen["toastsAfterFix"])
    assert json.loads((ws / ".vscode" / "settings.json").read_text())["keel.python"] == sys.executable


def test_install_keel_in_vscode(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    """Item 9: on a machine where keel is installed nowhere, the toast's Install keel makes keel's own environment
    (the extension's global storage) from the wheel the VSIX carries, points keel.python at it, and keel starts
    from there: the Missions view's welcome is the running one."""
    bare = tmp_path / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    ws = workspace(tmp_path / "ws", python=str(bare / "bin" / "python"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    seen = run_scene(code_server, drive, vsix, ws, "firstRunInstall", {})
    assert "Install keel" in seen["installButtons"], seen["installButtons"]
    assert any("keel install" in t for t in seen["installTerminal"]), seen["installTerminal"]  # run in a terminal
    assert "No missions" in seen["installedWelcome"]
    chosen = Path(json.loads((ws / ".vscode" / "settings.json").read_text())["keel.python"])
    assert chosen.parent.parent.name == "python-env" and "globalStorage" in chosen.parts, chosen
    where = subprocess.run(
        [chosen, "-c", "import keel.server; print(keel.server.__file__)"], capture_output=True, text=True, check=True
    )
    assert Path(where.stdout.strip()).is_relative_to(chosen.parent.parent)  # the wheel's copy, not this checkout


def test_first_run_offers_the_workspace_venv(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    """No keel.python setting and no keel for python3 on PATH (VS Code started from the desktop), but the
    workspace's .venv has keel: the toast offers "Use .venv"; then Start Mission in a workspace with no
    mission file offers to create one, which writes the mission file and .keel/config.toml."""
    on_path = shutil.which("python3")
    if (
        on_path
        and subprocess.run([on_path, "-c", "import keel.server"], capture_output=True, check=False).returncode == 0
    ):
        pytest.skip(f"{on_path} on PATH has keel installed: the first run without keel cannot be shown here")
    ws = tmp_path / "ws"
    venv = ws / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this run's keel
    (venv / "python").chmod(0o755)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    seen = run_scene(code_server, drive, vsix, ws, "firstRunVenv", {})
    assert "keel is not installed for python3 (PATH). .venv has keel." in seen["venvToast"], seen["venvToast"]
    assert seen["venvButtons"][:3] == ["Use .venv", "Install keel", "Choose Interpreter…"], seen["venvButtons"]
    assert "No missions" in seen["venvWelcome"]
    assert json.loads((ws / ".vscode" / "settings.json").read_text())["keel.python"] == str(venv / "python")
    assert any("Create a mission file" in r for r in seen["startPick"]["rows"]), seen["startPick"]
    assert (ws / "mission.toml").exists() and (ws / ".keel" / "config.toml").exists()
    assert "mission.toml and .keel/config.toml" in seen["createdToast"], seen["createdToast"]
    assert any(t.replace(" ", "") == "mission.toml" for t in seen["createdTabs"]), seen["createdTabs"]
