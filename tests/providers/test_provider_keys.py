"""Keys in the OS keyring through `keel key set|delete`, the message when there is no keyring, and
`keel providers` reading health from the store. Real subprocesses; a real Secret Service under
dbus-run-session + gnome-keyring-daemon when the machine has them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from faultserver import FaultServer, error
from providerkit import KEY

from keel.protocol.errors import ErrorCode
from keel.server.providers import KeyringError, KeyringSecrets, ProviderRouter

KEEL = [sys.executable, "-m", "keel.server.cli"]
NULL_KEYRING = {"PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}


def keel(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str = "",
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KEEL, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def test_no_keyring_backend_gives_the_fix() -> None:
    done = keel("key", "set", "openai", "--stdin", env=NULL_KEYRING, stdin=KEY + "\n")
    assert done.returncode == 1
    assert "Secret Service" in done.stderr and "api_key_env" in done.stderr
    assert KEY not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_key_set_with_no_terminal_and_empty_stdin_says_how_to_give_the_key() -> None:
    done = subprocess.run(
        [*KEEL, "key", "set", "anthropic"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **NULL_KEYRING},
        start_new_session=True,  # no controlling terminal for getpass to open
    )
    assert done.returncode != 0 and "internal error" not in done.stderr, done.stderr
    assert "no key given for anthropic" in done.stderr and "--stdin" in done.stderr, done.stderr


def test_no_keyring_backend_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import keyring
    import keyring.backends.null

    monkeypatch.setattr(keyring.core, "_keyring_backend", keyring.backends.null.Keyring())
    with pytest.raises(KeyringError) as raised:
        KeyringSecrets().get("openai")
    assert raised.value.code is ErrorCode.KEYRING and "api_key_env" in raised.value.message


async def test_api_key_env_is_used_without_a_keyring(fault: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from providerkit import PARAMS, provider, settings

    from keel.protocol.spec import ModelPolicy
    from keel.server.providers import ProviderConfig

    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    monkeypatch.setenv("KEEL_TEST_KEY", KEY)
    base = provider("ci", fault.url)
    cfg = settings(
        ProviderConfig(**{**{f: getattr(base, f) for f in base.__struct_fields__}, "api_key_env": "KEEL_TEST_KEY"})
    )
    router = ProviderRouter(cfg, ModelPolicy(), secrets=KeyringSecrets())
    await router.complete(PARAMS)
    await router.aclose()
    assert fault.posts[0].headers["authorization"] == f"Bearer {KEY}"


def test_keel_providers_shows_what_the_host_recorded(tmp_path: Path, fault: FaultServer) -> None:
    """A host process records health in the store; `keel providers --json` in another process shows it."""
    fault.default = error(401)
    (tmp_path / ".keel").mkdir()
    (tmp_path / ".keel" / "config.toml").write_text(
        textwrap.dedent(f"""
        [network]
        base_delay_s = 0.01
        [[providers]]
        name = "broken"
        kind = "openai-compatible"
        model = "m1"
        endpoints = [{{url = "{fault.url}", name = "main"}}]
        """)
    )
    host = textwrap.dedent("""
        import asyncio, sys
        from pathlib import Path
        from keel.protocol.agent import ModelCompleteParams
        from keel.protocol.spec import ModelPolicy
        from keel.server.providers import ProviderRouter, PolicyPauseError, ProviderError, load_provider_config
        from keel.storage import Store

        async def main():
            with Store.open(Path(".keel/store")) as store:
                router = ProviderRouter(load_provider_config(Path(".")), ModelPolicy(), store=store)
                try:
                    await router.complete(ModelCompleteParams(messages=[{"role": "user", "content": "hi"}]))
                except ProviderError as exc:
                    print(type(exc).__name__)
                await router.aclose()
        asyncio.run(main())
        """)
    env = {**NULL_KEYRING, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "KEEL_STORE": ""}
    ran = subprocess.run(
        [sys.executable, "-c", host],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert ran.stdout.strip() == "ProviderError", ran.stderr
    shown = keel("providers", "--json", "--store", str(tmp_path / ".keel" / "store"), cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)["endpoints"]
    assert (row["provider"], row["endpoint"], row["model"], row["state"]) == ("broken", "main", "m1", "down")
    assert row["last_error_kind"] == "auth" and "HTTP 401" in row["last_error"]
    assert row["cooldown_until"] > 0 and row["configured"] is True and row["key"] == "keyring"
    text = keel("providers", "--store", str(tmp_path / ".keel" / "store"), cwd=tmp_path, env=env)
    assert "broken/main  down" in text.stdout and "last error (auth)" in text.stdout


_HAVE_KEYRING_DAEMON = bool(shutil.which("dbus-run-session") and shutil.which("gnome-keyring-daemon"))

SECRET_SERVICE_SCRIPT = """
set -e
echo -n keel-test-password | gnome-keyring-daemon --unlock --components=secrets >/dev/null
printf '%s\\n' "$KEY" | "$PY" -m keel.server.cli key set fault --stdin
"$PY" - <<'PYEOF'
import asyncio, os
from keel.protocol.agent import ModelCompleteParams
from keel.protocol.spec import ModelPolicy
from keel.server.providers import (EndpointConfig, KeyringSecrets, ProviderConfig, ProviderRouter,
                                   ProviderSettings)
secrets = KeyringSecrets()
assert secrets.get("fault") == os.environ["KEY"], "read back a different key"
async def main():
    cfg = ProviderSettings(providers=(ProviderConfig(name="fault", kind="openai-compatible", model="m",
                                                     endpoints=(EndpointConfig(url=os.environ["URL"]),)),))
    router = ProviderRouter(cfg, ModelPolicy(), secrets=secrets)
    result = await router.complete(ModelCompleteParams(messages=[{"role": "user", "content": "hi"}]))
    await router.aclose()
    print("served", result.provider)
asyncio.run(main())
PYEOF
"$PY" -m keel.server.cli key delete fault
"$PY" -c 'from keel.server.providers import KeyringSecrets; print("after delete", KeyringSecrets().get("fault"))'
"""


@pytest.mark.skipif(
    not _HAVE_KEYRING_DAEMON,
    reason="dbus-run-session / gnome-keyring-daemon not installed "
    "(scripts/setup.sh --system installs dbus and gnome-keyring)",
)
def test_real_secret_service_round_trip(fault: FaultServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_KEYRING_BACKEND", "DBUS_SESSION_BUS_ADDRESS")}
    env.update(
        {
            "HOME": str(home),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_RUNTIME_DIR": str(tmp_path),
            "XDG_CONFIG_HOME": str(home / "config"),
            "KEY": KEY,
            "URL": fault.url,
            "PY": sys.executable,
        }
    )
    done = subprocess.run(
        ["dbus-run-session", "--", "bash", "-c", SECRET_SERVICE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 and ("gnome-keyring-daemon" in done.stderr and "failed" in done.stderr.lower()):
        pytest.skip(f"the keyring daemon could not start here: {done.stderr.strip()[:300]}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "served fault" in done.stdout and "after delete None" in done.stdout
    assert fault.posts[0].headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in done.stdout + done.stderr
