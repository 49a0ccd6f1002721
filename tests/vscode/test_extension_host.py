"""Extension-host tests: the keel extension inside real VS Code, against a real `keel serve`.

The store holds three real missions run by detached hosts with the scripted agent — one running, one
waiting for input, one completed. code-server loads the extension from the source tree
(extensionDevelopmentPath) with client-vscode/out/test/suite.js as extensionTestsPath; the suite checks
commands, tree providers (Missions, Restore Points, Providers after a real failover from a 401 endpoint
on a loopback fault server), the status bar, a pause that comes back as keel/missionChanged, the
not-installed path, and the restore-point actions (a diff view of two keel-point documents, fork,
apply), and writes what it saw; this test asserts on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from keel.storage import Store
from keel.storage import missions as m
from tests.faultserver import FaultServer, error
from tests.hosts import kill_hosts

from .conftest import ARTIFACTS, ROOT, keel, mission_file, workspace

EXPECTED_COMMANDS = {
    "keel.startMission",
    "keel.pause",
    "keel.resume",
    "keel.pauseAll",
    "keel.answer",
    "keel.restore",
    "keel.verifyStore",
    "keel.refresh",
    "keel.restartServer",
    "keel.showLog",
    "keel.selectMission",
    "keel.fork",
    "keel.apply",
    "keel.export",
    "keel.import",
    "keel.restoreWithFiles",
    "keel.diffPoint",
}


def wait_state(store: Path, mission_id: str, state: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with Store.open(store) as opened:
            record = opened.read(lambda t: m.get_mission(t, mission_id))
        if record.state.value == state:
            return
        assert time.monotonic() < deadline, f"mission {mission_id} is {record.state.value}, not {state}"
        time.sleep(0.1)


def start_missions(ws: Path) -> dict[str, str]:
    files = {
        "alpha": mission_file(
            ws, "alpha", [("u1", "Survey", [], "[{ sleep = 120 }]"), ("u2", "Rewrite", ["u1"], "[]")]
        ),
        "beta": mission_file(ws, "beta", [("u1", "Ask", [], '[{ ask = "Which logger?" }]')]),
        "gamma": mission_file(
            ws,
            "gamma",
            [
                (
                    "u1",
                    "Only",
                    [],
                    "[{ now = true }, "
                    '{ model = { messages = [{ role = "user", content = "hi" }] } }, '
                    '{ tool = "write_file", args = '
                    '{ path = "g.txt", content = "gamma\\n" } }]',
                )
            ],
        ),
    }
    ids = {name: keel("run", str(path), "--detach", cwd=ws) for name, path in files.items()}
    store = ws / ".keel" / "store"
    for name, state in (("alpha", "running"), ("beta", "waiting_input"), ("gamma", "completed")):
        wait_state(store, ids[name], state)
    return ids


def row(rows: list[dict[str, Any]], mission_id: str) -> dict[str, Any]:
    return next(r for r in rows if r["id"] == mission_id)


def test_extension_host_suite(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    ws = workspace(tmp_path / "ws")
    store = ws / ".keel" / "store"
    bare = tmp_path / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    (ws / ".vscode-test").mkdir()
    (ws / ".vscode-test" / "config.json").write_text(json.dumps({"barePython": str(bare / "bin" / "python")}))
    a, b = FaultServer().start(), FaultServer().start()
    a.push(error(401, "invalid_api_key", "Incorrect API key provided"))
    (ws / ".keel").mkdir()
    (ws / ".keel" / "config.toml").write_text(
        "".join(
            f'[[providers]]\nname = "{name}"\nkind = "openai-compatible"\nmodel = "{name}-model"\n'
            f'api_key_env = "KEEL_VSCODE_TEST_PASS"\nendpoints = [{{ url = "{server.url}" }}]\n\n'
            for name, server in (("a", a), ("b", b))
        )
    )
    try:
        ids = start_missions(ws)
        server = code_server()
        server.start("--vscode-option", "enable-smoke-test-driver")
        remote = f"vscode-remote://127.0.0.1:{server.port}"
        payload = json.dumps(
            [
                ["extensionDevelopmentPath", f"{remote}{ROOT}"],
                ["extensionTestsPath", f"{remote}{ROOT}/client-vscode/out/test/suite.js"],
            ]
        )
        url = f"{server.url}/?folder={urllib.parse.quote(str(ws))}&payload={urllib.parse.quote(payload)}"
        started = time.monotonic()
        out = drive({"mode": "exthost", "url": url, "resultFile": str(ws / ".vscode-test" / "result.json")})
        took = time.monotonic() - started
    finally:
        kill_hosts(store)
        a.stop()
        b.stop()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "extension-host.json").write_text(json.dumps({**out, "took_s": round(took, 1)}, indent=2))
    assert out["ok"], f"driver failed: {out.get('error')}\n" + "\n".join(out.get("console", []))
    suite = out["suite"]
    failed = [r for r in suite["results"] if not r["ok"]]
    assert not failed, json.dumps(failed, indent=2) + "\n" + server.log_tail()
    assert len(suite["results"]) == 13  # every check of client-vscode/test/suite.ts ran
    seen = suite["observed"]

    assert set(seen["commands"]) >= EXPECTED_COMMANDS
    assert seen["interpreter"] == {"command": sys.executable, "source": "setting"}

    rows = seen["missionsTree"]
    assert [r["label"] for r in rows] == ["alpha", "beta", "gamma"]
    alpha, beta, gamma = row(rows, ids["alpha"]), row(rows, ids["beta"]), row(rows, ids["gamma"])
    assert (alpha["contextValue"], alpha["icon"]) == ("mission.running", "sync~spin")
    assert alpha["description"].startswith("running · 0/2")
    # The unit rows carry the live state the server reports (HEAD's marks; units a live host started since run).
    assert [u["label"] for u in alpha["units"]] == ["u1 Survey", "u2 Rewrite"]
    assert all(u["contextValue"] == f"unit.{u['description'].split()[0]}" for u in alpha["units"])
    assert alpha["units"][1]["contextValue"] == "unit.pending"
    assert (beta["contextValue"], beta["icon"]) == ("mission.waiting_input", "question")
    assert beta["description"].startswith("waiting for input")
    assert (gamma["contextValue"], gamma["icon"]) == ("mission.completed", "pass")
    assert gamma["description"] == "completed · 1/1 · 10 tokens · ⇄ b/b-model"  # its call failed over from a
    assert [(u["label"], u["contextValue"]) for u in gamma["units"]] == [("u1 Only", "unit.succeeded")]

    providers = {r["label"]: r for r in seen["providersTree"]}
    assert sorted(providers) == ["a/0", "b/0"] and len(b.posts) == 1
    assert providers["a/0"]["icon"] == "error" and "failover -> b/0 (auth)" in providers["a/0"]["description"]
    assert "last error (auth)" in providers["a/0"]["tooltip"]
    assert providers["b/0"]["contextValue"] == "providerEndpoint.active"
    assert providers["b/0"]["description"].startswith("● active · b-model · healthy")
    grown = {r["label"]: r for r in seen["providersAfterChange"]["rows"]}
    assert sorted(grown) == ["a/0", "b/0", "c/0"] and grown["c/0"]["icon"] == "circle-outline"  # never called
    assert "not used yet" in grown["c/0"]["description"]

    points = seen["restorePoints"][ids["gamma"]]
    assert points and all(p["contextValue"] == "restorePoint" for p in points)
    with Store.open(store) as opened:
        stored = opened.read(lambda t: m.restore_points(t, ids["gamma"]))
    assert [p["label"].split()[0] for p in points] == [p.id for p in reversed(stored)]

    subagents = seen["subagents"][ids["gamma"]]
    assert [(r["label"], r["contextValue"]) for r in subagents] == [("u1", "subagent-done")]
    assert subagents[0]["description"].startswith("done · ") and "-units" in subagents[0]["description"]
    assert [r["label"] for r in seen["subagents"][ids["alpha"]]] == ["u1"]  # running u1 under its lease

    assert seen["statusBar"] == {
        "text": "$(question) keel: beta needs input",
        "command": "keel.answer",
        "arguments": [ids["beta"]],
    }
    after = seen["afterPause"]
    assert after["contextValue"] == "mission.paused" and "paused" in after["notifications"]
    assert after["description"].startswith("paused (operator)")
    assert seen["verify"]["ok"] is True and seen["verify"]["records"] > 10
    assert seen["afterCrash"] == {"state": "running", "missions": 3}
    assert "No module named 'keel'" in seen["notInstalled"]["problem"]
    assert seen["notInstalled"]["statusBar"] == "$(error) keel: not running"
    assert {r["id"]: r["state"] for r in seen["missionsAfterRestart"]}[ids["alpha"]] == "paused"
    other = seen["otherStore"]
    assert other["command"][-3:] == ["--store", str(ws / "other" / "store"), "--verbose"]
    assert other["missions"] == 0
    assert "--store" not in seen["backToDefaultStore"]["command"] and seen["backToDefaultStore"]["missions"] == 3
    assert set(seen["pointActions"]) == {"keel.restore", "keel.diffPoint", "keel.restoreWithFiles", "keel.fork"}
    assert seen["diff"] == {
        "label": "g.txt (p1 ↔ sandbox)",
        "left": {"scheme": "keel-point", "path": f"/{ids['gamma']}/p1/g.txt", "text": ""},
        "right": {"scheme": "keel-point", "path": f"/{ids['gamma']}/sandbox/g.txt", "text": "gamma\n"},
    }
    fork = seen["fork"]
    assert fork["id"] != ids["gamma"] and fork["state"] == "paused" and fork["name"] == "gamma"
    assert fork["selected"] == fork["id"]
    assert seen["apply"]["added"] == ["g.txt"] and (ws / "g.txt").read_text() == "gamma\n"
    [channel] = server.home.glob("user-data/logs/*/exthost*/keel.keel/keel.log")
    log = channel.read_text()
    assert "[info] keel.server.lsp.app: keel serve: store" in log  # server stderr at its own level
    assert " INFO " not in log and "[info] connection starting -> running" in log
