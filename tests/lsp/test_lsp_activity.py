"""keel/activity, keel/activityFile and keel/activityChanged through pytest-lsp, over real missions: the
scripted agent's tool calls and a model call to a fault server on 127.0.0.1, a failing unit, a question."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pygls.exceptions import JsonRpcException

from tests.activitykit import PRICE_IN, PRICE_OUT, write_activity_mission
from tests.faultserver import FaultServer, ok

from .conftest import Env, _plain

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


@pytest.fixture
def model() -> Iterator[FaultServer]:
    server = FaultServer(default=ok("hello from the model")).start()
    yield server
    server.stop()


def follow(env: Env) -> list[dict[str, Any]]:
    """Every keel/activityChanged payload the server sends, in order."""
    pushed: list[dict[str, Any]] = []

    @env.client.feature("keel/activityChanged")
    def changed(params: Any) -> None:
        pushed.append(_plain(params))

    return pushed


async def until(pushed: list[dict[str, Any]], pred: Any, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while not any(pred(item) for payload in pushed for item in payload["items"]):
        if time.monotonic() > deadline:
            raise AssertionError(f"no such keel/activityChanged item within {within}s: {pushed[-3:]}")
        await asyncio.sleep(0.05)


async def whole(env: Env, mid: str, limit: int, **filters: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = ""
    while True:
        page = await env.request("keel/activity", {"id": mid, "cursor": cursor, "limit": limit, **filters})
        assert len(page["items"]) <= limit
        items += page["items"]
        cursor = page["cursor"]
        if not page["more"]:
            return items


async def test_activity_pages_filters_files_and_live_notifications(env: Env, model: FaultServer) -> None:
    pushed = follow(env)
    mission = write_activity_mission(env.root, model.url)
    mid = (await env.command("keel.startMission", str(mission)))["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "failed", within=60)
    await until(pushed, lambda i: i["title"] == "mission running -> failed")

    everything = await whole(env, mid, 2000)
    assert await whole(env, mid, 3) == everything  # paging by cursor loses and repeats nothing
    latest: dict[str, dict[str, Any]] = {}
    for payload in pushed:
        assert payload["id"] == mid
        latest.update({item["id"]: item for item in payload["items"]})
    assert latest == {item["id"]: item for item in everything}  # the notifications told the same story

    tools = [(i["tool"], i["effect"]) for i in everything if i["kind"] == "tool"]
    assert tools == [
        ("write_file", "done"),
        ("apply_diff", "done"),
        ("read_file", "read-only"),
        ("run", "done"),
        ("run", "done"),
    ]
    [call] = await whole(env, mid, 50, kinds=["model"])
    assert (call["tokensIn"], call["tokensOut"], call["status"]) == (7, 3, "paid")
    assert call["cost"] == pytest.approx((7 * PRICE_IN + 3 * PRICE_OUT) / 1e6)
    failures = await whole(env, mid, 50, unit="bad", failuresOnly=True)
    assert failures and all(i["failed"] and i["unit"] == "bad" for i in failures)
    why = next(i for i in failures if i["kind"] == "unit")
    assert "exit code 3" in why["text"]

    write = next(i for i in everything if i.get("tool") == "write_file")
    created = await env.request("keel/activityFile", {"id": mid, "item": write["id"], "path": "a.py"})
    assert (created["before"], created["after"], created["existedBefore"]) == ("", "x = 1\n", False)
    assert created["complete"]
    patch = next(i for i in everything if i.get("tool") == "apply_diff")
    patched = await env.request("keel/activityFile", {"id": mid, "item": patch["id"], "path": "a.py"})
    assert (patched["before"], patched["after"]) == ("x = 1\n", "x = 1\ny = 2\n")


async def test_a_question_and_its_answer(env: Env) -> None:
    pushed = follow(env)
    path = env.write_mission("ask", [{"id": "u", "steps": [{"ask": "Which logger?", "choices": ["a", "b"]}]}])
    mid = (await env.command("keel.startMission", path))["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "waiting_input")
    await until(pushed, lambda i: i["kind"] == "question" and i["text"] == "Which logger?")
    await env.command("keel.answer", mid, "b")
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    await until(pushed, lambda i: i["kind"] == "answer")
    answers = await whole(env, mid, 100, kinds=["answer"])
    assert [(a["result"], a["text"]) for a in answers] == [("b", "Which logger?")]
    # the unit goes on with the answer (from the journal): no host was lost, so no restart (host lane)
    assert await whole(env, mid, 100, kinds=["restart"]) == []
    [went_on] = [u for u in await whole(env, mid, 100, kinds=["unit"]) if u.get("status") == "answered"]
    assert went_on["title"].startswith("unit u goes on with the person's answer (attempt 2): 1 recorded step(s)")
    assert went_on["kept"] == 1


async def test_bad_activity_requests_say_what_was_wrong(env: Env) -> None:
    path = env.write_mission("quick", [{"id": "u", "steps": [{"now": True}]}])
    mid = (await env.command("keel.startMission", path))["id"]
    cases = [
        ({"id": mid, "kinds": ["tools"]}, "unknown activity kind tools"),
        ({"id": mid, "cursor": "garbage"}, "activity cursor 'garbage' is not one keel gave out"),
        ({"id": mid, "limit": 0}, "activity limit must be a whole number from 1 to 2000"),
        ({"id": mid, "unit": "nope"}, f"mission {mid} has no unit 'nope'"),
        ({"id": "zzz"}, "no mission 'zzz'"),
    ]
    for params, message in cases:
        with pytest.raises(JsonRpcException) as caught:
            await env.request("keel/activity", params)
        assert message in str(caught.value), caught.value
    with pytest.raises(JsonRpcException) as caught:
        await env.request("keel/activityFile", {"id": mid, "item": "j/u/1", "path": "a.py"})
    assert "did not change 'a.py'" in str(caught.value) or "no activity item" in str(caught.value)


async def test_starter_files_are_keel_inits_and_never_overwritten(env: Env) -> None:
    from keel.server.templates import starter_text

    made = await env.request("keel/starter", {"what": "config"})
    config = env.root / ".keel" / "config.toml"
    assert made == {"path": str(config), "created": True} and config.read_text() == starter_text("config")
    (env.root / "mission.toml").write_text("# mine\n")
    kept = await env.request("keel/starter", {"what": "mission"})
    assert kept == {"path": str(env.root / "mission.toml"), "created": False}
    assert (env.root / "mission.toml").read_text() == "# mine\n"
    with pytest.raises(JsonRpcException) as caught:
        await env.request("keel/starter", {"what": "readme"})
    assert 'expects params {"what": "mission" or "config"}, got \'readme\'' in str(caught.value)
