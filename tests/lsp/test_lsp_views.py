"""What the editor's views are fed: live unit states, fork names and pause notes, model usage (tokens,
cost, served model, failovers), provider rows that say whether an endpoint was ever called and where its
key comes from, and the keel.cancel / keel.delete commands. Real `keel serve`, real hosts, real loopback
model servers."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from pygls.exceptions import JsonRpcException

from tests.faultserver import FaultServer, error, ok
from tests.lsp.conftest import Env
from tests.lsp.test_lsp_providers import MODEL_STEP, by_name

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

SLOW = [{"sleep": 0.25}] * 200  # ~50 s: long enough to watch, pause or cancel


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def test_running_unit_is_live_and_named(env: Env) -> None:
    """A unit a live host started since the newest checkpoint is `running` (as `keel status` says), and
    the mission names it; HEAD's marks alone still call it pending."""
    path = env.write_mission(
        "live", [{"id": "a", "steps": [{"sleep": 0.1}]}, {"id": "b", "title": "Second", "after": ["a"], "steps": SLOW}]
    )
    mid = (await env.command("keel.startMission", path))["id"]
    summary = await env.wait_for(lambda c: c["id"] == mid and c.get("currentUnit") == "b", within=30)
    assert summary["currentUnitTitle"] == "Second" and summary["units"]["running"] == 1
    detail = await env.request("keel/mission", {"id": mid})
    assert [(u["id"], u["state"]) for u in detail["units"]] == [("a", "succeeded"), ("b", "running")]


async def test_usage_failover_cost_and_provider_rows(env: Env) -> None:
    a, b = FaultServer().start(), FaultServer().start()
    try:
        a.push(error(401, "invalid_api_key", "Incorrect API key provided"))
        b.push(ok("hello from b"))
        config = env.root / ".keel" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            ("a", a.url, 'api_key_env = "KEEL_LSP_TEST_A_PASS"\n'),
            (
                "b",
                b.url,
                'api_key_env = "KEEL_LSP_TEST_B_PASS"\n'
                'cost = { input_per_mtok = 300.0, output_per_mtok = 1500.0, currency = "EUR" }\n',
            ),
            ("c", _dead_url(), ""),  # keyring provider without a key, never called
        ]
        config.write_text(
            "[network]\nconnect_timeout_s = 0.5\nbase_delay_s = 0.01\nmax_delay_s = 0.05\nmax_attempts = 2\n\n"
            + "".join(
                f'[[providers]]\nname = "{n}"\nkind = "openai-compatible"\nmodel = "{n}-model"\nstream = false\n'
                f'endpoints = [{{ url = "{url}" }}]\n{extra}\n'
                for n, url, extra in rows
            )
        )
        path = env.write_mission("greet", [{"id": "hello", "steps": [MODEL_STEP]}])
        mid = (await env.command("keel.startMission", path))["id"]
        done = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed" and "usage" in c)
        usage: dict[str, Any] = done["usage"]
        assert usage["calls"] == 1 and usage["servedModel"] == "b/b-model" and usage["failovers"] == 1
        prompt, completion = usage["promptTokens"], usage["completionTokens"]
        assert prompt > 0 and completion > 0
        assert usage["cost"] == pytest.approx((prompt * 300 + completion * 1500) / 1e6)
        assert usage["currency"] == "EUR"
        assert (await env.request("keel/mission", {"id": mid}))["mission"]["usage"]["currency"] == "EUR"
        endpoints = by_name(await env.request("keel/providers"))
        assert endpoints["a/0"]["called"] and endpoints["b/0"]["called"] and not endpoints["c/0"]["called"]
        assert endpoints["c/0"]["keySource"] == ""  # no key in any keyring: no "keyring" either
        assert endpoints["b/0"]["keySource"] == "env KEEL_LSP_TEST_B_PASS"
        point = next(
            p for p in await env.request("keel/restorePoints", {"id": mid}) if p["reason"].startswith("failover")
        )
        with pytest.raises(JsonRpcException, match="it marks a failover"):
            await env.request("keel/pointChanges", {"id": mid, "point": point["id"]})
    finally:
        a.stop()
        b.stop()


async def test_fork_and_restore_say_why_they_are_paused(env: Env) -> None:
    path = env.write_mission("docs", [{"id": "a", "steps": [{"now": True}]}, {"id": "b", "after": ["a"], "steps": []}])
    mid = (await env.command("keel.startMission", path))["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    fork = await env.command("keel.fork", mid, "p1")
    assert fork["forkedFrom"] == {"mission": mid, "point": "p1"}
    assert fork["state"] == "paused" and fork["pauseNote"] == "forked at p1" and fork["name"] == "docs"
    named = await env.command("keel.fork", mid, "p1", {"name": "docs-v2"})
    assert named["name"] == "docs-v2" and named["forkedFrom"] == {"mission": mid, "point": "p1"}
    restored = await env.command("keel.restore", mid, "p1", {"files": True})
    assert restored["state"] == "paused" and restored["pauseNote"] == "restored to p1"
    assert "forkedFrom" not in restored


async def test_cancel_and_delete(env: Env) -> None:
    running = (await env.command("keel.startMission", env.write_mission("long", [{"id": "u", "steps": SLOW}])))["id"]
    await env.wait_for(lambda c: c["id"] == running and c["state"] == "running")
    with pytest.raises(JsonRpcException, match="only a completed, failed or cancelled mission"):
        await env.command("keel.delete", running)
    await env.command("keel.cancel", running)
    await env.wait_for(lambda c: c["id"] == running and c["state"] == "cancelled", within=30)
    with pytest.raises(JsonRpcException, match="nothing to cancel"):
        await env.command("keel.cancel", running)

    paused = (await env.command("keel.startMission", env.write_mission("other", [{"id": "u", "steps": SLOW}])))["id"]
    await env.wait_for(lambda c: c["id"] == paused and c["state"] == "running")
    await env.command("keel.pause", paused)
    await env.wait_for(lambda c: c["id"] == paused and c["state"] == "paused")
    assert (await env.command("keel.cancel", paused))["state"] == "cancelled"  # no host: at once
    with pytest.raises(JsonRpcException, match="cancelled; it cannot be resumed"):
        await env.command("keel.resume", paused)

    assert await env.command("keel.delete", running) == {"deleted": running}
    assert [m["id"] for m in await env.request("keel/missions")] == [paused]
    with pytest.raises(JsonRpcException, match="no mission"):
        await env.request("keel/mission", {"id": running})
