"""Model requests in a provider's own wire format, passed through: keel's model proxy for outside agents.

An outside agent (Claude Code, Codex, Gemini CLI through keel.agents.acp) speaks its provider's API to
keel's proxy; the host hands the body here with the endpoint the router chose. The body goes out with the
configured model and the configured key (the agent never holds one) and the answer comes back whole:
JSON, or the complete event stream, read to its end marker before anything is returned, so a cut stream
is a retryable AttemptFailure and never a half answer. Which provider kinds serve which API:

    anthropic          kind "anthropic"           POST {url}/v1/messages
    openai-responses   kind "openai-compatible"   POST {url}/responses        (url ends in /v1)
    gemini             kind "gemini"              POST {url}/v1beta/models/<model>:<method>

Depends on httpx and the providers' wire/config/retry modules only.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec

from keel.protocol.agent import ForwardApi, ModelForwardParams, ModelForwardResult, Usage
from keel.server.providers.anthropic import API_VERSION, messages_url
from keel.server.providers.config import ProviderConfig
from keel.server.providers.errors import redact
from keel.server.providers.retry import AttemptFailure, FailureKind, classify_exception
from keel.server.providers.wire import describe, http_failure, stream_cut

KIND_OF_API: dict[ForwardApi, str] = {
    "anthropic": "anthropic",
    "openai-responses": "openai-compatible",
    "gemini": "gemini",
}
_END_MARKERS: dict[ForwardApi, tuple[str, ...]] = {
    "anthropic": ("message_stop",),
    "openai-responses": ("response.completed", "response.incomplete", "response.failed"),
    "gemini": ("finishReason",),
}


def target(provider: ProviderConfig, base_url: str, request: ModelForwardParams) -> tuple[str, dict[str, Any]]:
    """The URL and body to send: the agent's body with the configured model."""
    body = dict(request.body)
    base = base_url.rstrip("/")
    if request.api == "anthropic":
        body["model"] = provider.model
        return messages_url(base), body
    if request.api == "openai-responses":
        body["model"] = provider.model
        return base + ("/responses" if base.endswith("/v1") else "/v1/responses"), body
    method = request.path.rpartition(":")[2] or "generateContent"
    query = "?alt=sse" if method.startswith("stream") else ""
    return f"{base}/v1beta/models/{provider.model}:{method}{query}", body


def headers(api: ForwardApi, key: str | None) -> dict[str, str]:
    out = {"content-type": "application/json"}
    if api == "anthropic":
        out["anthropic-version"] = API_VERSION
        if key:
            out["x-api-key"] = key
    elif api == "gemini":
        if key:
            out["x-goog-api-key"] = key
    elif key:
        out["authorization"] = f"Bearer {key}"
    return out


async def forward(
    client: httpx.AsyncClient, provider: ProviderConfig, url: str, key: str | None, request: ModelForwardParams
) -> ModelForwardResult:
    address, body = target(provider, url, request)
    try:
        content = msgspec.json.encode(body)  # a conversation's whole history: a few times faster than json
        async with client.stream("POST", address, headers=headers(request.api, key), content=content) as response:
            raw = await response.aread()
            if response.status_code >= 400:
                raise http_failure(address, response, raw)
            content_type = response.headers.get("content-type", "application/json")
    except httpx.HTTPError as exc:
        raise AttemptFailure(classify_exception(exc), redact(f"{address}: {describe(exc)}")) from None
    text = raw.decode("utf-8", "replace")
    streamed = "text/event-stream" in content_type
    if streamed and not any(marker in text for marker in _END_MARKERS[request.api]):
        raise stream_cut(address, "its end marker")
    if not streamed:
        try:
            json.loads(text)
        except ValueError:
            raise AttemptFailure(
                FailureKind.SERVER_ERROR, redact(f"{address}: answer is not JSON: {text[:200]!r}")
            ) from None
    return ModelForwardResult(
        status=response.status_code,
        content_type=content_type,
        body=text,
        model=provider.model,
        provider=provider.name,
        usage=usage_of(request.api, text, streamed),
    )


def usage_of(api: ForwardApi, text: str, streamed: bool) -> Usage:
    """Token counts from an answer (the last count each event reports wins)."""
    documents = (
        [_load(line[5:]) for line in text.splitlines() if line.startswith("data:")] if streamed else [_load(text)]
    )
    prompt = completion = 0
    for doc in documents:
        if api == "anthropic":
            usage = (doc.get("message") or {}).get("usage") or doc.get("usage") or {}
            prompt = int(usage.get("input_tokens") or prompt)
            completion = int(usage.get("output_tokens") or completion)
        elif api == "openai-responses":
            usage = (doc.get("response") or {}).get("usage") or doc.get("usage") or {}
            prompt = int(usage.get("input_tokens") or prompt)
            completion = int(usage.get("output_tokens") or completion)
        else:
            usage = doc.get("usageMetadata") or {}
            prompt = int(usage.get("promptTokenCount") or prompt)
            completion = int(usage.get("candidatesTokenCount") or completion)
    return Usage(prompt_tokens=prompt, completion_tokens=completion)


def _load(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
