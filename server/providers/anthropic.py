"""Anthropic's Messages API: OpenAI-shaped chat in, OpenAI-shaped assistant message out.

POST {url}/v1/messages with `x-api-key` and `anthropic-version`. System messages become `system`,
tool results become `tool_result` blocks, assistant tool calls become `tool_use` blocks and back. With
`stream = true` the event stream (message_start … message_stop) is assembled here and returned whole;
a stream without message_stop is a cut. Depends on the providers' wire/config modules only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from keel.protocol.agent import ModelCompleteParams, ModelCompleteResult, Usage
from keel.server.providers.config import ProviderConfig
from keel.server.providers.retry import AttemptFailure, FailureKind, classify_response
from keel.server.providers.wire import SseEvent, load_event, post, stream_cut

API_VERSION = "2023-06-01"
_STOP = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def messages_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


def request_body(provider: ProviderConfig, params: ModelCompleteParams) -> dict[str, Any]:
    system = [str(m.get("content") or "") for m in params.messages if m.get("role") == "system"]
    body: dict[str, Any] = {
        "model": provider.model,
        "max_tokens": params.max_tokens or provider.max_output_tokens,
        "messages": convert_messages(params.messages),
    }
    if system:
        body["system"] = "\n\n".join(system)
    if params.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters or {"type": "object"}}
            for t in params.tools
        ]
    if params.temperature is not None:
        body["temperature"] = params.temperature
    if provider.stream:
        body["stream"] = True
    return body


def convert_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages → Anthropic turns (consecutive turns of one role are merged)."""
    turns: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if role == "tool":
            blocks = [
                {
                    "type": "tool_result",
                    "tool_use_id": str(m.get("tool_call_id", "")),
                    "content": str(m.get("content") or ""),
                }
            ]
            role = "user"
        else:
            blocks = _content_blocks(m.get("content"))
            for call in m.get("tool_calls") or []:
                function = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id", ""),
                        "name": function.get("name", ""),
                        "input": _arguments(function.get("arguments")),
                    }
                )
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": "assistant" if role == "assistant" else "user", "content": blocks})
    return turns


def _content_blocks(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "text":
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            if url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                blocks.append({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
    return blocks


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return {"_raw": raw}
    return raw or {}


async def complete(
    client: httpx.AsyncClient, provider: ProviderConfig, base_url: str, key: str | None, params: ModelCompleteParams
) -> ModelCompleteResult:
    url = messages_url(base_url)
    headers = {"anthropic-version": API_VERSION}
    if key:
        headers["x-api-key"] = key
    body = request_body(provider, params)
    if provider.stream:

        async def parse(events: AsyncIterator[SseEvent]) -> ModelCompleteResult:
            return await _assemble(url, provider, events)

        result: ModelCompleteResult = await post(client, url, headers, body, parse)
        return result
    data = await post(client, url, headers, body)
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise AttemptFailure(FailureKind.SERVER_ERROR, f"{url}: answer has no content list")
    usage = data.get("usage") or {}
    return _result(
        provider, data["content"], str(data.get("model") or provider.model), str(data.get("stop_reason") or ""), usage
    )


def _result(
    provider: ProviderConfig, blocks: list[dict[str, Any]], model: str, stop: str, usage: dict[str, Any]
) -> ModelCompleteResult:
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    calls = [
        {
            "id": b.get("id", ""),
            "type": "function",
            "function": {"name": b.get("name", ""), "arguments": json.dumps(b.get("input") or {})},
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return ModelCompleteResult(
        message=message,
        model=model,
        provider=provider.name,
        finish_reason=_STOP.get(stop, stop),
        usage=Usage(
            prompt_tokens=int(usage.get("input_tokens") or 0), completion_tokens=int(usage.get("output_tokens") or 0)
        ),
    )


async def _assemble(url: str, provider: ProviderConfig, events: AsyncIterator[SseEvent]) -> ModelCompleteResult:
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    model, stop, usage = provider.model, "", dict[str, Any]()
    async for name, data in events:
        event = load_event(url, data)
        kind = event.get("type", name)
        if kind == "message_start":
            message = event.get("message") or {}
            model = str(message.get("model") or model)
            usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            blocks[int(event.get("index", 0))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index, delta = int(event.get("index", 0)), event.get("delta") or {}
            if delta.get("type") == "text_delta":
                block = blocks.setdefault(index, {"type": "text", "text": ""})
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "input_json_delta":
                partial.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "message_delta":
            stop = str((event.get("delta") or {}).get("stop_reason") or stop)
            usage.update(event.get("usage") or {})
        elif kind == "error":
            failure = classify_response(529, event) or FailureKind.SERVER_ERROR
            raise AttemptFailure(failure, f"{url}: error in stream: {str(event.get('error'))[:300]}")
        elif kind == "message_stop":
            for index, parts in partial.items():
                blocks.setdefault(index, {"type": "tool_use"})["input"] = _arguments("".join(parts))
            return _result(provider, [blocks[i] for i in sorted(blocks)], model, stop, usage)
    raise stream_cut(url, "message_stop")
