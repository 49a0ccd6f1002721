"""Provider keys never reach the commands an agent runs: the `run` tool's environment is the agents'
filtered environment, without the variables the providers' `api_key_env` name (whatever they are called).

A real mission through `keel run`, with a workspace `.keel/config.toml` whose provider reads its key from
LLM_PASS (a name the secret-looking-name filter does not catch) and LLM_PASS set in keel's environment.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from engine_helpers import start_keel, write_mission
from modelkit import NO_KEYRING, provider, write_config

KEY = "sk-llm-pass-4Jw9QeT2xVb7Nc3R"  # made up; the provider is never called


def _environ_of_command(marker: str, timeout: float = 30) -> bytes:
    """/proc/<pid>/environ of the running command whose argv holds `marker` (read while it sleeps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    return (entry / "environ").read_bytes()
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no command with {marker} appeared")


def test_a_providers_api_key_env_never_reaches_a_command(tmp_path: Path) -> None:
    write_config(tmp_path / "ws", [provider("local", "http://127.0.0.1:9", api_key_env="LLM_PASS")])
    marker = f"env-probe-{uuid.uuid4().hex}"
    recorded = tmp_path / "command-environ.bin"
    cmd = f"cat /proc/self/environ > {recorded}; sleep 3; : {marker}"
    mission = write_mission(tmp_path, [{"id": "probe", "params": {"steps": [{"tool": "run", "args": {"cmd": cmd}}]}}])
    store = tmp_path / "store"
    proc = start_keel(
        "run", str(mission), store=store, env={"LLM_PASS": KEY, "MY_HARMLESS_VAR": "visible", **NO_KEYRING}
    )
    try:
        live = _environ_of_command(marker)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, out + err
    assert json.loads(out.splitlines()[-1])["state"] == "completed"
    written = recorded.read_bytes()
    for environ in (live, written):
        names = {item.split(b"=", 1)[0] for item in environ.split(b"\0") if item}
        assert b"LLM_PASS" not in names and KEY.encode() not in environ
        assert b"MY_HARMLESS_VAR=visible" in environ.split(b"\0")  # the filter, not an empty environment
