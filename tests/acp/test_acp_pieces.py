"""The ACP integration's own pieces, each through its real interface: mission files naming an ACP agent,
keel's model proxy (a real HTTP server on 127.0.0.1), the normalised fingerprint, usage from answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.agents.acp.proxy import Proxy
from keel.protocol import agent as ap
from keel.protocol.errors import MissionFileError
from keel.protocol.missionfile import parse_mission
from keel.protocol.modelwire import normalise
from keel.server.engine.journal import fingerprint, fingerprint_basis
from keel.server.providers.config import parse_provider_file
from keel.server.providers.passthrough import usage_of

HEAD = '[mission]\nname = "m"\n'
UNIT = '[[units]]\nid = "a"\n'


@pytest.mark.parametrize(
    ("agent", "command"),
    [
        ('{ acp = "claude" }', ("python", "-m", "keel.agents.acp", "claude")),
        ('{ acp = "codex" }', ("python", "-m", "keel.agents.acp", "codex")),
        ('{ acp = ["node", "my-agent.js"] }', ("python", "-m", "keel.agents.acp", "--", "node", "my-agent.js")),
    ],
)
def test_mission_file_names_an_acp_agent(agent: str, command: tuple[str, ...]) -> None:
    spec = parse_mission(HEAD + f"agent = {agent}\n" + UNIT, "m.toml")
    assert spec.agent == command


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        ('{ acp = "cursor" }', "m.toml:3: mission.agent.acp: unknown ACP agent 'cursor' (known: claude, gemini, codex"),
        ("{ acp = [] }", "m.toml:3: mission.agent.acp: expected a preset name or a non-empty list"),
        ('{ acp = ["node", 3] }', "m.toml:3: mission.agent.acp: expected a preset name or a non-empty list"),
        ('{ acpx = "claude" }', "m.toml:3: mission.agent: unknown key 'acpx'"),
        ("{ }", "m.toml:3: mission.agent: missing key 'acp'"),
    ],
)
def test_bad_acp_agent_is_named_with_its_line(agent: str, expected: str) -> None:
    with pytest.raises(MissionFileError) as info:
        parse_mission(HEAD + f"agent = {agent}\n" + UNIT, "m.toml")
    assert info.value.message.startswith(expected), info.value.message


def _readme_block_after(marker: str) -> str:
    lines = (Path(__file__).resolve().parents[2] / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```toml"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    return "\n".join(lines[fence + 1 : end]) + "\n"


def test_readme_claude_code_mission_and_provider_are_valid_as_printed() -> None:
    spec = parse_mission(_readme_block_after("`add-mul.mission.toml`:"), "add-mul.mission.toml")
    assert spec.agent == ("python", "-m", "keel.agents.acp", "claude")
    assert spec.permissions is not None and "run" in spec.permissions.tools
    providers, _ = parse_provider_file(_readme_block_after("`.keel/config.toml` names").encode(), "config.toml")
    assert [(p.name, p.kind) for p in providers] == [("anthropic", "anthropic")]


def test_normalised_fingerprint_ignores_only_the_volatile_fields() -> None:
    def fp(body: dict[str, Any]) -> str:
        params = {"api": "anthropic", "path": "", "body": body, "session": "s", "ordinal": 1}
        return fingerprint("model/forward", fingerprint_basis("model/forward", params))

    base = {
        "model": "m",
        "metadata": {"user_id": '{"session_id":"a"}'},
        "messages": [
            {"role": "user", "content": "Today's date is 2026-12-02. Fix it."},
            {"role": "user", "content": [{"type": "tool_result", "content": "Ran 2 tests in 0.003s\n\nOK"}]},
        ],
    }
    same = json.loads(json.dumps(base))
    same["metadata"]["user_id"] = '{"session_id":"b"}'
    same["messages"][0]["content"] = "Today's date is 2026-12-09. Fix it."
    same["messages"][1]["content"][0]["content"] = "Ran 2 tests in 0.250s\n\nOK"
    assert fp(same) == fp(base)
    other = json.loads(json.dumps(base))
    other["messages"][1]["content"][0]["content"] = "Ran 2 tests in 0.003s\n\nFAILED (failures=1)"
    assert fp(other) != fp(base)
    gemini = {"contents": [{"parts": [{"functionCall": {"id": "read_file_1796237027840_0", "name": "read_file"}}]}]}
    later = {"contents": [{"parts": [{"functionCall": {"id": "read_file_1796237999999_0", "name": "read_file"}}]}]}
    assert normalise(gemini) == normalise(later)
    assert normalise({"prompt_cache_key": "x", "input": []}) == normalise({"prompt_cache_key": "y", "input": []})


def test_usage_is_read_from_each_api_s_answer() -> None:
    anthropic = (
        "event: message_start\n"
        'data: {"type":"message_start","message":{"usage":{"input_tokens":120,"output_tokens":1}}}\n\n'
        'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":42}}\n\n'
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    assert usage_of("anthropic", anthropic, True) == ap.Usage(prompt_tokens=120, completion_tokens=42)
    responses = 'data: {"type":"response.completed","response":{"usage":{"input_tokens":7,"output_tokens":9}}}\n\n'
    assert usage_of("openai-responses", responses, True) == ap.Usage(prompt_tokens=7, completion_tokens=9)
    gemini = '{"candidates":[],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":6}}'
    assert usage_of("gemini", gemini, False) == ap.Usage(prompt_tokens=5, completion_tokens=6)


def test_proxy_routes_each_api_and_refuses_a_wrong_token() -> None:
    seen: list[tuple[str, str, dict[str, Any]]] = []

    async def serve(api: ap.ForwardApi, path: str, body: dict[str, Any]) -> ap.ModelForwardResult:
        seen.append((api, path, body))
        return ap.ModelForwardResult(status=200, content_type="text/event-stream", body=f"data: {api}\n\n")

    async def scenario() -> list[httpx.Response]:
        proxy = await Proxy("tok", serve).start()
        try:
            async with httpx.AsyncClient(base_url=proxy.url) as client:
                return [
                    await client.post("/v1/messages?beta=true", json={"a": 1}, headers={"x-api-key": "tok"}),
                    await client.post("/v1/responses", json={"b": 2}, headers={"authorization": "Bearer tok"}),
                    await client.post(
                        "/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
                        json={"c": 3},
                        headers={"x-goog-api-key": "tok"},
                    ),
                    await client.post("/v1/messages", json={}, headers={"x-api-key": "sk-real-key"}),
                    await client.post("/v1/chat/completions", json={}, headers={"x-api-key": "tok"}),
                    await client.post("/v1/messages", content=b"{not json", headers={"x-api-key": "tok"}),
                    await client.head("/"),
                ]
        finally:
            await proxy.close()

    answers = asyncio.run(scenario())
    assert [r.status_code for r in answers] == [200, 200, 200, 401, 404, 400, 200]
    assert answers[0].text == "data: anthropic\n\n" and answers[0].headers["content-type"] == "text/event-stream"
    assert seen == [
        ("anthropic", "", {"a": 1}),
        ("openai-responses", "", {"b": 2}),
        ("gemini", "models/gemini-x:streamGenerateContent", {"c": 3}),
    ]
    assert "wrong token" in answers[3].json()["error"]["message"]
    assert "not /v1/chat/completions" in answers[4].json()["error"]["message"]


def test_proxy_serves_mcp_under_the_unit_token_and_post_only() -> None:
    seen: list[dict[str, Any]] = []

    async def serve(api: ap.ForwardApi, path: str, body: dict[str, Any]) -> ap.ModelForwardResult:
        raise AssertionError("an MCP message is not a model request")

    async def mcp(message: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(message)
        return None if "id" not in message else {"jsonrpc": "2.0", "id": message["id"], "result": {"ok": 1}}

    async def scenario() -> list[httpx.Response]:
        proxy = await Proxy("tok", serve, mcp).start()
        bearer = {"authorization": "Bearer tok"}
        try:
            async with httpx.AsyncClient(base_url=proxy.url) as client:
                return [
                    await client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=bearer),
                    await client.post(
                        "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=bearer
                    ),
                    await client.get("/mcp", headers=bearer),
                    await client.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
                    await client.post("/mcp", json=[1], headers=bearer),
                ]
        finally:
            await proxy.close()

    answers = asyncio.run(scenario())
    assert [r.status_code for r in answers] == [200, 202, 405, 401, 400]
    assert answers[0].json() == {"jsonrpc": "2.0", "id": 1, "result": {"ok": 1}}
    assert [m.get("method") for m in seen] == ["tools/list", "notifications/initialized"]
