"""keel serve and model providers: `keel/providers`, `keel/providersChanged` after a real failover, and an
offline mission that the editor sees offline (with the reason) and that resumes by itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faultserver import FaultServer, error, ok
from tests.lsp.conftest import Env, _plain

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


@pytest.fixture
def backend() -> str:
    """Protocol-level tests: the store's backend does not matter, so they run on LMDB alone."""
    return "lmdb"


MODEL_STEP = {"model": {"messages": [{"role": "user", "content": "say hello"}]}}


def write_config(root: Path, *servers: tuple[str, FaultServer]) -> Path:
    lines = [
        "[network]",
        "connect_timeout_s = 0.5",
        "base_delay_s = 0.01",
        "max_delay_s = 0.05",
        "max_attempts = 2",
        "probe_base_delay_s = 0.05",
        "probe_max_delay_s = 0.2",
    ]
    for name, server in servers:
        lines += [
            "",
            "[[providers]]",
            f'name = "{name}"',
            'kind = "openai-compatible"',
            f'model = "{name}-model"',
            f'api_key_env = "KEEL_LSP_TEST_{name.upper()}_PASS"',  # unset: no key, no keyring lookup
            f'endpoints = [{{ url = "{server.url}" }}]',
        ]
    path = root / ".keel" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def by_name(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{e['provider']}/{e['endpoint']}": e for e in payload["endpoints"]}


async def wait_until(changes: list[dict[str, Any]], pred: Any, within: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = next((c for c in changes if pred(c)), None)
        if found is not None:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"no matching keel/providersChanged in {within}s; got {changes[-1:]}")


async def test_providers_request_and_change_after_a_failover(env: Env) -> None:
    a, b = FaultServer().start(), FaultServer().start()
    try:
        a.push(error(401, "invalid_api_key", "Incorrect API key provided"))
        b.push(ok("hello from b"))
        config = write_config(env.root, ("a", a), ("b", b))
        changes: list[dict[str, Any]] = []
        env.client.feature("keel/providersChanged")(lambda params: changes.append(_plain(params)))

        first = await env.request("keel/providers")
        assert str(config) in first["sources"]
        rows = by_name(first)
        assert sorted(rows) == ["a/0", "b/0"]
        assert rows["a/0"]["state"] == "healthy" and rows["a/0"]["url"] == a.url and rows["a/0"]["configured"]
        assert rows["b/0"]["model"] == "b-model" and rows["b/0"]["keySource"] == "env KEEL_LSP_TEST_B_PASS"
        assert not any(r["active"] for r in rows.values())

        path = env.write_mission("greet", [{"id": "hello", "steps": [MODEL_STEP]}])
        mid = (await env.command("keel.startMission", path))["id"]
        await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
        changed = await wait_until(changes, lambda c: by_name(c)["b/0"]["active"])
        a_row = by_name(changed)["a/0"]
        assert a_row["state"] == "down" and a_row["lastErrorKind"] == "auth" and "401" in a_row["lastError"]
        assert a_row["lastFailover"] == "-> b/0 (auth)" and a_row["lastFailoverAt"] > 0
        assert by_name(await env.request("keel/providers")) == by_name(changed)
    finally:
        a.stop()
        b.stop()


async def test_offline_mission_shows_why_and_resumes_by_itself(env: Env) -> None:
    server = FaultServer().start()
    server.stop()  # the port is known; nothing listens until the network "comes back"
    try:
        write_config(env.root, ("local", server))
        path = env.write_mission("offline", [{"id": "hello", "steps": [MODEL_STEP]}])
        mid = (await env.command("keel.startMission", path))["id"]
        offline = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "offline")
        assert offline["pauseReason"] == "offline" and offline["error"].startswith("offline:")
        assert offline["host"]["alive"]  # the detached host stays, probing
        server.start()
        done = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed", within=30)
        assert done.get("error") is None and len(server.posts) == 1
        assert any(f"({mid}) paused: offline" in m.message for m in env.client.messages)
    finally:
        server.stop()
