"""keel serve supervises offline missions too: the probing host of an offline mission is SIGKILLed, the
server starts a new one, and when the provider (a real HTTP server on loopback) is back the mission
completes; a pause the person made while the host was alive but that it never acted on is applied
instead, and no host is started for that mission."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.faultserver import FaultServer, ok
from tests.lsp.conftest import Env
from tests.lsp.test_lsp_providers import MODEL_STEP, write_config

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


async def _offline_with_a_probing_host(env: Env, server: FaultServer, name: str) -> tuple[str, int]:
    write_config(env.root, ("local", server))
    mid = (await env.command("keel.startMission", env.write_mission(name, [{"id": "hello", "steps": [MODEL_STEP]}])))[
        "id"
    ]
    offline = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "offline" and c["host"]["alive"], within=30)
    return mid, int(offline["host"]["pid"])


def _store_writable(env: Env) -> bool:
    """A write transaction gets through (a host stopped while holding LMDB's write lock blocks it)."""
    code = (
        "import sys; from keel.storage import Store; s = Store.open(sys.argv[1], create=False); "
        "s.write(lambda t: None); s.close()"
    )
    try:
        subprocess.run([sys.executable, "-c", code, str(env.store)], timeout=2, check=True, capture_output=True)
    except subprocess.TimeoutExpired:
        return False
    return True


def _stop_outside_a_commit(env: Env, pid: int) -> None:
    for _ in range(50):
        os.killpg(pid, signal.SIGSTOP)
        if _store_writable(env):
            return
        os.killpg(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the host always held the write lock")


def _logs(env: Env) -> list[str]:
    return [m.message for m in env.client.log_messages]


async def test_an_offline_missions_dead_host_is_restarted_and_it_completes(env: Env) -> None:
    server = FaultServer().start()
    server.stop()  # the port is known; nothing listens until the network "comes back"
    try:
        mid, pid = await _offline_with_a_probing_host(env, server, "outage")
        os.killpg(pid, signal.SIGKILL)
        restarted = await env.wait_for(
            lambda c: c["id"] == mid and (c.get("host") or {}).get("pid") not in (None, pid) and c["host"]["alive"],
            within=30,
        )
        assert restarted["state"] in ("running", "offline")
        await env.wait_for(
            lambda c: c["id"] == mid and c["state"] == "offline" and c["host"]["alive"] and c["host"]["pid"] != pid,
            within=30,
        )  # the new host probes
        server.push(ok("hello again"))
        server.start()
        done = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed", within=30)
        assert done.get("error") is None and len(server.posts) == 1
        assert any(
            f"[{mid}] host is gone while offline; restarting it (attempt 1 of 3)" in line for line in _logs(env)
        ), _logs(env)
    finally:
        server.stop()


async def test_a_pause_made_before_the_offline_host_died_is_kept(env: Env) -> None:
    server = FaultServer().start()
    server.stop()
    try:
        mid, pid = await _offline_with_a_probing_host(env, server, "paused")
        _stop_outside_a_commit(env, pid)  # the host cannot act on the pause: it is recorded, still offline
        summary = await env.command("keel.pause", mid)
        assert summary["state"] == "offline", summary
        os.killpg(pid, signal.SIGKILL)
        paused = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "paused", within=30)
        assert paused["pauseReason"] == "operator" and not paused.get("host")
        server.push(ok("hello again"))
        server.start()  # the network is back: nothing may resume the mission now
        await asyncio.sleep(3.0)  # many supervision ticks, grace and backoff periods
        last = [c for c in env.changes if c["id"] == mid][-1]
        assert last["state"] == "paused" and not last.get("host") and server.posts == []
        assert not any(f"[{mid}] host is gone while offline; restarting" in line for line in _logs(env)), _logs(env)
        assert any(f"[{mid}] host is gone while offline, but the mission is paused" in line for line in _logs(env))
    finally:
        server.stop()
