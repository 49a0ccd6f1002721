"""The OpenAI-compatible chat completions API (OpenAI, OpenRouter, vLLM, Ollama, llama.cpp, LM Studio).

POST {url}/chat/completions with `Authorization: Bearer KEY` (no header when there is no key, as local
servers expect). With `stream = true` the answer arrives as SSE chunks ending in `data: [DONE]`; the
message is assembled here and returned whole. Depends on the providers' wire/config modules only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

from keel.protocol.agent import ModelCompleteParams, ModelCompleteResult, Usage
from keel.server.providers.config import ProviderConfig
from keel.server.providers.retry import AttemptFailure, FailureKind, classify_response
from keel.server.providers.wire import SseEvent, load_event, post, stream_cut


def request_body(provider: ProviderConfig, params: ModelCompleteParams) -> dict[str, Any]:
    body: dict[str, Any] = {"model": provider.model, "messages": params.messages}
    if params.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters or {"type": "object"},
                },
            }
            for t in params.tools
        ]
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    if params.temperature is not None:
        body["temperature"] = params.temperature
    if provider.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


async def complete(
    client: httpx.AsyncClient, provider: ProviderConfig, base_url: str, key: str | None, params: ModelCompleteParams
) -> ModelCompleteResult:
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = request_body(provider, params)
    if provider.stream:

        async def parse(events: AsyncIterator[SseEvent]) -> ModelCompleteResult:
            return await _assemble(url, provider, events)

        result: ModelCompleteResult = await post(client, url, headers, body, parse)
        return result
    data = await post(client, url, headers, body)
    return _from_json(url, provider, data)


def _from_json(url: str, provider: ProviderConfig, data: Any) -> ModelCompleteResult:
    try:
        choice = data["choices"][0]
        message = dict(choice["message"])
    except (KeyError, IndexError, TypeError):
        raise AttemptFailure(FailureKind.SERVER_ERROR, f"{url}: answer has no choices[0].message") from None
    usage = data.get("usage") or {}
    return ModelCompleteResult(
        message=message,
        model=str(data.get("model") or provider.model),
        provider=provider.name,
        finish_reason=str(choice.get("finish_reason") or ""),
        usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        ),
    )


async def _assemble(url: str, provider: ProviderConfig, events: AsyncIterator[SseEvent]) -> ModelCompleteResult:
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    model, finish, usage, done = provider.model, "", Usage(), False
    async for _, data in events:
        if data.strip() == "[DONE]":
            done = True
            break
        chunk = load_event(url, data)
        if "error" in chunk:
            kind = classify_response(500, chunk) or FailureKind.SERVER_ERROR
            raise AttemptFailure(kind, f"{url}: error in stream: {str(chunk['error'])[:300]}")
        model = str(chunk.get("model") or model)
        if chunk.get("usage"):
            u = chunk["usage"]
            usage = Usage(
                prompt_tokens=int(u.get("prompt_tokens") or 0), completion_tokens=int(u.get("completion_tokens") or 0)
            )
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                _merge_call(calls.setdefault(int(call.get("index", 0)), {}), call)
            finish = str(choice.get("finish_reason") or finish)
    if not done and not finish:
        raise stream_cut(url, "data: [DONE]")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content or not calls else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return ModelCompleteResult(message=message, model=model, provider=provider.name, finish_reason=finish, usage=usage)


def _merge_call(target: dict[str, Any], delta: dict[str, Any]) -> None:
    if delta.get("id"):
        target["id"] = delta["id"]
    target.setdefault("type", "function")
    function = target.setdefault("function", {"name": "", "arguments": ""})
    part = delta.get("function") or {}
    function["name"] += part.get("name") or ""
    function["arguments"] += part.get("arguments") or ""
