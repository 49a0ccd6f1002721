"""`keel init`: from an empty folder to a finished mission with the starter files, and never an overwrite."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.cli.test_log import keel
from tests.faultserver import FaultServer, ok
from tests.hosts import kill_hosts

OLLAMA = "http://127.0.0.1:11434/v1"


def test_init_then_run_completes_against_a_local_openai_compatible_server(tmp_path: Path) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    proc = keel(tmp_path, "init", str(ws))
    assert proc.returncode == 0, proc.stderr
    config, mission = ws / ".keel" / "config.toml", ws / "mission.toml"
    assert f"wrote {config}" in proc.stdout and f"wrote {mission}" in proc.stdout
    [local] = tomllib.loads(config.read_text())["providers"]
    assert local["endpoints"] == [{"url": OLLAMA}] and "api_key_env" not in local  # no key
    assert "keel.agents.coder" in mission.read_text() and mission.read_text().count("\n#") > 5  # commented
    server = FaultServer(default=ok("README.md is not needed; the project is empty.")).start()
    try:
        config.write_text(config.read_text().replace(OLLAMA, server.url))  # the test's local model server
        run = keel(tmp_path, "run", str(mission), timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "completed" in run.stdout
        [call] = server.posts
        assert call.path == "/v1/chat/completions" and call.body["model"] == "qwen2.5-coder:7b"
        assert "authorization" not in call.headers  # a local server needs no key
    finally:
        server.stop()
        kill_hosts(tmp_path / "store")


def test_init_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "mission.toml").write_text("# mine\n")
    proc = keel(tmp_path, "init", str(tmp_path))
    assert proc.returncode == 0 and (tmp_path / ".keel" / "config.toml").is_file()
    assert proc.stderr.strip() == (
        f"keel: {tmp_path / 'mission.toml'} already exists; keel leaves it as it is (remove it to start over)"
    )
    assert (tmp_path / "mission.toml").read_text() == "# mine\n"
    again = keel(tmp_path, "init", str(tmp_path))
    assert again.returncode == 2 and again.stdout == "" and len(again.stderr.strip().splitlines()) == 2
    missing = keel(tmp_path, "init", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.strip() == f"keel: {tmp_path / 'nowhere'} is not a folder"
