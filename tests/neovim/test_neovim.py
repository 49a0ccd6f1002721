"""Neovim as a real LSP client of keel serve: start a mission, receive keel/missionChanged, pause it.

Needs Debian's `neovim` (scripts/setup.sh --system installs it); the recipe is in shared testing.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keel.storage import Store
from keel.storage import missions as m
from tests.hosts import kill_hosts
from tests.lsp.conftest import mission_toml
from tests.neovim.nvims import NVIMS

NVIM = NVIMS["debian"]
CLIENT = Path(__file__).with_name("client.lua")


@pytest.mark.skipif(NVIM is None, reason="Debian's neovim is not installed (run scripts/setup.sh --system)")
def test_neovim_starts_watches_and_pauses_a_mission(tmp_path: Path) -> None:
    mission = tmp_path / "nvim.toml"
    mission.write_text(mission_toml("nvim", [{"id": "u", "steps": [{"sleep": 0.25}] * 40}]))
    store, out = tmp_path / ".keel" / "store", tmp_path / "seen.json"
    env = {
        **os.environ,
        "KEEL_NVIM_PYTHON": sys.executable,
        "KEEL_NVIM_STORE": str(store),
        "KEEL_NVIM_MISSION": str(mission),
        "KEEL_NVIM_OUT": str(out),
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    try:
        proc = subprocess.run(
            [NVIM, "--headless", "-u", "NONE", "-i", "NONE", "-c", f"luafile {CLIENT}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        seen = json.loads(out.read_text()) if out.exists() else {}
        assert proc.returncode == 0 and seen.get("ok"), (proc.returncode, seen, proc.stderr[-2000:])
        states = [c["state"] for c in seen["changes"] if c["id"] == seen["mission"]]
        assert "running" in states and states[-1] == "paused", states
        with Store.open(store) as s:
            assert s.read(lambda t: m.get_mission(t, seen["mission"])).state.value == "paused"
    finally:
        kill_hosts(store)
