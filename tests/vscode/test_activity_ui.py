"""The Activity view and the welcome content through real VS Code (code-server + Chromium, drive.mjs modes
"activity" and "welcome"): a real mission (scripted agent, a model call to a fault server on 127.0.0.1, a
failing unit) followed live, a diff opened from a recorded change, the failures filter, "Why Did It Fail?"
on the failed unit; in an empty workspace, the welcome buttons writing `keel init`'s files. Screenshots:
test-artifacts/vscode/activity-*.png and welcome-*.png.
"""

from __future__ import annotations

import json
from pathlib import Path

from keel.server.templates import starter_text
from tests.activitykit import write_activity_mission
from tests.faultserver import FaultServer, ok
from tests.hosts import kill_hosts

from .conftest import ARTIFACTS, workspace


def _clear(prefix: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob(f"{prefix}-*.png"):
        old.unlink()


def test_activity_view_follows_a_mission_live(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    ws = workspace(tmp_path / "ws")
    settings = ws / ".vscode" / "settings.json"  # the diff editor side by side, even in a narrow window
    settings.write_text(
        json.dumps(
            {
                **json.loads(settings.read_text()),
                "diffEditor.renderSideBySide": True,
                "diffEditor.useInlineViewWhenSpaceIsLimited": False,
            }
        )
    )
    model = FaultServer(default=ok("hello from the model")).start()
    first = [{"tool": "write_file", "args": {"path": "a.py", "content": "x = 0\n"}}, {"sleep": 6.0}]
    written = write_activity_mission(ws, model.url, edit_first=first)
    mission = written.rename(ws / "activity.mission.toml")
    server = code_server()
    server.install(vsix)
    server.start()
    _clear("activity")
    try:
        out = drive(
            {
                "mode": "activity",
                "url": f"{server.url}/?folder={ws}",
                "mission": "activity",
                "missionFile": mission.name,
                "shots": str(ARTIFACTS),
            },
            timeout=240,
        )
    finally:
        model.stop()
        kill_hosts(ws / ".keel" / "store")
    (ARTIFACTS / "activity.json").write_text(json.dumps(out, indent=2))
    assert out["ok"], f"{out.get('error')}\n" + "\n".join(out.get("console", [])[-40:]) + server.log_tail()
    seen = out["seen"]
    assert any("write_file a.py" in r for r in seen["live"]["steps"])
    assert any("model local/local-model: 7 in + 3 out tokens" in r for r in seen["finished"])
    assert any(r.startswith("a.py") and "modified" in r for r in seen["patchDetails"])
    assert "a.py" in seen["diffTab"]
    assert any("y = 2" in side for side in seen["diffText"]) and any("x = 1" in side for side in seen["diffText"])
    assert seen["failures"] and all("write_file" not in r for r in seen["failures"])
    assert "Why Did It Fail?" in seen["badActions"]
    assert any(r.startswith("why") and "exit code 3" in r for r in seen["why"])
    assert [Path(p).name for p in out["shots"]] == [
        "activity-1-live.png",
        "activity-2-diff.png",
        "activity-3-failures.png",
        "activity-4-why.png",
    ]
    assert all(Path(p).stat().st_size > 10_000 for p in out["shots"])


def test_welcome_content_creates_keel_inits_files(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    ws = workspace(tmp_path / "empty")
    server = code_server()
    server.install(vsix)
    server.start()
    _clear("welcome")
    try:
        out = drive({"mode": "welcome", "url": f"{server.url}/?folder={ws}", "shots": str(ARTIFACTS)}, timeout=180)
    finally:
        kill_hosts(ws / ".keel" / "store")
    (ARTIFACTS / "welcome.json").write_text(json.dumps(out, indent=2))
    assert out["ok"], f"{out.get('error')}\n" + "\n".join(out.get("console", [])[-40:]) + server.log_tail()
    seen = out["seen"]
    assert [b.strip() for b in seen["missionsButtons"]] == ["Start Mission…", "Create a Mission File"]
    assert [b.strip() for b in seen["providersButtons"]] == ["Open .keel/config.toml"]
    assert ".keel/config.toml" in seen["providersWelcome"] and "Ollama" in seen["providersWelcome"]
    assert "wrote mission.toml and .keel/config.toml" in seen["createdToast"], seen["createdToast"]
    assert (ws / "mission.toml").read_text() == starter_text("mission")
    assert (ws / ".keel" / "config.toml").read_text() == starter_text("config")
    assert any("local" in r for r in seen["providerRows"])
    assert [Path(p).name for p in out["shots"]] == [
        "welcome-1-empty.png",
        "welcome-2-mission-file.png",
        "welcome-3-config.png",
    ]
