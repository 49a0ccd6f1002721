"""keel serve end to end: pause, resume, pause all, questions (showMessageRequest and keel.answer),
failures, changes made by other processes, host supervision and stranded missions."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from tests.hosts import children, pidfds
from tests.lsp.conftest import OPTIONS, SERVER, Env, capabilities, edit_elsewhere, watch
from tests.lsp.conftest import until as _until

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

SLOW = [{"sleep": 0.25}] * 40  # ~10 s of work: long enough to pause, kill or watch


async def test_pause_then_resume_to_completion(env: Env) -> None:
    mid = (
        await env.command(
            "keel.startMission",
            env.write_mission(
                "slow",
                [
                    {"id": "a", "steps": [{"sleep": 0.2}] * 5},
                    {"id": "b", "after": ["a"], "steps": [{"sleep": 0.2}] * 5},
                ],
            ),
        )
    )["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "running")
    paused = await env.command("keel.pause", mid)
    assert paused["id"] == mid and paused["state"] in ("pausing", "paused")  # the host's acknowledgement
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "paused" and c["pauseReason"] == "operator")
    resumed = await env.command("keel.resume", mid[:7])
    assert resumed["id"] == mid and resumed["state"] == "running" and resumed["host"]["alive"]
    done = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    assert done["units"]["done"] == 2
    await asyncio.sleep(0.2)
    runs = sorted(t for t in env.client.progress_reports if str(t).startswith(f"keel/mission/{mid}/"))
    assert len(runs) == 2, runs  # one progress per run
    assert env.client.progress_reports[runs[0]][-1].message == "paused (operator)"


async def test_pause_all(env: Env) -> None:
    ids = [
        (await env.command("keel.startMission", env.write_mission(f"m{i}", [{"id": "u", "steps": SLOW}])))["id"]
        for i in range(2)
    ]
    for mid in ids:
        await env.wait_for(lambda c, mid=mid: c["id"] == mid and c["state"] == "running")
    result = await env.command("keel.pauseAll")
    assert sorted(result["paused"]) == sorted(ids)
    for mid in ids:
        await env.wait_for(lambda c, mid=mid: c["id"] == mid and c["state"] == "paused")


async def test_question_answered_through_show_message_request(env: Env) -> None:
    env.answer = lambda params: types.MessageActionItem(title="yes")
    mid = (
        await env.command(
            "keel.startMission",
            env.write_mission("asks", [{"id": "q", "steps": [{"ask": "Ship it?", "choices": ["yes", "no"]}]}]),
        )
    )["id"]
    waiting = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "waiting_input")
    assert waiting["question"]["text"] == "Ship it?" and waiting["question"]["choices"] == ["yes", "no"]
    await _until(lambda: len(env.questions) == 1)
    await _host_leaves(env, mid)
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    assert len(env.questions) == 1
    assert env.questions[0].message == "keel · asks asks: Ship it?"
    assert [a.title for a in env.questions[0].actions or []] == ["yes", "no"]
    detail = await env.request("keel/mission", {"id": mid})
    assert detail["units"][0]["state"] == "succeeded"


async def test_dismissed_question_then_keel_answer(env: Env) -> None:
    mid = (
        await env.command(
            "keel.startMission",
            env.write_mission("later", [{"id": "q", "steps": [{"ask": "Which?", "choices": ["left", "right"]}]}]),
        )
    )["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "waiting_input")
    await _until(lambda: len(env.questions) == 1)
    await _host_leaves(env, mid)
    try:
        await env.command("keel.answer", mid, "up")
        raise AssertionError("an answer outside the choices was taken")
    except Exception as exc:  # the JSON-RPC error names the choices
        assert "answer one of left, right" in str(exc), exc
    result = await env.command("keel.answer", mid, "right")
    assert result["id"] == mid and result["state"] in ("running", "completed")
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")


async def test_failure_is_shown(env: Env) -> None:
    mid = (
        await env.command("keel.startMission", env.write_mission("breaks", [{"id": "x", "steps": [{"fail": "boom"}]}]))
    )["id"]
    failed = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "failed")
    assert failed["units"]["failed"] == 1
    await _until(lambda: any(m.type == types.MessageType.Error for m in env.client.messages))
    shown = [m.message for m in env.client.messages if m.type == types.MessageType.Error]
    assert shown[0].startswith(f"keel: mission breaks ({mid}) failed:"), shown


async def test_changes_from_another_process_are_pushed(env: Env) -> None:
    mid = (await env.command("keel.startMission", env.write_mission("other", [{"id": "u", "steps": SLOW}])))["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "running")
    # the CLI in another terminal pauses it
    before = time.monotonic()
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "keel.server.cli", "pause", mid, "--store", str(env.store)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    await env.wait_for(lambda c: c["id"] == mid and c["state"] in ("pausing", "paused"), within=5)
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "paused")
    assert time.monotonic() - before < 10
    await edit_elsewhere(env.store, mid, "edited elsewhere")  # a process that writes the store directly
    # pushed without any request from the client; the delay itself is a figure of benchmarks/lsp.py
    await env.wait_for(lambda c: c["id"] == mid and c.get("error") == "edited elsewhere", within=60)


async def test_dead_host_is_restarted(env: Env) -> None:
    mid = (
        await env.command(
            "keel.startMission", env.write_mission("crash", [{"id": "a", "steps": [{"sleep": 0.2}] * 10}])
        )
    )["id"]
    running = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "running" and c.get("host"))
    pid = running["host"]["pid"]
    os.killpg(pid, signal.SIGKILL)
    restarted = await env.wait_for(
        lambda c: c["id"] == mid and c.get("host", {}).get("pid") not in (None, pid) and c["host"]["alive"]
    )
    assert restarted["state"] in ("running", "completed")
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    logs = [m.message for m in env.client.log_messages]
    assert any("host is gone while running; restarting it (attempt 1 of 3)" in line for line in logs), logs


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
async def patient(lsp_client: LanguageClient, tmp_path: Path):
    """A server whose grace period for a host found gone is ten minutes."""
    watch(lsp_client, tmp_path)
    options = {**OPTIONS, "graceMs": 600_000}
    params = types.InitializeParams(
        capabilities=capabilities(), root_uri=tmp_path.as_uri(), initialization_options=options
    )
    await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


async def test_a_host_whose_exit_was_seen_is_restarted_without_a_grace_period(
    patient: LanguageClient, tmp_path: Path
) -> None:
    """Its pidfd tells of the exit: the host is gone for good, and only a fresh picture of the mission is awaited;
    the restart is the host starter's fork (server/hoststarter.py), not a new interpreter of the server's."""
    env = watch(patient, tmp_path)
    try:
        mid = (await env.command("keel.startMission", env.write_mission("crash", [{"id": "a", "steps": SLOW}])))["id"]
        running = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "running" and c.get("host"))
        pid = running["host"]["pid"]
        server = patient._server.pid  # type: ignore[union-attr]
        await _until(lambda: pid in pidfds(server), within=30)  # struck once the server watches its exit
        # and its host starter has loaded the host (it then shows its own command line)
        await _until(lambda: bool(children(server, b"keel\0host-starter")), within=30)
        os.killpg(pid, signal.SIGKILL)
        restarted = await env.wait_for(
            lambda c: c["id"] == mid and c.get("host", {}).get("pid") not in (None, pid) and c["host"]["alive"],
            within=60,
        )
        new = restarted["host"]["pid"]
        parent = _parent_of(new)
        assert parent != server and _parent_of(parent) == server, (server, parent)
    finally:
        env.kill_hosts()


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_a_stopped_host_is_slow_not_dead_and_is_never_replaced(env: Env) -> None:
    """A host frozen by SIGSTOP (a laptop under load, a debugger) still holds its host lock: supervision
    waits for it however long it takes (here 10x its grace), and the mission finishes on that same host."""
    steps = [{"now": True}, {"sleep": 0.2}] * 8
    mid = (await env.command("keel.startMission", env.write_mission("frozen", [{"id": "a", "steps": steps}])))["id"]
    running = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "running" and c.get("host"))
    pid = running["host"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(10 * OPTIONS["graceMs"] / 1000)
        logs = [m.message for m in env.client.log_messages]
        assert not any("restarting it" in line for line in logs), logs
    finally:
        os.kill(pid, signal.SIGCONT)
    done = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed", within=60)
    assert not any(f"[{mid}] host is gone" in m.message for m in env.client.log_messages)
    assert done["id"] == mid


async def test_stranded_mission_is_flagged(env: Env) -> None:
    mid = (await env.command("keel.startMission", env.write_mission("stuck", [{"id": "u", "steps": SLOW}])))["id"]
    running = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "running" and c.get("host"))
    logs = env.store.parent / "logs"
    logs.rename(logs.with_name("logs.moved"))  # in one step: the live host may be creating a log there
    logs.write_text("not a folder")  # no host can start: its log cannot be created
    os.killpg(running["host"]["pid"], signal.SIGKILL)
    stranded = await env.wait_for(lambda c: c["id"] == mid and c["stranded"], within=60)
    assert stranded["state"] == "running" and stranded["host"]["alive"] is False

    def shown() -> list[str]:
        return [m.message for m in env.client.messages if m.type == types.MessageType.Error]

    await _until(lambda: any(f"mission {mid} is stranded" in line for line in shown()), within=60)


async def _host_leaves(env: Env, mid: str) -> None:
    """A host stops by itself once its mission waits for input (it checkpoints and exits 3)."""
    await env.wait_for(lambda c: c["id"] == mid and not (c.get("host") or {}).get("alive"), within=120)
