"""What of keel's environment the commands an agent runs get: an allowlist (PATH, HOME, LANG, LC_*, TERM,
TMPDIR, TZ), the names the mission file lists in `[permissions] env`, its `[env]` values and keel's own tag;
never the variables the providers' `api_key_env` name (whatever they are called, even when listed), the
store's settings, or anything else of keel's environment (DATABASE_URL, a proxy URL, KEEL_STORE).

A real mission through `keel run`, with a workspace `.keel/config.toml` whose provider reads its key from
LLM_PASS (a name the secret-looking-name filter does not catch) and LLM_PASS set in keel's environment.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from engine_helpers import start_keel, write_mission
from modelkit import NO_KEYRING, provider, write_config

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

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
    steps = [{"tool": "run", "args": {"cmd": cmd}}]
    permissions = {"env": ["MY_HARMLESS_VAR", "LLM_PASS"]}  # a provider's key is never passed, even when named
    mission = write_mission(tmp_path, [{"id": "probe", "params": {"steps": steps}}], permissions=permissions)
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


def test_a_command_gets_the_allowlist_what_the_mission_names_and_nothing_else(tmp_path: Path) -> None:
    recorded = tmp_path / "command-env.txt"
    steps = [{"tool": "run", "args": {"cmd": f"env > {recorded}"}}]
    mission = write_mission(
        tmp_path,
        [{"id": "probe", "params": {"steps": steps}}],
        permissions={"env": ["JAVA_HOME"]},
        env={"GREETING": "hi"},
    )
    store = tmp_path / "store"
    keel_env = {
        "JAVA_HOME": "/opt/jdk",  # named by the mission
        "DATABASE_URL": "postgresql://u:pw@db/x",
        "HTTPS_PROXY": "http://proxy.invalid:3128",
        "KEEL_STORE": str(store),
        "PGPASSWORD": "pw",
        "PGSERVICEFILE": "/etc/pg_service.conf",
        "SSL_CERT_FILE": "/etc/ssl/cert.pem",
        "PIP_INDEX_URL": "https://u:pw@pypi.invalid/simple",
        "LC_TIME": "C.UTF-8",
        "TERM": "xterm",
        "TMPDIR": "/tmp",
        **NO_KEYRING,
    }
    proc = start_keel("run", str(mission), store=store, env=keel_env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    seen = dict(line.split("=", 1) for line in recorded.read_text().splitlines() if "=" in line)
    assert seen["JAVA_HOME"] == "/opt/jdk" and seen["GREETING"] == "hi"
    assert seen["LC_TIME"] == "C.UTF-8" and seen["TERM"] == "xterm" and seen["TMPDIR"] == "/tmp"
    allowed = {"PATH", "HOME", "LANG", "TERM", "TMPDIR", "TZ", "JAVA_HOME", "GREETING", "KEEL_COMMAND_OF"}
    allowed |= {"PYTHONDONTWRITEBYTECODE", "PWD", "SHLVL", "_", "OLDPWD"}  # the shell's own and keel's defaults
    assert {n for n in seen if not n.startswith("LC_")} <= allowed, sorted(set(seen) - allowed)


def test_no_keel_process_lets_a_command_read_its_secrets_from_proc(tmp_path: Path) -> None:
    """A command may read the environment its keel parents were started with (/proc/<pid>/environ): the
    host's and the unit worker's show the secrets' names, never their values."""
    write_config(tmp_path / "ws", [provider("local", "http://127.0.0.1:9", api_key_env="LLM_PASS")])
    secrets = {
        # a provider's api_key_env: a name no filter would take for a secret's. Every value is this test's own:
        # the scan sees other tests' keel processes too, one of them perhaps still starting (not yet blanked)
        "LLM_PASS": "sk-llm-pass-" + uuid.uuid4().hex,
        "PGPASSWORD": "pg-" + uuid.uuid4().hex,
        "OPENAI_API_KEY": "sk-" + uuid.uuid4().hex,
        "DATABASE_URL": f"postgresql://u:{uuid.uuid4().hex}@db.invalid/x",
    }
    report = tmp_path / "environs.json"
    scan = tmp_path / "scan.py"
    scan.write_text(  # every readable process's exec-time environment, named by its command line
        "import json, pathlib, sys\n"
        "found = {}\n"
        "for p in pathlib.Path('/proc').iterdir():\n"
        "    try:\n"
        "        cmd = (p / 'cmdline').read_bytes().replace(b'\\0', b' ').decode(errors='replace')\n"
        "        found[cmd] = (p / 'environ').read_bytes().decode(errors='replace')\n"
        "    except OSError:\n"
        "        pass\n"
        "pathlib.Path(sys.argv[1]).write_text(json.dumps(found))\n"
    )
    steps = [{"tool": "run", "args": {"cmd": f"python3 {scan} {report}"}}]
    mission = write_mission(tmp_path, [{"id": "probe", "params": {"steps": steps}}])
    proc = start_keel("run", str(mission), store=tmp_path / "store", env={**secrets, **NO_KEYRING})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    environs = json.loads(report.read_text())
    keel_processes = {cmd: env for cmd, env in environs.items() if str(mission) in cmd or "units.subagent" in cmd}
    host = [cmd for cmd in keel_processes if "keel.server.cli run" in cmd]
    worker = [cmd for cmd in keel_processes if "units.subagent" in cmd and str(tmp_path) in cmd]
    assert host and worker, sorted(environs)  # the strike landed: both were read while the mission ran
    for cmd in host:  # the host's exec-time block holds the names, blanked
        assert "PGPASSWORD=" in keel_processes[cmd] or "LLM_PASS=" in keel_processes[cmd], cmd
    # a worker shows its blanked names too (a new interpreter), or only the worker starter's plain block (a fork)
    leaks = [(name, cmd) for cmd, env in environs.items() for name, value in secrets.items() if value in env]
    assert not leaks, leaks
